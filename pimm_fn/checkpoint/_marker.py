"""What a checkpoint's ``COMPLETE`` marker records, and the ``CheckpointInfo`` read back from it.

The marker (written last, by :func:`._safe_writes.write_marker`) holds the
step, the format, the world size and a version; legacy one-file
checkpoints embed the same payload. :func:`info_from_marker` checks one
and names what is wrong: a marker that does not check out is a damaged
checkpoint (:mod:`.validation`).
"""

from __future__ import annotations

import pathlib

import attrs

from . import storage

__all__ = ["CheckpointInfo", "marker_payload", "info_from_marker", "FORMATS", "VERSION", "SAVED_FOR"]

FORMATS = ("standard", "legacy")
VERSION = 1
SAVED_FOR = "__saved_for__"  # save_checkpoint(saved_for=) travels to the marker among the metrics, then is its own field


def _non_negative(_inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be an int >= 0 (got {value!r})")


def _positive(_inst, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be an int >= 1 (got {value!r})")


def _known_format(_inst, attribute, value) -> None:
    if value not in FORMATS:
        raise ValueError(f"CheckpointInfo.{attribute.name} must be one of {FORMATS} (got {value!r})")


@attrs.frozen
class CheckpointInfo:
    """Where a complete checkpoint lives and what it holds.

    Attributes:
        path: the checkpoint directory (standard) or file (legacy).
        step: the global step it was saved at.
        format: ``"standard"`` or ``"legacy"``.
        world_size: how many ranks wrote it (their rank-local parts).

    Example:
        >>> CheckpointInfo("runs/x/model/last", 10, "standard", 2).path.name
        'last'
    """

    path: pathlib.Path = attrs.field(converter=storage.location)  # a StorePath on an fsspec store
    step: int = attrs.field(validator=_non_negative)
    format: str = attrs.field(validator=_known_format)
    world_size: int = attrs.field(validator=_positive)


def marker_payload(step: int, fmt: str, world_size: int, metrics: dict | None = None) -> dict:
    """The marker's content; also embedded in legacy files.

    ``metrics``: the run's finite metrics at the save, kept for retention
    policies (``keep_best``) and ``python -m pimm_fn ls`` to read cheaply.
    Under ``SAVED_FOR`` they may carry why a save no hook asked for was made
    (``"SIGTERM"``, ``"max_time"``: a preemption save), recorded as the
    marker's own ``saved_for`` field.
    """
    payload = {"step": step, "format": fmt, "world_size": world_size, "version": VERSION}
    if metrics is not None:
        metrics = dict(metrics)
        saved_for = metrics.pop(SAVED_FOR, None)
        payload["metrics"] = metrics
        if saved_for is not None:
            payload["saved_for"] = str(saved_for)
    return payload


def info_from_marker(path: pathlib.Path, payload: object, fmt: str) -> CheckpointInfo:
    """Validate a marker payload; raise ``ValueError`` saying what is wrong."""
    if not isinstance(payload, dict):
        raise ValueError(f"marker must be a JSON object, got {type(payload).__name__}")
    if payload.get("version") != VERSION or payload.get("format") != fmt:
        raise ValueError(
            f"marker must have version={VERSION}, format={fmt!r} "
            f"(got version={payload.get('version')!r}, format={payload.get('format')!r})"
        )
    try:
        return CheckpointInfo(path, payload.get("step"), fmt, payload.get("world_size"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"marker is invalid: {exc}") from None
