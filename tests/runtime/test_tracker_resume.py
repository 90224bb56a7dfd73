"""W&B (offline) and MLflow (a local store), the real packages: a resumed run goes on in one tracker run, no step twice."""

import json
import time
from pathlib import Path

import mlflow.tracking
import pytest
import wandb  # noqa: F401 - the test extra installs it: never skipped
from wandb.proto import wandb_internal_pb2

import pimm_fn as pf
from pimm_fn.runtime.logs.trackers import MLFlowLogger
from pimm_fn.runtime.logs.trackers import WandbLogger

from _tiny_workload import build, negative_mse

HOOKS = [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.log_every(2)]
LOGGED = [2, 4, 6, 8, 10]  # log_every(2) over 2 epochs of 5 steps
STOPPED, SAVED = 8, 6  # the first process stops at step 8; its last checkpoint is step 6's


def _interrupted_then_resumed(save_dir: Path, logger) -> list:
    """Train to step 8, close (the process ends), resume from step 6 with a new logger; the records of log.jsonl."""
    _, first = build(save_dir, hooks=HOOKS, max_epochs=2, loggers=[logger()])
    first.run(steps=STOPPED)
    first.ctx.close()
    _, resumed = build(save_dir, hooks=HOOKS, max_epochs=2, loggers=[logger()], resume="auto")
    assert resumed.state.progress.global_step == SAVED
    resumed()
    return [json.loads(line) for line in (save_dir / "log.jsonl").read_text().splitlines()]


def _expected(records: list) -> dict:
    """``{tracker name: [(step, value)]}`` of train/loss and eval/val/score, from log.jsonl."""
    return {
        "train/loss": [(r["step"], r["loss"]) for r in records if r["kind"] == "train"],
        "eval/val/score": [(r["step"], r["score"]) for r in records if r["kind"] == "eval/val"],
    }


def _same_points(got: list, expected: list) -> None:
    assert [s for s, _ in got] == [s for s, _ in expected] != []
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)


def _written(path: Path, timeout: float = 90) -> None:
    """Wait (bounded) for W&B's own process to write an offline run's file: its finish() returns before that."""
    deadline, size = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        now = path.stat().st_size
        if now > 7 and now == size:  # past the header, and no longer growing
            return
        size = now
        time.sleep(0.5)
    pytest.fail(f"W&B never wrote {path}")


def _wandb_records(path: Path):
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then a LevelDB log in 32 KiB blocks."""
    data, pos, part = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            yield record
            part = b""


def _wandb_points(run_dir: Path) -> tuple[set, dict]:
    """(the run ids, ``{key: [(step, value)]}``) of every offline run W&B wrote under ``run_dir``, in order."""
    ids, points = set(), {}
    # In the order the processes made them: the folders' names hold only the second, then a random id.
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.stat().st_mtime):
        ids.add(path.stem.removeprefix("run-"))
        for record in _wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                for key, value in items.items():
                    if not key.startswith("_"):
                        points.setdefault(key, []).append((record.history.step.num, value))
    return ids, points


def test_wandb_offline_resume_goes_on_in_one_run_with_each_step_once(tmp_path, monkeypatch):
    """Stopped at 8, resumed from 6: one W&B run id, train/loss at 2..10 once each, equal to log.jsonl."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    records = _interrupted_then_resumed(tmp_path, lambda: WandbLogger(project="pimm_fn-test", mode="offline"))
    for path in tmp_path.glob("wandb/offline-run-*/run-*.wandb"):
        _written(path)
    ids, points = _wandb_points(tmp_path)
    assert ids == {(tmp_path / WandbLogger.ID_FILE).read_text().strip()}
    assert len(list(tmp_path.glob("wandb/offline-run-*"))) == 2  # one per process, joined by wandb sync
    expected = _expected(records)
    assert [s for s, _ in points["train/loss"]] == LOGGED
    for key, values in expected.items():
        _same_points(points[key], values)


def test_mlflow_local_store_resume_goes_on_in_one_run_with_each_step_once(tmp_path, monkeypatch):
    """Stopped at 8, resumed from 6: the experiment holds one run, its metrics at each step once, equal to log.jsonl."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    uri = (tmp_path / "mlruns").as_uri()
    records = _interrupted_then_resumed(tmp_path / "run", lambda: MLFlowLogger("pimm_fn-test", tracking_uri=uri))
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("pimm_fn-test").experiment_id])
    assert [r.info.run_id for r in runs] == [(tmp_path / "run" / MLFlowLogger.ID_FILE).read_text().strip()]
    assert runs[0].info.status == "FINISHED"
    for key, values in _expected(records).items():
        history = sorted(client.get_metric_history(runs[0].info.run_id, key), key=lambda m: (m.step, m.timestamp))
        _same_points([(m.step, m.value) for m in history], values)
