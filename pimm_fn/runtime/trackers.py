"""Loggers for experiment trackers: TensorBoard, MLflow; each an optional extra (W&B: ``.wandb_logger``).

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
import time
from pathlib import Path

from pimm_fn.runtime.history import POSITION
from pimm_fn.runtime.loggers import Opening, resolve_path, set_aside

__all__ = ["TensorBoardLogger", "MLFlowLogger", "scalars", "unsent", "require", "remembered", "remember"]


def scalars(record) -> dict:
    """``{"<kind>/<name>": float}`` of the record's numbers, position fields left out."""
    return {f"{record.kind}/{k}": float(v) for k, v in record.values.items()
            if k not in POSITION and isinstance(v, (int, float)) and not isinstance(v, bool)}


def require(module: str, extra: str, who: str):
    """The tracker's package, imported now; a missing one is an ``ImportError`` naming the extra."""
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
        writer_class = require("torch.utils.tensorboard", "tensorboard", "TensorBoardLogger").SummaryWriter
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


def unsent(record, held: dict) -> dict:
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

    def __init__(self, experiment: str = "pimm_fn", *, run_name: str | None = None, tracking_uri: str | None = None,
                 tags: dict | None = None):
        self.experiment, self.run_name, self.tracking_uri, self.tags = experiment, run_name, tracking_uri, tags
        self._client = None
        self._id = None
        self._held = {}  # metric name -> the last step the MLflow run holds for it

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
