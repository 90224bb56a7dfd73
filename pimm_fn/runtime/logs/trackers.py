"""Loggers for experiment trackers: TensorBoard, MLflow and Weights & Biases, each an optional extra.

Each takes the numbers of a record as scalars named ``<kind>/<name>``
(``train/loss``, ``epoch/loss``, ``eval/val/score``) at the record's step,
leaving out where it was taken (``epoch``, ``iter``, ``of``). The tracker's
package is imported when the logger opens, never before: a run without
them needs none installed, and a missing one is an ``ImportError`` naming
the extra (``pip install 'pimm_fn[tensorboard]'``). See
``pimm_fn.runtime.logs.loggers`` for the lifecycle they follow.

A resumed run goes on in the same tracker run, and sends no point twice:
W&B and MLflow cannot take back what they hold, so a value at a step the
tracker already holds for its name (the steps between the checkpoint and
the interruption, trained again: bit-identical, so what the tracker holds
is what the resumed run computes) is not sent again.

The Weights & Biases logger (the ``wandb`` extra): a resumed run logs on into the same W&B run, no step twice.

What the W&B run already holds is read from its offline files
(``pimm_fn.runtime.logs.trackers``) or from the note this logger rewrites
after every record (``save_dir/wandb-run-steps.json``). The tracker
conventions it shares with the others (scalar names, the remembered run
id, what is left unsent) are ``pimm_fn.runtime.logs.trackers``'.

What an offline W&B run holds: the last step of each scalar in its ``offline-run-*`` files.

A W&B process killed outright (``SIGKILL``, a node lost) loses what its
``wandb-core`` had not yet written: an offline run's ``.wandb`` file holds
only what was flushed (often nothing of a short process). So a resumed
``WandbLogger`` in offline mode asks the files themselves, not only its own
note of what it handed over: what they hold is what ``wandb sync`` uploads.

The format is W&B's transaction log: a 7-byte header, then a LevelDB log
(32 KiB blocks of records, each a 7-byte header: CRC, length, type) of
``wandb_internal_pb2.Record`` protobufs; a ``history`` record carries the
step and the values. Reading runs no code from the file (protobuf parsing).
A file that does not parse (another W&B version's format) gives ``None``:
the caller keeps its note.
"""

import importlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from pimm_fn.core import untrusted_json
from pimm_fn.core.effects import Log
from pimm_fn.runtime.logs.history import POSITION
from pimm_fn.runtime.logs.loggers import Opening, resolve_path, set_aside

__all__ = [
    "TensorBoardLogger",
    "MLFlowLogger",
    "Record",
    "scalars",
    "unsent",
    "require",
    "remembered",
    "remember",
    "held_offline",
    "WandbLogger",
]


class Record(Protocol):
    """What a tracker reads of a record: a ``Log``, or a record of ``run.history`` sent again."""

    @property
    def step(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def values(self) -> Mapping[Any, Any]: ...


class _Row(NamedTuple):
    """A record of ``run.history`` (``{"step", "kind", **values}``) as a ``Record``."""

    step: int
    kind: str
    values: dict[str, Any]


def scalars(record: Record) -> dict:
    """``{"<kind>/<name>": float}`` of the record's numbers, position fields left out."""
    return {
        f"{record.kind}/{k}": float(v)
        for k, v in record.values.items()
        if k not in POSITION and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def require(module: str, extra: str, who: str):
    """The tracker's package, imported now; a missing one is an ``ImportError`` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{who} needs the {extra} package: pip install 'pimm_fn[{extra}]' (or pip install {extra})"
        ) from error


class TensorBoardLogger:
    """TensorBoard event files, written with ``torch.utils.tensorboard`` (the ``tensorboard`` extra).

    A resumed run purges the events past its step (TensorBoard's
    ``purge_step``); a fresh run sets an earlier run's directory aside
    (``tensorboard.1``).

    Args:
        log_dir: default ``save_dir/tensorboard``.
        flush_secs: at most this long between a record and its event on disk.
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, *, flush_secs: int = 10) -> None:
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.flush_secs = flush_secs
        self._writer: Any = None  # torch's SummaryWriter, made by open(): tensorboard is imported only then

    def open(self, opening: Opening) -> None:
        writer_class = require("torch.utils.tensorboard", "tensorboard", "TensorBoardLogger").SummaryWriter
        where = resolve_path(self, self.log_dir, opening.save_dir, "tensorboard", store=opening.store)
        if not opening.continued and not opening.resumed:
            set_aside(where, opening.say)
        purge = opening.step + 1 if opening.resumed and not opening.continued else None
        self._writer = writer_class(str(where), purge_step=purge, flush_secs=self.flush_secs)

    def write(self, record: Log) -> None:
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, record.step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __repr__(self):
        return f"TensorBoardLogger({str(self.log_dir)!r})" if self.log_dir is not None else "TensorBoardLogger()"


def remembered(save_dir, name: str, resumed: bool) -> str | None:
    """The tracker run id a resumed run's ``save_dir/<name>`` holds (a fresh run starts a new one)."""
    if not resumed or save_dir is None or not (Path(save_dir) / name).is_file():
        return None
    return (Path(save_dir) / name).read_text().strip() or None


def remember(save_dir, name: str, run_id: str) -> None:
    """Keep the tracker run id in ``save_dir/<name>``, for a resumed run to log on into it."""
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / name).write_text(run_id + "\n")


def unsent(record: Record, held: dict) -> dict:
    """``scalars(record)`` the tracker does not hold yet, counting them in ``held`` (``{name: last step sent}``)."""
    points = {k: v for k, v in scalars(record).items() if record.step > held.get(k, -1)}
    held.update(dict.fromkeys(points, record.step))
    return points


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

    def __init__(
        self,
        experiment: str = "pimm_fn",
        *,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict | None = None,
    ) -> None:
        self.experiment, self.run_name, self.tracking_uri, self.tags = experiment, run_name, tracking_uri, tags
        self._client: Any = None  # an MlflowClient, made by open(): mlflow is imported only then
        self._id: str | None = None
        self._held: dict[str, int] = {}  # metric name -> the last step the MLflow run holds for it

    def open(self, opening: Opening) -> None:
        tracking = require("mlflow.tracking", "mlflow", "MLFlowLogger")
        self._client = client = tracking.MlflowClient(tracking_uri=self.tracking_uri)
        run_id = self._id or remembered(opening.save_dir, self.ID_FILE, opening.resumed)
        if run_id is None:
            found = client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found is not None else client.create_experiment(self.experiment)
            run_id = client.create_run(experiment, run_name=self.run_name, tags=self.tags or {}).info.run_id
        else:
            client.update_run(run_id, status="RUNNING")
            if self._id is None:  # a resumed process: what the run holds already, read from the store
                self._held = self._last_steps(run_id)
        self._id = run_id
        remember(opening.save_dir, self.ID_FILE, run_id)

    def _last_steps(self, run_id: str) -> dict[str, int]:
        names = self._client.get_run(run_id).data.metrics
        return {k: max((m.step for m in self._client.get_metric_history(run_id, k)), default=-1) for k in names}

    def write(self, record: Log) -> None:
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


_BLOCK, _HEADER, _FILE_HEADER = 32768, 7, 7


_FULL, _LAST = 1, 4  # a record in one piece, and the last piece of one


def _records(data: bytes):
    """The payloads of the log's whole records (a record cut short at the end, by a kill, is left out)."""
    pos, part = _FILE_HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + _HEADER + length > len(data):
            return
        part, pos = part + data[pos + _HEADER : pos + _HEADER + length], pos + _HEADER + length
        if kind in (_FULL, _LAST):
            yield part
            part = b""


def _held_in(path: Path, held: dict) -> None:
    from wandb.proto import wandb_internal_pb2  # the logger's own package: present when it runs

    for payload in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        step = record.history.step.num
        for item in record.history.item:
            name = item.key or "/".join(item.nested_key)
            if not name.startswith("_") and untrusted_json.loads(item.value_json) is not None:
                held[name] = max(held.get(name, -1), step)


def held_offline(wandb_dir, run_id: str) -> dict | None:
    """``{scalar name: last step}`` the offline runs of ``run_id`` under ``wandb_dir`` hold; ``None``: unreadable."""
    held: dict = {}
    try:
        for path in sorted(Path(wandb_dir).glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
            _held_in(path, held)
    except Exception:  # noqa: BLE001 - another W&B version's format: the caller keeps its note
        return None
    return held


def _held_steps(save_dir, name: str, run_id: str) -> dict:
    """``{scalar name: last step}`` a previous process sent to the tracker run ``run_id`` (``save_dir/<name>``).

    The note is its first line (``_Note`` rewrites it in place: a longer older note may trail it).
    """
    path = Path(save_dir) / name if save_dir is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        saved = untrusted_json.loads(path.read_text().split("\n", 1)[0])
        return {k: int(v) for k, v in saved.get("steps", {}).items()} if saved.get("id") == run_id else {}
    except (ValueError, AttributeError, TypeError, OverflowError):  # OverflowError: int() of a step like 1e400 (inf)
        return {}  # a damaged note: the tracker gets the repeated steps, nothing else is lost


class _Note:
    """``save_dir/<name>``: the tracker run's id and last step per name, rewritten in place after every record.

    One ``pwrite`` at offset 0 and a truncate, no open or rename per record
    (a few microseconds): a process killed at any instant leaves the note
    of the last record sent, its first line whole (``_held_steps``).
    """

    def __init__(self, path: Path, run_id: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._id = run_id

    def write(self, held: dict) -> None:
        data = (json.dumps({"id": self._id, "steps": held}, sort_keys=True) + "\n").encode()
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
    ``pimm_fn.runtime.logs.trackers``); online, or where those files do not
    parse, ``save_dir/wandb-run-steps.json``, the last step handed to W&B
    for each name, rewritten after every record (one ``pwrite``), so a
    ``SIGKILL`` leaves it exact but for a kill in the microseconds between
    W&B taking a record and that rewrite (that record is sent again).

    ``mode="offline"`` (or ``WANDB_MODE=offline``) needs no network and no
    account: the files go to ``save_dir/wandb``; ``WANDB_SILENT=true``
    quiets wandb's console.

    Args:
        project: ``wandb.init``'s ``project``.
        name: ``wandb.init``'s ``name``.
        mode: ``wandb.init``'s ``mode``.
        init: more ``wandb.init`` arguments (``config``, ``tags``, ``entity``...).
    """

    ID_FILE = "wandb-run-id"
    STEPS_FILE = "wandb-run-steps.json"

    def __init__(
        self, project: str | None = None, *, name: str | None = None, mode: str | None = None, **init: Any
    ) -> None:
        self.project, self.name, self.mode, self.init = project, name, mode, init
        self._run: Any = None  # the wandb Run, made by open(): wandb is imported only then
        self._id: str | None = None
        self._held: dict[str, int] = {}  # scalar name -> the last step the W&B run holds for it
        self._note: _Note | None = None  # save_dir/wandb-run-steps.json, while open

    def open(self, opening: Opening) -> None:
        wandb = require("wandb", "wandb", "WandbLogger")
        run_id = self._id or remembered(opening.save_dir, self.ID_FILE, opening.resumed)
        where = {"dir": str(opening.save_dir)} if opening.save_dir is not None else {}
        if opening.save_dir is not None:
            Path(opening.save_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=self.project,
            name=self.name,
            mode=self.mode,
            id=run_id,
            resume="allow" if run_id else None,
            **where,
            **self.init,
        )
        if self._id is None and run_id is not None:  # a resumed process: what the run holds already
            self._held = self._holding(opening.save_dir, run_id)
        self._id = run_id = self._run.id
        remember(opening.save_dir, self.ID_FILE, run_id)
        if opening.save_dir is not None:
            self._note = _Note(Path(opening.save_dir) / self.STEPS_FILE, run_id)
            self._note.write(self._held)  # a fresh run's empty note: no earlier run's steps held
        if opening.history is not None and not opening.continued:
            self._send_missing(opening.history)

    def _holding(self, save_dir, run_id: str) -> dict[str, int]:
        """What the W&B run ``run_id`` holds: offline, what its files hold (a killed W&B loses what it had not
        written: ``pimm_fn.runtime.logs.trackers``); else, or unreadable, the note of what was handed over."""
        if self._run.offline and save_dir is not None:
            found = held_offline(Path(save_dir) / "wandb", run_id)
            if found is not None:
                return found
        return _held_steps(save_dir, self.STEPS_FILE, run_id)

    def _send_missing(self, history) -> None:
        """The resumed run's records (up to its step) that W&B lacks, sent again from ``run.history``, in order."""
        for row in history.records():
            values = {k: v for k, v in row.items() if k not in ("step", "kind")}
            self.write(_Row(row["step"], row["kind"], values))

    def write(self, record: Record) -> None:
        points = unsent(record, self._held)
        if points:
            self._run.log(points, step=record.step)
            if self._note is not None:
                self._note.write(self._held)  # what W&B holds now, kept through a kill

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
        if self._note is not None:
            self._note.close()
            self._note = None

    def __repr__(self):
        return f"WandbLogger(project={self.project!r})"
