"""loop() refuses every bad argument at once, naming it, and no refusal changes a byte under save_dir.

One real checkpoint directory is made once (a tiny run that saves, evaluates
and writes ``model_best``); its files are hashed. Hypothesis then calls
``loop`` with one bad argument at a time, resuming from that directory
(``"auto"`` or the checkpoint's path): each call raises an ``Exception``
naming the argument, and the hashes never change.
"""

import hashlib
import pathlib
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.runtime.engine.loop import MOVED
from _tiny_workload import TinyNet, build, loader, standard_hooks


def _digest(root: pathlib.Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A finished tiny run's save_dir (checkpoints, model_best, log), and the digest of every file in it."""
    root = tmp_path_factory.mktemp("saved")
    _, run = build(root, max_epochs=1)
    run()
    assert (root / "model" / "model_best.pth").is_file()
    return root, _digest(root)


@pytest.fixture(scope="module")
def parts():
    """One model, optimizer and loader, shared: a refused loop() touches none of them."""
    torch.manual_seed(0)
    model = TinyNet()
    return model, torch.optim.Adam(model.parameters(), lr=0.01), loader()


def _bad_values(model, optimizer, a_file):
    """Per argument, values that are wrong for it (type or range)."""
    flags = ["no", "true", 1, 0, None]
    return {
        "model": [None, 3, "model", optimizer],
        "optimizer": [3, "sgd", model, list(model.parameters()), {}, {"g": 3}],
        "train_data": [None, 3, 2.5],
        "hooks": [pf.save_every(2), {pf.log_every(1)}, [pf.save_every], [3], "hooks"],
        "step_fn": [3, "train_step", [print]],
        "handlers": [[print], {"SaveCheckpoint": print}, {SaveCheckpoint: 3}, "x", {int: print}],
        "resume": [True, False, 1, ["auto"], b"last", ""],
        "console": flags,
        "ddp": flags,
        "strict_resume": flags,
        "weights_file": flags,
        "check_agreement": ["yes", 1, 0.0],
        "save_dir": [a_file, 3, True, ""],
        "keep_snapshots": [-1, "3", 1.5, True],
        "iters_per_epoch": [0, -1, 2.5, "5", True],
        "checkpoint_format": ["zip", None, 1],
        "max_epochs": [-1, 1.5, "3", True],
        "max_steps": [0, -1, "3", 2.5],
        "on_nonfinite": ["ignore", None, 1],
        "resume_hyperparameters": ["user", None],
        "scheduler": [3, optimizer, "step"],
        "scaler": [3, "fp16"],
        "config": [[1], "a=1", 3],
        "extra_state": [3, {"": model}, {"x": 3}],
        "optimizers": [{"g": optimizer}],
        "keep": ["last", 3],
        "keep_trace": [-1, 2.5, "all"],
        "progress": ["yes", 1],
        "loggers": [3, "csv"],
        "log_reduce": ["sum", 1],
    }


ARGUMENTS = sorted(_bad_values(torch.nn.Linear(1, 1), None, None))


def _loop(parts, where, resume_from, **bad):
    """``loop`` on ``parts`` with the standard hooks into ``where``, resuming ``resume_from``; ``bad`` overrides."""
    model, optimizer, data = parts
    kwargs = dict(
        hooks=standard_hooks(), max_epochs=1, save_dir=where, resume=resume_from, watching=pf.Watching(console=False)
    )
    for name in [name for name in bad if name in MOVED]:  # an option's field is given in its value, made here
        keyword, value = MOVED[name]
        kwargs[keyword] = getattr(pf, value)(**{name: bad.pop(name)})
    kwargs.update(bad)
    if "max_steps" in bad:
        kwargs["max_epochs"] = None
    positional = [kwargs.pop("model", model), kwargs.pop("optimizer", optimizer), kwargs.pop("train_data", data)]
    return pf.loop(*positional, **kwargs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_bad_argument_is_refused_by_name_and_no_checkpoint_byte_changes(saved, parts, tmp_path, data):
    """Any one bad argument (resume='auto' or the checkpoint's path) raises naming it; every file keeps its bytes."""
    root, digest = saved
    a_file = tmp_path / "not_a_dir.txt"
    a_file.write_text("x")
    argument = data.draw(st.sampled_from(ARGUMENTS), label="argument")
    value = data.draw(st.sampled_from(_bad_values(parts[0], parts[1], a_file)[argument]), label="value")
    resume = data.draw(st.sampled_from(["auto", str(root / "model" / "last")]), label="resume")
    if argument == "resume":
        resume = value
    bad = {} if argument == "resume" else {argument: value}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception) as raised:
            _loop(parts, root, resume, **bad)
    assert argument in str(raised.value), f"{argument}={value!r}: {raised.value}"
    assert _digest(root) == digest


def test_each_listed_bad_value_is_refused_by_name(saved, parts, tmp_path):
    """Not left to chance: every (argument, bad value) above, resuming by path, raises naming the argument."""
    root, digest = saved
    a_file = tmp_path / "not_a_dir.txt"
    a_file.write_text("x")
    last = str(root / "model" / "last")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for argument, values in _bad_values(parts[0], parts[1], a_file).items():
            for value in values:
                resume, bad = (value, {}) if argument == "resume" else (last, {argument: value})
                with pytest.raises(Exception) as raised:
                    _loop(parts, root, resume, **bad)
                assert argument in str(raised.value), f"{argument}={value!r}: {raised.value}"
    assert _digest(root) == digest


@pytest.mark.parametrize(
    "argument, value, error, message",
    [
        (
            "step_fn",
            3,
            TypeError,
            "loop: 'step_fn' must be None or callable (got 3); pass step_fn(model, optimizer, batch",
        ),
        (
            "handlers",
            {"SaveCheckpoint": print},
            TypeError,
            "loop: 'handlers' has the key 'SaveCheckpoint', which is not a subclass of Effect",
        ),
        ("handlers", {SaveCheckpoint: 3}, TypeError, "loop: 'handlers' entry SaveCheckpoint must be callable (got 3)"),
        ("optimizer", "sgd", TypeError, "loop: 'optimizer' must be a torch.optim.Optimizer"),
        ("resume", 1, TypeError, "loop: 'resume' must be None (a fresh run), 'auto'"),
        ("console", "no", TypeError, "loop: 'console' must be a bool (got 'no'); pass True or False"),
        ("ddp", "true", TypeError, "loop: 'ddp' must be a bool (got 'true'); pass True or False"),
        ("keep_snapshots", -1, TypeError, "loop() no longer takes keep_snapshots=: pass saving=pimm_fn.Saving(keep="),
        (
            "iters_per_epoch",
            0,
            ValueError,
            "loop: 'iters_per_epoch' must be None or an int >= 1 (got 0); leave it None",
        ),
        ("scheduler", "optimizer", TypeError, "that is an optimizer: build a scheduler on it"),
    ],
)
def test_the_cases_the_issue_found_are_said_with_the_fix(parts, argument, value, error, message):
    """Each input the fault survey found accepted or failing late is refused at construction with the fix."""
    if value == "optimizer":
        value = parts[1]
    resume, bad = (value, {}) if argument == "resume" else (None, {argument: value})
    with pytest.raises(error) as raised:
        _loop(parts, None, resume, hooks=[], **bad)
    assert message in str(raised.value)


def test_a_save_dir_that_is_a_file_is_refused_by_its_path(parts, tmp_path):
    """save_dir naming a file fails at once, saying it is a file, not at the first save."""
    path = tmp_path / "run.txt"
    path.write_text("notes")
    with pytest.raises(NotADirectoryError, match=f"loop: save_dir '{path}' is a file, not a directory"):
        _loop(parts, path, None, hooks=[pf.save_every(2)])
    assert path.read_text() == "notes"


def test_a_fresh_run_into_a_save_dir_holding_only_model_best_is_refused(parts, saved, tmp_path):
    """model_best kept after the checkpoints were deleted is not replaced by a fresh run: refused, naming the files."""
    root, _ = saved
    kept = tmp_path / "run"
    (kept / "model").mkdir(parents=True)
    for name in ("model_best.pth", "model_best.json"):
        (kept / "model" / name).write_bytes((root / "model" / name).read_bytes())
    before = _digest(kept)
    with pytest.raises(
        FileExistsError, match=r"already holds best weights \(model_best.json, model_best.pth in model/\)"
    ):
        _loop(parts, kept, None)
    assert _digest(kept) == before
    with pytest.warns(pf.ConfigurationWarning, match="resume='auto' found no checkpoint .* first best replaces them"):
        _loop(parts, kept, "auto")
    after = _digest(kept)
    assert {name: after.get(name) for name in before} == before


def test_a_fresh_run_into_a_save_dir_holding_checkpoints_changes_nothing(parts, saved):
    """resume=None into a run's save_dir is refused (FileExistsError) with every file as it was."""
    root, digest = saved
    with pytest.raises(FileExistsError, match="resume='auto'"):
        _loop(parts, root, None)
    assert _digest(root) == digest


def test_resuming_a_run_whose_budget_is_spent_says_so_once(parts, saved, tmp_path):
    """Resuming a finished run with the same max_epochs is legal and trains nothing: one ConfigurationWarning."""
    root, _ = saved
    copy = tmp_path / "copy"
    for path in root.rglob("*"):
        target = copy / path.relative_to(root)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    with pytest.warns(pf.ConfigurationWarning) as caught:
        _loop(parts, copy, "auto")
    said = [str(w.message) for w in caught if "nothing is left to train" in str(w.message)]
    assert len(said) == 1 and "max_epochs=1" in said[0]


def test_a_metric_no_hook_can_publish_is_said_at_construction(parts, tmp_path):
    """best_on('acc') without any evaluator waits for a metric that never comes: warned before the run starts."""
    with pytest.warns(pf.ConfigurationWarning, match=r"best_on\('acc'\) reads metric 'acc', but no hook evaluates"):
        _loop(parts, tmp_path, None, hooks=[pf.best_on("acc")])
