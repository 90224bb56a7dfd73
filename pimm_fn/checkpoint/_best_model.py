"""The best model's files: ``model_best.pth`` and its ``.json``, written atomically by the main rank.

With digests (``Saving(digests=True)``) the ``.json`` records the weights
file's SHA-256, hashed as it is written, and :func:`check_best` checks it
wherever the file is read back (``run.test(weights="best")``, a warm start,
``verify``): bytes changed at the same size are refused.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import torch

from pimm_fn import dist

from . import _layout as L
from . import _safe_writes as W
from . import regular_files, storage
from .errors import CheckpointError, cause, storage_errors, tensor_bytes
from .manifest import digest


def write_best(
    model_dir: str | os.PathLike, weights: dict, *, metric: str, value: float, step: int, per_metric: bool = False,
    digests: bool = False,
) -> pathlib.Path:
    """Atomically write ``model_best.pth`` and ``model_best.json`` (main rank only).

    With ``per_metric`` the files are ``model_best_<metric>.pth`` and
    ``.json``, so runs tracking several metrics keep one best model each.

    Both files are written in full under temporary names first, then
    replaced, the weights file first; each replace is atomic. A write that
    fails (a full disk) leaves the previous best files as they were.

    Args:
        model_dir: the checkpoint root.
        weights: the model state_dict.
        metric: the metric's name, e.g. ``"mIoU"``.
        value: its finite value.
        step: the global step the weights come from.
        per_metric: name the files after ``metric``.
        digests: record the weights file's SHA-256 in the ``.json``.

    Returns:
        The path of the weights file written.

    Raises:
        RuntimeError: called on a rank other than 0.
        ValueError: a bad ``metric``, ``value`` or ``step``.
        DiskFullError: the disk filled up; the previous best files are intact.
    """
    if not dist.is_main():
        raise RuntimeError(f"write_best must run on the main rank only (called on rank {dist.rank()}); guard it with dist.is_main()")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"write_best: 'metric' must be a non-empty str (got {metric!r})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"write_best: 'value' must be a finite number (got {value!r}); a NaN metric never improves")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"write_best: 'step' must be an int >= 0 (got {step!r})")
    root = storage.location(model_dir)
    stem = L.best_stem(metric if per_metric else None)
    record = {"metric": metric, "value": float(value), "step": step}
    write_weights = lambda f: torch.save(weights, f)
    if digests:  # the weights file is written first: its digest is in the record before the .json is written
        write_weights = W.hashed(write_weights, lambda sha256: record.update(sha256=sha256))
    meta = lambda: json.dumps(record, sort_keys=True).encode()
    files = {root / f"{stem}.pth": write_weights, root / f"{stem}.json": lambda f: f.write(meta())}
    nbytes = lambda: tensor_bytes(weights) + len(meta())
    with storage_errors(root, nbytes, f"{stem}.pth and {stem}.json", f"the previous {stem} is intact"):
        if storage.is_store(root):  # one PUT per object, each atomic: the weights first, as the renames below
            root.mkdir(parents=True, exist_ok=True)  # a missing bucket said as such, never created
            for path, write in files.items():
                W.durable_write(path, write)
            return root / f"{stem}.pth"
        staged = _stage_all(root, files)
        try:
            for tmp, path in zip(staged, files):
                os.replace(tmp, path)
        except BaseException:
            for tmp in staged:
                tmp.unlink(missing_ok=True)
            raise
    W.fsync_dir(root)
    return root / f"{stem}.pth"


def _stage_all(root: pathlib.Path, files: dict) -> list[pathlib.Path]:
    """Write each file durably under a ``.staging-*`` name (mode by the umask); on failure remove them all (the old files stay)."""
    staged: list[pathlib.Path] = []
    try:
        for path, write in files.items():
            staged.append(W.staged_write(path, write))
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    return staged


def best_record(weights_file: pathlib.Path) -> dict:
    """What :func:`write_best` recorded beside ``weights_file`` (metric, value, step; its SHA-256 with digests), checked.

    The ``.json`` is untrusted: read as :mod:`.regular_files` reads (a FIFO is
    never waited on), and taken only as the record ``write_best`` writes.

    Raises:
        FileNotFoundError: there is no record beside it.
        OSError: it cannot be read, or is no regular file (``regular_files.NotRegularFileError``).
        ValueError: it is not JSON, or not such a record; the message says what is wrong.
    """
    record = regular_files.read_json(weights_file.with_suffix(".json"))
    if not isinstance(record, dict):
        raise ValueError(f"holds a JSON {type(record).__name__}, not a record of metric, value and step")
    metric, value, step = record.get("metric"), record.get("value"), record.get("step")
    if not isinstance(metric, str):
        raise ValueError(f"'metric' must be a str (got {metric!r:.80})")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"'value' must be a number (got {value!r:.80})")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"'step' must be an int >= 0 (got {step!r:.80})")
    return record


def record_problem(exc: BaseException) -> str:
    """Why the record :func:`best_record` raised ``exc`` for cannot be taken: the rest of a sentence about it."""
    if isinstance(exc, FileNotFoundError):
        return "is missing"
    if isinstance(exc, regular_files.NotRegularFileError):
        return exc.strerror
    return f"is damaged ({cause(exc)})"


def check_best(path: pathlib.Path) -> None:
    """The best-model file ``path`` matches the SHA-256 its ``.json`` records, if it records one.

    The ``.json`` is untrusted: one that is missing, unreadable or not the
    record :func:`best_record` takes, or that records no digest (a run
    without digests), checks nothing; the weights file's own read then
    checks what it can.

    Raises:
        CheckpointError: naming the file, when its bytes changed since it was written.
    """
    try:
        record = best_record(path)
    except (OSError, ValueError):
        return
    recorded = record.get("sha256")
    if not isinstance(recorded, str):
        return
    try:
        actual = digest(path)
    except OSError as exc:
        raise CheckpointError(path, path.name, f"cannot be read ({cause(exc)})") from None
    if actual != recorded:
        problem = f"does not match the SHA-256 {path.with_suffix('.json').name} records: its bytes changed since it was written"
        advice = (f"Restore it from a copy, or use a checkpoint's weights instead: list them with "
                  f"`python -m pimm_fn ls {path.parent}` and pass one's path")
        raise CheckpointError(path, path.name, problem, advice)
