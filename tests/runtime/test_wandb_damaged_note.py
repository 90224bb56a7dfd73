"""A damaged note of the steps W&B holds (wandb-run-steps.json) is read as no note: a resumed run opens and logs on."""

import json
from pathlib import Path

import pytest

from pimm_fn.runtime.logs.trackers import WandbLogger

from _tiny_workload import build
from test_tracker_resume import HOOKS, SAVED, STOPPED, _wandb_records, _written

UNPARSEABLE = b"\0" * 7 + b"\0\0\0\0\x20\0\x01" + b"\xff" * 32  # a W&B header, then one record that is no protobuf


def _logger():
    return WandbLogger(project="pimm_fn-test", mode="offline")


def _steps_sent(path: Path, key: str) -> list:
    return [
        r.history.step.num
        for r in _wandb_records(path)
        if r.WhichOneof("record_type") == "history"
        and any((i.key or "/".join(i.nested_key)) == key for i in r.history.item)
    ]


@pytest.mark.parametrize(
    "step", ["1e400", "-1e400", "NaN", '"4"x', "[4]", "null", pytest.param("[" * 100000, id="nested-100000-deep")]
)
def test_a_note_holding_a_step_no_int_can_be_is_read_as_no_note(tmp_path, monkeypatch, step):
    """Stopped at 8, the note's train/loss step set to 1e400 (and other unreadable values), W&B's own offline file
    unparseable (so the note is what a resume reads): the resumed run opens its logger (before: OverflowError for
    1e400), and, holding nothing, sends train/loss at every logged step again, into the same W&B run."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    _, first = build(tmp_path, hooks=HOOKS, max_epochs=2, loggers=[_logger()])
    first.run(steps=STOPPED)
    first.ctx.close()
    (old,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    _written(old)
    note = tmp_path / WandbLogger.STEPS_FILE
    held = json.loads(note.read_text().split("\n", 1)[0])
    assert held["steps"]["train/loss"] == STOPPED
    note.write_text(json.dumps(held).replace(f'"train/loss": {STOPPED}', f'"train/loss": {step}') + "\n")
    old.write_bytes(UNPARSEABLE)
    _, resumed = build(tmp_path, hooks=HOOKS, max_epochs=2, loggers=[_logger()], resume="auto")
    assert resumed.state.progress.global_step == SAVED
    resumed()
    new = next(p for p in tmp_path.glob("wandb/offline-run-*/run-*.wandb") if p != old)
    _written(new)
    assert new.stem == old.stem  # the same W&B run id
    assert _steps_sent(new, "train/loss") == [2, 4, 6, 8, 10]
