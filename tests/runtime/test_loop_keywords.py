"""loop()'s surface stays small: one ``optimizer`` (alone or a dict of named ones), ``iters_per_epoch`` in ``Training``.

``optimizers=`` became ``optimizer={name: opt}`` and ``iters_per_epoch=``
became ``training=Training(iters_per_epoch=)``: each old keyword is refused
naming its new place and writes nothing, the count of loop()'s parameters
is pinned, and a two-optimizer run given as a dict trains, saves and
resumes bit-identically.
"""

import inspect

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.engine.loop import GONE, MOVED
from _more_state_workload import build, snapshot
from _tiny_workload import TinyNet, loader, same

OPTION_VALUES = (pf.Saving, pf.Resuming, pf.Watching, pf.Parallel, pf.Training, pf.Preemption)


def _no_step(model, optimizer, batch, *, scheduler=None, scaler=None):
    return {}


def test_loop_takes_thirteen_daily_arguments_and_six_option_values():
    """21 named parameters before optimizers= and iters_per_epoch= went; 19 now: a new one is a decision, not drift."""
    parameters = [p for p in inspect.signature(pf.loop).parameters.values() if p.kind != p.VAR_KEYWORD]
    options = [p.name for p in parameters if isinstance(p.default, OPTION_VALUES)]
    assert (len(parameters), len(options)) == (19, 6), [p.name for p in parameters]


def test_optimizers_keyword_is_refused_naming_the_dict_form_and_nothing_is_written(tmp_path):
    """loop(optimizers={...}) raises TypeError: pass optimizer={name: optimizer, ...}; save_dir stays empty."""
    model = TinyNet()
    with pytest.raises(
        TypeError,
        match=r"^loop\(\) no longer takes optimizers=: pass optimizer=\{name: optimizer, "
        r"\.\.\.\}, which a custom step_fn receives as its 'optimizer'$",
    ):
        pf.loop(
            model,
            train_data=loader(),
            optimizers={"a": torch.optim.SGD(model.parameters(), lr=0.1)},
            step_fn=_no_step,
            hooks=[pf.save_every(2)],
            max_epochs=1,
            save_dir=tmp_path,
        )
    assert not any(tmp_path.iterdir())
    assert set(GONE) == {"keep_snapshots", "optimizers"} and not set(GONE) & set(MOVED)


def test_iters_per_epoch_keyword_is_refused_naming_training_and_nothing_is_written(tmp_path):
    """loop(iters_per_epoch=5) raises TypeError: pass training=pimm_fn.Training(iters_per_epoch=...)."""
    model = TinyNet()
    with pytest.raises(
        TypeError,
        match=r"^loop\(\) no longer takes iters_per_epoch=: "
        r"pass training=pimm_fn\.Training\(iters_per_epoch=\.\.\.\)$",
    ):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            iters_per_epoch=5,
            hooks=[pf.save_every(2)],
            max_epochs=1,
            save_dir=tmp_path,
        )
    assert not any(tmp_path.iterdir())


def test_training_refuses_a_bad_iters_per_epoch_when_made_and_reads_as_its_factory():
    """Training(iters_per_epoch=0) fails at construction in loop()'s old words; a good one shows in the repr."""
    with pytest.raises(
        ValueError,
        match=r"^loop: 'iters_per_epoch' must be None or an int >= 1 \(got 0\); "
        r"leave it None for len\(train_data\)$",
    ):
        pf.Training(iters_per_epoch=0)
    with pytest.raises(ValueError, match=r"'iters_per_epoch' must be None or an int >= 1 \(got '5'\)"):
        pf.Training(iters_per_epoch="5")
    assert repr(pf.Training(iters_per_epoch=3)) == (
        "Training(on_nonfinite='raise', scaler=None, extra_state=None, config=None, iters_per_epoch=3, "
        "exact_retry=True)"
    )


def test_training_iters_per_epoch_sets_the_length_of_an_epoch():
    """Training(iters_per_epoch=3) over a 5-batch loader: epochs of 3 steps, 2 epochs end at step 6."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        max_epochs=2,
        training=pf.Training(iters_per_epoch=3),
        watching=pf.Watching(console=False),
    )
    assert run.state.progress.iters_per_epoch == 3
    final = run()
    assert final.progress.global_step == 6 and run.finished


def test_a_dict_of_optimizers_with_the_built_in_step_is_refused_with_the_fix():
    """optimizer={...} with step_fn=None: the default step steps one optimizer, and the error says what to pass."""
    model = TinyNet()
    with pytest.raises(
        ValueError,
        match=r"built-in train step steps one optimizer, but optimizer= names \['a', 'b'\]: "
        r"pass step_fn=your_step",
    ):
        pf.loop(
            model,
            {
                "a": torch.optim.SGD(model.hidden.parameters(), lr=0.1),
                "b": torch.optim.SGD(model.out.parameters(), lr=0.1),
            },
            loader(),
            max_epochs=1,
        )


def test_a_two_optimizer_run_given_as_a_dict_resumes_bit_identically(tmp_path):
    """optimizer={'g', 'd'} with a GAN step: stopped at a save, resumed and finished equals a run straight through."""
    model, straight = build(tmp_path / "straight")
    straight()
    expected = snapshot(model, straight)
    _, first = build(tmp_path / "resumed")
    first.run(steps=6)
    first.ctx.wait_for_save()
    model2, resumed = build(tmp_path / "resumed", resume="auto")
    assert resumed.state.progress.global_step == 6
    resumed()
    again = snapshot(model2, resumed)
    for part in ("weights", "optimizers", "ema", "stats"):
        assert same(again[part], expected[part]), part
    assert sorted(resumed.ctx.optimizers) == ["d", "g"]
    assert again["trace"] == expected["trace"][-len(again["trace"]) :]
