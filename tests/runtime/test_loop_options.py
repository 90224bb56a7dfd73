"""loop()'s options beyond the daily arguments are frozen values; a keyword that moved into one is refused by name."""

import inspect
import pickle

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.engine.loop import MOVED
from _tiny_workload import TinyNet, loader

VALUES = [
    pf.Saving(checkpoint_format="legacy", keep=pf.keep_last(3), weights_file=False, digests=True),
    pf.Resuming(strict_resume=True, resume_hyperparameters="new"),
    pf.Watching(console=False, progress=True, log_reduce="mean", keep_trace=None),
    pf.Parallel(ddp=True, check_agreement=False),
    pf.Training(on_nonfinite="skip", config={"seed": 1}, iters_per_epoch=5),
    pf.Preemption(signals=("SIGTERM", "SIGUSR1"), exit_code=0, save_on_interrupt=True, margin=60.0, check_every=10),
]


def _loop(tmp_path, **kwargs):
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        hooks=[pf.save_every(2)],
        max_epochs=1,
        save_dir=tmp_path,
        **kwargs,
    )


def test_loop_takes_the_daily_arguments_and_six_option_values():
    """The signature: the arguments written every day (max_time beside the budget), then the six option values."""
    names = [p.name for p in inspect.signature(pf.loop).parameters.values() if p.kind != p.VAR_KEYWORD]
    assert names == [
        "model",
        "optimizer",
        "train_data",
        "hooks",
        "max_epochs",
        "max_steps",
        "max_time",
        "save_dir",
        "step_fn",
        "scheduler",
        "resume",
        "loggers",
        "handlers",
        "saving",
        "resuming",
        "watching",
        "parallel",
        "training",
        "preemption",
    ]


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_keyword_is_refused_naming_the_value_it_moved_to_and_nothing_is_written(tmp_path, name):
    """loop(console=False) raises TypeError: pass watching=pimm_fn.Watching(console=...); save_dir stays empty."""
    keyword, value = MOVED[name]
    with pytest.raises(
        TypeError, match=rf"^loop\(\) no longer takes {name}=: pass {keyword}=pimm_fn\.{value}\({name}="
    ):
        _loop(tmp_path, **{name: getattr(getattr(pf, value)(), name)})
    assert not any(tmp_path.iterdir())


def test_keep_snapshots_is_gone_and_its_error_names_keep_last(tmp_path):
    """keep_snapshots=3 is the same policy as Saving(keep=keep_last(3)): the TypeError says so."""
    with pytest.raises(
        TypeError, match=r"no longer takes keep_snapshots=: pass saving=pimm_fn\.Saving\(keep=pimm_fn\.keep_last\(n\)\)"
    ):
        _loop(tmp_path, keep_snapshots=3)
    assert not any(tmp_path.iterdir())


def test_an_unknown_keyword_is_refused_as_python_would(tmp_path):
    """A keyword loop() never took reads as Python's own error."""
    with pytest.raises(TypeError, match=r"^loop\(\) got an unexpected keyword argument 'max_epoch'$"):
        _loop(tmp_path, max_epoch=3)


@pytest.mark.parametrize("keyword", ["saving", "resuming", "watching", "parallel", "training", "preemption"])
def test_an_option_that_is_not_its_value_is_refused_with_the_fix(tmp_path, keyword):
    """saving={'checkpoint_format': 'legacy'} (a dict, not a Saving) fails at once, naming the value to build."""
    with pytest.raises(
        TypeError,
        match=rf"loop: '{keyword}' must be a pimm_fn\.{keyword.capitalize()} .*"
        rf"pass {keyword}=pimm_fn\.{keyword.capitalize()}\(\.\.\.\)",
    ):
        _loop(tmp_path, **{keyword: {}})
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_each_value_reads_as_its_factory_call_compares_and_pickles(value):
    """repr evaluates back to an equal value; equal values hash alike; pickling keeps it."""
    namespace = {**vars(pf), "keep_last": pf.keep_last}
    assert eval(repr(value), namespace) == value  # noqa: S307 - our own repr
    assert pickle.loads(pickle.dumps(value)) == value
    assert type(value)() == type(value)()


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: pf.Saving(checkpoint_format="zip"),
            ValueError,
            "loop: 'checkpoint_format' must be one of ['standard', 'legacy'] (got 'zip')",
        ),
        (
            lambda: pf.Saving(keep=3),
            TypeError,
            "loop: 'keep' must be None or callable (got 3); pass a retention policy",
        ),
        (lambda: pf.Saving(digests="yes"), TypeError, "loop: 'digests' must be a bool (got 'yes'); pass True or False"),
        (lambda: pf.Resuming(strict_resume=1), TypeError, "loop: 'strict_resume' must be a bool (got 1)"),
        (
            lambda: pf.Resuming(resume_hyperparameters="user"),
            ValueError,
            "loop: 'resume_hyperparameters' must be 'checkpoint'",
        ),
        (lambda: pf.Watching(console="no"), TypeError, "loop: 'console' must be a bool (got 'no'); pass True or False"),
        (lambda: pf.Watching(progress="yes"), TypeError, "loop: 'progress' must be None or a bool (got 'yes')"),
        (
            lambda: pf.Watching(log_reduce="sum"),
            ValueError,
            "loop: 'log_reduce' must be None (rank 0's outputs) or 'mean'",
        ),
        (lambda: pf.Watching(keep_trace=-1), ValueError, "loop: 'keep_trace' must be None or an int >= 0 (got -1)"),
        (lambda: pf.Parallel(ddp="true"), TypeError, "loop: 'ddp' must be a bool (got 'true'); pass True or False"),
        (lambda: pf.Parallel(check_agreement="yes"), TypeError, "loop: 'check_agreement' must be None or a bool"),
        (
            lambda: pf.Training(on_nonfinite="ignore"),
            ValueError,
            "loop: 'on_nonfinite' must be 'raise', 'skip' or 'warn'",
        ),
        (lambda: pf.Training(scaler="fp16"), TypeError, "loop: 'scaler' must be None or a GradScaler"),
        (lambda: pf.Training(extra_state=3), TypeError, "loop: 'extra_state' must be None or a dict of {name: object"),
        (lambda: pf.Training(config="a=1"), TypeError, "loop: 'config' must be None or a mapping of settings"),
        (
            lambda: pf.Training(iters_per_epoch=0),
            ValueError,
            "loop: 'iters_per_epoch' must be None or an int >= 1 (got 0); leave it None for len(train_data)",
        ),
    ],
)
def test_each_value_refuses_a_bad_field_when_made_with_the_message_loop_gave(make, error, message):
    """A bad field fails at construction, in the words loop() used when it took the keyword itself."""
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_values_are_frozen():
    """An option value cannot be changed in place; attrs.evolve makes a new, re-checked one."""
    import attrs

    watching = pf.Watching()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        watching.console = False
    with pytest.raises(TypeError, match="'console' must be a bool"):
        attrs.evolve(watching, console="no")


def test_the_options_reach_the_run(tmp_path):
    """Each value's fields land where loop() used to put the keyword: the context, the trace, the interpreter."""
    run = _loop(
        tmp_path,
        saving=pf.Saving(checkpoint_format="legacy", keep=pf.keep_last(1), digests=True),
        watching=pf.Watching(console=False, progress=False, keep_trace=2),
    )
    assert (run.ctx.checkpoint_format, run.ctx.keep, run.ctx.digests, run.ctx.console) == (
        "legacy",
        pf.keep_last(1),
        True,
        False,
    )
    run()
    assert len(run.trace) == 2
    assert (tmp_path / "model" / "last.pth").is_file()
