"""The one-file formats the main rank writes: legacy ``last.pth``, and the best model's ``model_best.pth`` with its ``.json``.

The file is a ``torch.save`` of a dict holding only strings, plain
containers and tensors, so ``torch.load(weights_only=True)`` reads it::

    {"marker": {"step", "format": "legacy", "world_size", "version"},
     "weights": <model state_dict>,
     "trainer": {"skeleton": str, "tensors": {...}},
     "local": [{"skeleton": str, "tensors": {...}}, ...]   # one per rank}

Trainer and local state go through :func:`~pimm_fn.checkpoint.formats.pack.pack` as in the standard
format, so both formats restore exactly the same Python values.

The best model's files: ``model_best.pth`` and its ``.json``, written atomically by the main rank.

With digests (``Saving(digests=True)``) the ``.json`` records the weights
file's SHA-256, hashed as it is written, and :func:`check_best` checks it
wherever the file is read back (``run.test(weights="best")``, a warm start,
``verify``): bytes changed at the same size are refused.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib
import zipfile
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint.errors import CheckpointError, cause, shown, storage_errors, tensor_bytes
from pimm_fn.checkpoint.files import CheckpointInfo, digest, info_from_marker, marker_payload
from pimm_fn.checkpoint.formats.pack import pack, unpack

EXTRA_STATE = "_extra_state"  # torch's suffix for a module's get_extra_state() entry of a state_dict


PLAIN = (bool, int, float, str)  # what an extra-state entry may hold beside None and tensors (weights_only loads it)


def payload(step: int, weights: dict, trainer: dict, locals_by_rank: list[dict], metrics: dict | None = None) -> dict:
    """Build the dict that :func:`write` saves; ``metrics`` go in its marker."""
    return {
        "marker": marker_payload(step, "legacy", len(locals_by_rank), metrics),
        "weights": weights,
        "trainer": _packed(trainer),
        "local": [_packed(local) for local in locals_by_rank],
    }


def write(path: pathlib.Path, content: dict) -> pathlib.Path:
    """Atomically write ``content`` to ``path`` (temp file + ``os.replace``).

    Raises:
        DiskFullError: the disk filled up; the temp file is removed and the previous ``path`` is intact.
    """
    with storage_errors(
        path.parent,
        lambda: tensor_bytes(content),
        path.name,
        "nothing was published: the previous checkpoint is intact and stays the latest",
    ):
        return files.atomic_write(path, lambda f: torch.save(content, f))


def read_info(path: storage.Location) -> CheckpointInfo:
    """Read the marker of a legacy file without reading its tensors.

    Raises:
        CheckpointError: the file does not load with ``weights_only=True`` or
            holds no valid legacy marker.
    """
    content = _load(path, mmap=True, checkpoint=path)
    if not isinstance(content, dict) or "marker" not in content:
        raise CheckpointError(path, path.name, "holds no pimm_fn legacy 'marker' entry: it is not a legacy checkpoint")
    try:
        return info_from_marker(path, content["marker"], "legacy")
    except ValueError as exc:
        raise CheckpointError(path, path.name, f"has an invalid marker ({exc})") from None


def read(path: storage.Location, rank: int) -> tuple[dict, dict, dict | None]:
    """Load ``(weights, trainer, local)``; ``local`` is ``None`` past the saved ranks.

    Raises:
        CheckpointError: the file is damaged (naming it and how), or its
            ``weights`` are not a state_dict (:func:`weights_problem`).
    """
    content = _load(path, mmap=False, checkpoint=path)
    read_info(path)
    try:
        locals_by_rank = content["local"]
        local = _unpacked(locals_by_rank[rank]) if rank < len(locals_by_rank) else None
        trainer = _unpacked(content["trainer"])
    except Exception as exc:  # noqa: BLE001 - overwritten bytes fail in JSON, in unicode, in a lookup
        raise CheckpointError(path, path.name, f"holds trainer state that does not unpack ({cause(exc)})") from None
    weights = content.get("weights")
    problem = weights_problem(weights)
    if problem is not None:
        raise CheckpointError(
            path, path.name, f"has a 'weights' entry that {problem} (written by another program, or altered)"
        )
    return weights, trainer, local


def weights_problem(weights: Any) -> str | None:
    """Why ``weights`` is not a model state_dict as pimm_fn writes one; ``None`` when it is.

    A state_dict maps names (strings) to tensors; a module's extra state
    (a key ending in ``_extra_state``, ``Module.get_extra_state``) may also be
    ``None``, a bool, a number or a string, which ``weights_only`` loads too.

    Example:
        >>> weights_problem({"w": torch.ones(1), "bn._extra_state": 3}) is None
        True
        >>> weights_problem({"w": "x"})
        "maps 'w' to a str where a state_dict holds a tensor"
    """
    if not isinstance(weights, Mapping):
        return f"holds {_a(weights)} where a state_dict (a dict of tensors) is expected"
    for key, value in weights.items():
        if not isinstance(key, str):
            return f"has a key {shown(key, 40)} ({_a(key)}) where a state_dict has names (strings)"
        if isinstance(value, torch.Tensor):
            continue
        if not (key.endswith(EXTRA_STATE) and (value is None or isinstance(value, PLAIN))):
            return f"maps {key!r} to {_a(value)} where a state_dict holds a tensor"
    return None


def checked_weights(weights: Any, checkpoint: storage.Location, file: str) -> dict:
    """``weights`` read from ``file`` of ``checkpoint``, once :func:`weights_problem` finds nothing wrong.

    Raises:
        CheckpointError: naming ``file`` and what it holds instead of a state_dict.
    """
    problem = weights_problem(weights)
    if problem is not None:
        raise CheckpointError(checkpoint, file, f"{problem} (written by another program, or altered)")
    return weights


def _a(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _load(path: storage.Location, *, mmap: bool, checkpoint: storage.Location | None = None) -> Any:
    """``torch.load(path, weights_only=True)``; a failure is a ``ValueError`` saying why, without torch's unsafe advice.

    With ``checkpoint`` (the checkpoint ``path`` belongs to) it is a
    :class:`CheckpointError` naming both, also for a missing file.
    """
    if storage.is_store(path):  # read whole from the store: nothing to map
        return _load_stored(path, checkpoint)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        if checkpoint is None:
            raise
        raise CheckpointError(checkpoint, _relative(path, checkpoint), "is missing") from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        if not zipfile.is_zipfile(path):
            problem = (
                "does not load with torch.load(weights_only=True): it is not a torch file (cut short or overwritten)"
            )
        else:
            problem = f"does not load with torch.load(weights_only=True) ({cause(exc)})"
        if checkpoint is None:
            raise ValueError(f"{path} {problem}") from None
        raise CheckpointError(checkpoint, _relative(path, checkpoint), problem) from None


def _load_stored(path: storage.StorePath, checkpoint: storage.Location | None) -> Any:
    """:func:`_load` of an object on an fsspec store: its bytes, then ``torch.load(weights_only=True)``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if checkpoint is None:
            raise
        raise CheckpointError(checkpoint, _relative(path, checkpoint), "is missing") from None
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bad files
        problem = f"does not load with torch.load(weights_only=True) ({cause(exc)})"
        if checkpoint is None:
            raise ValueError(f"{path} {problem}") from None
        raise CheckpointError(checkpoint, _relative(path, checkpoint), problem) from None


def _relative(path: storage.Location, checkpoint: storage.Location) -> str:
    return path.name if path == checkpoint else path.relative_to(checkpoint).as_posix()


def _packed(obj: Any) -> dict:
    skeleton, tensors = pack(obj)
    return {"skeleton": skeleton, "tensors": tensors}


def _unpacked(entry: dict) -> Any:
    return unpack(entry["skeleton"], entry["tensors"])


def write_best(
    model_dir: str | os.PathLike[str] | storage.StorePath,
    weights: dict,
    *,
    metric: str,
    value: float,
    step: int,
    per_metric: bool = False,
    digests: bool = False,
) -> storage.Location:
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
        raise RuntimeError(
            f"write_best must run on the main rank only (called on rank {dist.rank()}); guard it with dist.is_main()"
        )
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"write_best: 'metric' must be a non-empty str (got {metric!r})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"write_best: 'value' must be a finite number (got {value!r}); a NaN metric never improves")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"write_best: 'step' must be an int >= 0 (got {step!r})")
    root = storage.location(model_dir)
    stem = files.best_stem(metric if per_metric else None)
    record = {"metric": metric, "value": float(value), "step": step}
    save = lambda f: torch.save(weights, f)
    # The weights file is written first: with digests, its digest is in the record before the .json is written.
    write_weights = files.hashed(save, lambda sha256: record.update(sha256=sha256)) if digests else save
    meta = lambda: json.dumps(record, sort_keys=True).encode()
    writes: dict[str, Callable[[BinaryIO], object]] = {
        f"{stem}.pth": write_weights,
        f"{stem}.json": lambda f: f.write(meta()),
    }
    nbytes = lambda: tensor_bytes(weights) + len(meta())
    with storage_errors(root, nbytes, f"{stem}.pth and {stem}.json", f"the previous {stem} is intact"):
        if storage.is_store(root):  # one PUT per object, each atomic: the weights first, as the renames below
            root.mkdir(parents=True, exist_ok=True)  # a missing bucket said as such, never created
            for name, write in writes.items():
                files.durable_write(root / name, write)
            return root / f"{stem}.pth"
        staged = _stage_all(root, writes)
        try:
            for tmp, name in zip(staged, writes):
                os.replace(tmp, root / name)
        except BaseException:
            for tmp in staged:
                tmp.unlink(missing_ok=True)
            raise
    files.fsync_dir(root)
    return root / f"{stem}.pth"


def _stage_all(root: pathlib.Path, writes: dict[str, Callable[[BinaryIO], object]]) -> list[pathlib.Path]:
    """Write each of ``root``'s files ``writes`` names durably under a ``.staging-*`` name (mode by the umask); on failure remove them all (the old files stay)."""
    staged: list[pathlib.Path] = []
    try:
        for name, write in writes.items():
            staged.append(files.staged_write(root / name, write))
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    return staged


def best_record(weights_file: storage.Location) -> dict:
    """What :func:`write_best` recorded beside ``weights_file`` (metric, value, step; its SHA-256 with digests), checked.

    The ``.json`` is untrusted: read as :mod:`pimm_fn.checkpoint.files` reads (a FIFO is
    never waited on), and taken only as the record ``write_best`` writes.

    Raises:
        FileNotFoundError: there is no record beside it.
        OSError: it cannot be read, or is no regular file (``files.NotRegularFileError``).
        ValueError: it is not JSON, or not such a record; the message says what is wrong.
    """
    record = files.read_json(weights_file.with_suffix(".json"))
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
    if isinstance(exc, files.NotRegularFileError):
        return exc.strerror
    return f"is damaged ({cause(exc)})"


def check_best(path: storage.Location) -> None:
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
        advice = (
            f"Restore it from a copy, or use a checkpoint's weights instead: list them with "
            f"`python -m pimm_fn ls {path.parent}` and pass one's path"
        )
        raise CheckpointError(path, path.name, problem, advice)
