"""Loggers for experiment trackers: TensorBoard, Weights & Biases, MLflow; each an optional extra.

Each takes the numbers of a record as scalars named ``<kind>/<name>``
(``train/loss``, ``epoch/loss``, ``eval/val/score``) at the record's step,
leaving out where it was taken (``epoch``, ``iter``, ``of``). The tracker's
package is imported when the logger opens, never before: a run without
them needs none installed, and a missing one is an ``ImportError`` naming
the extra (``pip install 'pimm_fn[tensorboard]'``). See
``pimm_fn.runtime.loggers`` for the lifecycle they follow.

A resumed run goes on in the same tracker run, and sends no point twice:
W&B and MLflow cannot take back what they hold, so a value at a step the
tracker already holds for its name (the steps between the checkpoint and
the interruption, trained again: bit-identical, so what the tracker holds
is what the resumed run computes) is not sent again.
"""

import importlib
import json
import os
import time
import types
from pathlib import Path

from pimm_fn.runtime.history import POSITION
from pimm_fn.runtime.loggers import Opening, resolve_path, set_aside
from pimm_fn.runtime.wandb_offline import held_offline

__all__ = ["TensorBoardLogger", "WandbLogger", "MLFlowLogger", "scalars", "unsent"]


def scalars(record) -> dict:
    """``{"<kind>/<name>": float}`` of the record's numbers, position fields left out."""
    return {f"{record.kind}/{k}": float(v) for k, v in record.values.items()
            if k not in POSITION and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _require(module: str, extra: str, who: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{who} needs the {extra} package: pip install 'pimm_fn[{extra}]' "
                          f"(or pip install {extra})") from error


class TensorBoardLogger:
    """TensorBoard event files, written with ``torch.utils.tensorboard`` (the ``tensorboard`` extra).

    A resumed run purges the events past its step (TensorBoard's
    ``purge_step``); a fresh run sets an earlier run's directory aside
    (``tensorboard.1``).

    Args:
        log_dir: default ``save_dir/tensorboard``.
        flush_secs: at most this long between a record and its event on disk.
    """

    def __init__(self, log_dir=None, *, flush_secs: int = 10):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = flush_secs
        self._writer = None

    def open(self, opening: Opening) -> None:
        writer_class = _require("torch.utils.tensorboard", "tensorboard", "TensorBoardLogger").SummaryWriter
        where = resolve_path(self, self.log_dir, opening.save_dir, "tensorboard", store=opening.store)
        if not opening.continued and not opening.resumed:
            set_aside(where, opening.say)
        purge = opening.step + 1 if opening.resumed and not opening.continued else None
        self._writer = writer_class(str(where), purge_step=purge, flush_secs=self.flush_secs)

    def write(self, record) -> None:
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, record.step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __repr__(self):
        return f"TensorBoardLogger({str(self.log_dir)!r})" if self.log_dir is not None else "TensorBoardLogger()"


def _remembered(save_dir, name: str, resumed: bool) -> str | None:
    """The tracker run id a resumed run's ``save_dir/<name>`` holds (a fresh run starts a new one)."""
    if not resumed or save_dir is None or not (Path(save_dir) / name).is_file():
        return None
    return (Path(save_dir) / name).read_text().strip() or None


def _remember(save_dir, name: str, run_id: str) -> None:
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / name).write_text(run_id + "\n")


def unsent(record, held: dict) -> dict:
    """``scalars(record)`` the tracker does not hold yet, counting them in ``held`` (``{name: last step sent}``)."""
    points = {k: v for k, v in scalars(record).items() if record.step > held.get(k, -1)}
    held.update(dict.fromkeys(points, record.step))
    return points


def _held_steps(save_dir, name: str, run_id: str) -> dict:
    """``{scalar name: last step}`` a previous process sent to the tracker run ``run_id`` (``save_dir/<name>``).

    The note is its first line (``_Note`` rewrites it in place: a longer older note may trail it).
    """
    path = Path(save_dir) / name if save_dir is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text().split("\n", 1)[0])
        return {k: int(v) for k, v in saved.get("steps", {}).items()} if saved.get("id") == run_id else {}
    except (ValueError, AttributeError, TypeError):
        return {}  # a damaged note: the tracker gets the repeated steps, nothing else is lost


class _Note:
    """``save_dir/<name>``: the tracker run's id and last step per name, rewritten in place after every record.

    One ``pwrite`` at offset 0 and a truncate, no open or rename per record
    (a few microseconds): a process killed at any instant leaves the note
    of the last record sent, its first line whole (``_held_steps``).
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, run_id: str, held: dict) -> None:
        data = (json.dumps({"id": run_id, "steps": held}, sort_keys=True) + "\n").encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def close(self) -> None:
        os.close(self._fd)


class WandbLogger:
    """Weights & Biases (the ``wandb`` extra); ``mode="offline"`` writes local files only.

    The W&B run id is kept in ``save_dir/wandb-run-id``, so a resumed run
    logs on into the same W&B run (offline, a second ``offline-run-*``
    directory of the same id, which ``wandb sync`` joins). W&B cannot take
    a step back (offline, a rewind is not available), so a resumed run
    sends each name only the values past the last step the W&B run holds,
    and, first, the records up to the resumed step it lacks (from
    ``run.history``): W&B ends with every step once. What it holds: in
    offline mode, what its ``offline-run-*`` files hold (a ``wandb-core``
    killed outright, with its process, loses what it had not written:
    ``pimm_fn.runtime.wandb_offline``); online, or where those files do not
    parse, ``save_dir/wandb-run-steps.json``, the last step handed to W&B
    for each name, rewritten after every record (one ``pwrite``), so a
    ``SIGKILL`` leaves it exact but for a kill in the microseconds between
    W&B taking a record and that rewrite (that record is sent again).

    ``mode="offline"`` (or ``WANDB_MODE=offline``) needs no network and no
    account: the files go to ``save_dir/wandb``; ``WANDB_SILENT=true``
    quiets wandb's console.

    Args:
        project, name, mode: as ``wandb.init`` takes them.
        init: more ``wandb.init`` arguments (``config``, ``tags``, ``entity``...).
    """

    ID_FILE = "wandb-run-id"
    STEPS_FILE = "wandb-run-steps.json"

    def __init__(self, project: str | None = None, *, name: str | None = None, mode: str | None = None, **init):
        self.project, self.name, self.mode, self.init = project, name, mode, init
        self._run = None
        self._id = None
        self._held = {}  # scalar name -> the last step the W&B run holds for it
        self._note = None  # save_dir/wandb-run-steps.json, while open

    def open(self, opening: Opening) -> None:
        wandb = _require("wandb", "wandb", "WandbLogger")
        run_id = self._id or _remembered(opening.save_dir, self.ID_FILE, opening.resumed)
        where = {"dir": str(opening.save_dir)} if opening.save_dir is not None else {}
        if where:
            Path(opening.save_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=self.project, name=self.name, mode=self.mode, id=run_id,
                               resume="allow" if run_id else None, **where, **self.init)
        if self._id is None and run_id is not None:  # a resumed process: what the run holds already
            self._held = self._holding(opening.save_dir, run_id)
        self._id = self._run.id
        _remember(opening.save_dir, self.ID_FILE, self._id)
        if opening.save_dir is not None:
            self._note = _Note(Path(opening.save_dir) / self.STEPS_FILE)
            self._note.write(self._id, self._held)  # a fresh run's empty note: no earlier run's steps held
        if opening.history is not None and not opening.continued:
            self._send_missing(opening.history)

    def _holding(self, save_dir, run_id: str) -> dict:
        """What the W&B run ``run_id`` holds: offline, what its files hold (a killed W&B loses what it had not
        written: ``pimm_fn.runtime.wandb_offline``); else, or unreadable, the note of what was handed over."""
        if self._run.offline and save_dir is not None:
            found = held_offline(Path(save_dir) / "wandb", run_id)
            if found is not None:
                return found
        return _held_steps(save_dir, self.STEPS_FILE, run_id)

    def _send_missing(self, history) -> None:
        """The resumed run's records (up to its step) that W&B lacks, sent again from ``run.history``, in order."""
        for row in history.records():
            values = {k: v for k, v in row.items() if k not in ("step", "kind")}
            self.write(types.SimpleNamespace(step=row["step"], kind=row["kind"], values=values))

    def write(self, record) -> None:
        points = unsent(record, self._held)
        if points:
            self._run.log(points, step=record.step)
            if self._note is not None:
                self._note.write(self._id, self._held)  # what W&B holds now, kept through a kill

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
        if self._note is not None:
            self._note.close()
            self._note = None

    def __repr__(self):
        return f"WandbLogger(project={self.project!r})"


class MLFlowLogger:
    """MLflow (the ``mlflow`` extra), through ``MlflowClient``: no global active run is touched.

    The MLflow run id is kept in ``save_dir/mlflow-run-id``, so a resumed
    run logs on into the same MLflow run. MLflow keeps every value it got:
    a resumed run asks the store for the last step of each metric and sends
    only the values past it, so no step is logged twice (even after a
    process was killed).

    A local store: ``tracking_uri="sqlite:///mlflow.db"`` (needs
    ``sqlalchemy``), or a directory (``"file:///path/mlruns"``, MLflow's
    default ``./mlruns``), which MLflow 3 refuses unless the environment
    sets ``MLFLOW_ALLOW_FILE_STORE=true``.

    Args:
        experiment: the experiment's name (made when missing); default ``"pimm_fn"``.
        run_name: the run's name in MLflow.
        tracking_uri: default MLflow's own (``MLFLOW_TRACKING_URI``, else ``./mlruns``).
        tags: ``{name: value}`` set on a new run.
    """

    ID_FILE = "mlflow-run-id"

    def __init__(self, experiment: str = "pimm_fn", *, run_name: str | None = None, tracking_uri: str | None = None,
                 tags: dict | None = None):
        self.experiment, self.run_name, self.tracking_uri, self.tags = experiment, run_name, tracking_uri, tags
        self._client = None
        self._id = None
        self._held = {}  # metric name -> the last step the MLflow run holds for it

    def open(self, opening: Opening) -> None:
        tracking = _require("mlflow.tracking", "mlflow", "MLFlowLogger")
        self._client = client = tracking.MlflowClient(tracking_uri=self.tracking_uri)
        run_id = self._id or _remembered(opening.save_dir, self.ID_FILE, opening.resumed)
        if run_id is None:
            found = client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found is not None else client.create_experiment(self.experiment)
            run_id = client.create_run(experiment, run_name=self.run_name, tags=self.tags or {}).info.run_id
        else:
            client.update_run(run_id, status="RUNNING")
            if self._id is None:  # a resumed process: what the run holds already, read from the store
                self._held = self._last_steps(run_id)
        self._id = run_id
        _remember(opening.save_dir, self.ID_FILE, run_id)

    def _last_steps(self, run_id: str) -> dict:
        names = self._client.get_run(run_id).data.metrics
        return {k: max((m.step for m in self._client.get_metric_history(run_id, k)), default=-1) for k in names}

    def write(self, record) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, record.step) for key, value in unsent(record, self._held).items()]
        if metrics:
            self._client.log_batch(self._id, metrics=metrics)

    def close(self) -> None:
        if self._client is not None:
            self._client.set_terminated(self._id)
            self._client = None

    def __repr__(self):
        return f"MLFlowLogger({self.experiment!r})"
