"""Loggers: opened once per run, fed every Log record, closed at the end and on an error, exact on resume."""

import csv
import gc
import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.logs.loggers import CSVLogger
from pimm_fn.runtime.logs.loggers import JsonlLogger
from pimm_fn.runtime.logs.trackers import MLFlowLogger, TensorBoardLogger
from pimm_fn.runtime.logs.trackers import WandbLogger
from _tiny_workload import TinyNet, build, loader, negative_mse


class Recording:
    """A logger of our own: it keeps every call it gets."""

    def __init__(self):
        self.calls = []

    def open(self, opening):
        self.calls.append(("open", opening.step, opening.resumed, opening.continued))

    def write(self, record):
        self.calls.append(("write", record.step, record.kind))

    def close(self):
        self.calls.append(("close",))


def _hooks(log=2):
    return [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.log_every(log)]


def _open_files(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve())) if fds.is_dir() else -1


def test_the_jsonl_file_is_opened_once_and_closed_at_the_end(tmp_path):
    """One descriptor on log.jsonl while the run trains, each record on disk at once; none once training ended."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to count open files")
    _, run = build(tmp_path, hooks=[pf.log_every(1)], max_epochs=2)
    path = tmp_path / "log.jsonl"
    run.run(steps=3)
    assert _open_files(path) == 1 and len(path.read_text().splitlines()) == 3
    run.run(steps=2)
    assert _open_files(path) == 1 and len(path.read_text().splitlines()) == 6  # 5 steps and the epoch mean
    run()
    assert _open_files(path) == 0


@pytest.mark.parametrize("steps", [0, 2], ids=["never run", "dropped half-way"])
def test_a_run_dropped_unfinished_closes_its_log_files_without_a_resource_warning(tmp_path, steps):
    """A loop() built and dropped, never run or left half-way, closes log.jsonl and log.csv: no ResourceWarning."""
    _, run = build(tmp_path, hooks=[pf.log_every(1)], max_epochs=2, loggers=[CSVLogger()])
    run.run(steps=steps)
    with warnings.catch_warnings(record=True) as caught:  # one warned inside gc.collect() is recorded, not raised
        warnings.simplefilter("always", ResourceWarning)
        del run
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert [_open_files(tmp_path / name) for name in ("log.jsonl", "log.csv")] in ([0, 0], [-1, -1])


class Flaky:
    """A hook that raises once, at step 3: the run stops there and continues."""

    events = (pf.events.AfterStep,)

    def __init__(self):
        self.raised = False

    def __call__(self, state, event):
        if event.step == 3 and not self.raised:
            self.raised = True
            raise RuntimeError("flaky")
        return state, ()

    def __repr__(self):
        return "Flaky()"


def test_loggers_close_on_an_error_and_open_again_appending(tmp_path):
    """open at build, close when a step raises, open(continued) at the next record, close when training ends."""
    recording = Recording()
    _, run = build(tmp_path, hooks=[pf.log_every(2), Flaky()], max_epochs=1, loggers=[recording])
    with pytest.raises(RuntimeError, match="flaky"):
        run()
    assert recording.calls == [("open", 0, False, False), ("write", 2, "train"), ("close",)]
    run()
    assert recording.calls[3:] == [("open", 0, False, True), ("write", 4, "train"), ("write", 5, "epoch"), ("close",)]
    assert [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [2, 4, 5]


def test_csv_rows_widen_for_new_names_and_resume_drops_the_rows_past_it(tmp_path):
    """An evaluation's new name rewrites the header; a resume at step 6 keeps rows up to 6, then goes on."""
    _, whole = build(tmp_path / "whole", hooks=_hooks(), max_epochs=2, loggers=[CSVLogger()])
    whole()
    _, first = build(tmp_path / "run", hooks=_hooks(), max_epochs=2, loggers=[CSVLogger()])
    first.run(steps=8)
    first.ctx.close()
    _, resumed = build(tmp_path / "run", hooks=_hooks(), max_epochs=2, loggers=[CSVLogger()], resume="auto")
    resumed()

    def rows(path):
        with open(path, newline="") as file:
            return list(csv.DictReader(file))

    expected = rows(tmp_path / "whole" / "log.csv")
    assert list(expected[0])[:2] == ["step", "kind"] and "score" in expected[0]
    assert [(r["step"], r["kind"]) for r in expected][:3] == [("2", "train"), ("4", "train"), ("4", "eval/val")]
    assert rows(tmp_path / "run" / "log.csv") == expected


def _scalars(log_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_scalars_read_back_and_a_resume_purges_what_came_after_it(tmp_path):
    """train/loss, epoch/loss, eval/val/score at their steps; after a resume at 6, each step once, as uninterrupted."""
    pytest.importorskip("tensorboard")
    _, whole = build(tmp_path / "whole", hooks=_hooks(), max_epochs=2, loggers=[TensorBoardLogger()])
    whole()
    expected = _scalars(tmp_path / "whole" / "tensorboard")
    assert set(expected) == {"train/loss", "train/lr", "epoch/loss", "epoch/lr", "eval/val/score"}
    assert [s for s, _ in expected["train/loss"]] == [2, 4, 6, 8, 10]
    losses = [json.loads(line) for line in (tmp_path / "whole" / "log.jsonl").read_text().splitlines()]
    assert [v for _, v in expected["train/loss"]] == pytest.approx([r["loss"] for r in losses if r["kind"] == "train"])

    _, first = build(tmp_path / "run", hooks=_hooks(), max_epochs=2, loggers=[TensorBoardLogger()])
    first.run(steps=8)
    first.ctx.close()
    _, resumed = build(tmp_path / "run", hooks=_hooks(), max_epochs=2, loggers=[TensorBoardLogger()], resume="auto")
    resumed()
    assert _scalars(tmp_path / "run" / "tensorboard") == expected


def test_wandb_offline_gets_every_record(tmp_path, monkeypatch):
    """Offline W&B (the test extra installs wandb): the files under save_dir/wandb and the run id kept beside them."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(project="pimm_fn-test", mode="offline")
    _, run = build(tmp_path, hooks=_hooks(), max_epochs=1, loggers=[logger])
    run()
    assert (tmp_path / "wandb").is_dir() and (tmp_path / WandbLogger.ID_FILE).read_text().strip() == logger._id


def test_mlflow_file_store_gets_every_record(tmp_path, monkeypatch):
    """A local MLflow store (the test extra installs mlflow-skinny) holds train/loss at every logged step."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind this switch
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    logger = MLFlowLogger("pimm_fn-test", tracking_uri=uri)
    _, run = build(tmp_path / "run", hooks=_hooks(), max_epochs=1, loggers=[logger])
    run()
    history = MlflowClient(tracking_uri=uri).get_metric_history(logger._id, "train/loss")
    assert [m.step for m in history] == [2, 4]


def test_log_lines_say_the_elapsed_time_and_the_pace(tmp_path, capsys):
    """A train line ends with elapsed time, ms/step and samples/s; an evaluation line with the elapsed time."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        hooks=_hooks(),
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(progress=False),
    )
    run()
    out = capsys.readouterr().out
    assert re.search(r"step 2 train: epoch=0 iter=2 of=5 loss=\S+ lr=\S+ \(\d+\.\ds, \S+ ms/step, \S+ samples/s\)", out)
    assert re.search(r"step 4 eval/val: score=\S+ \(\d+\.\ds\)\n", out)


def test_one_process_logs_its_own_outputs_with_no_rank_field(tmp_path):
    """With one rank, log_reduce='mean' changes nothing and no record names its ranks."""
    _, run = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=1, watching=pf.Watching(log_reduce="mean"))
    run()
    assert all("over" not in r for r in run.history.records())


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"loggers": CSVLogger()}, TypeError, "'loggers' must be a list"),
        ({"loggers": [CSVLogger]}, TypeError, "the class itself: make one, CSVLogger()"),
        ({"loggers": [object()]}, TypeError, "missing: open, write, close"),
        ({"loggers": [JsonlLogger("a.jsonl")] * 2}, ValueError, "the same logger twice"),
        ({"log_reduce": "sum"}, ValueError, "'log_reduce' must be None .* or 'mean'"),
        ({"progress": "yes"}, TypeError, "'progress' must be None"),
    ],
)
def test_malformed_logging_arguments_are_refused_before_anything_is_written(tmp_path, kwargs, error, match):
    """Each names the argument and what it takes; save_dir stays empty."""
    kwargs = dict(kwargs)
    watched = {name: kwargs.pop(name) for name in ("log_reduce", "progress") if name in kwargs}  # Watching's fields
    with pytest.raises(error, match=match):
        build(
            tmp_path,
            hooks=[pf.log_every(2)],
            max_epochs=1,
            **kwargs,
            **({"watching": pf.Watching(**watched)} if watched else {}),
        )
    assert not any(tmp_path.iterdir())


def test_a_logger_needing_a_directory_says_so_without_save_dir():
    """CSVLogger() without save_dir or path: a ValueError naming both fixes."""
    model = TinyNet()
    with pytest.raises(ValueError, match="pass save_dir= to loop\\(\\), or a path to the logger"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            loader(),
            hooks=[pf.log_every(2)],
            max_epochs=1,
            loggers=[CSVLogger()],
            watching=pf.Watching(console=False),
        )
