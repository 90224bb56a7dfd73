"""Which checkpoint a resume reads: the newest that validates and reads back on every rank, agreed.

``resume="auto"`` walks :func:`.validation.candidates` newest first, as
rank 0 lists them (broadcast once, so every rank walks the same list). A
candidate that does not validate is skipped at once; one that does is read
on every rank (:func:`load_checkpoint`) and the ranks agree on the outcome
with one all-gather: when any rank could not read it, every rank skips it,
with that rank's reason. So no rank loads another step than the others, and
none waits for a rank that gave up. Each skipped checkpoint is said in one
line; when none is usable the run starts fresh, saying so and naming what
it ignored.

An explicit path is resolved on rank 0 and read on every rank the same way:
a damaged checkpoint raises the same :class:`CheckpointError` on every rank.

What was read comes back inside a :class:`Chosen`, a ``CheckpointInfo``
that carries it, so the resume reads nothing twice (the weights file is
memory-mapped: a sharded model that loads its shards instead never reads it).
"""

from __future__ import annotations

import os
from typing import Callable

import attrs

from . import dist, validation
from ._api import LoadedCheckpoint, load_checkpoint
from ._discovery import find_checkpoint
from ._layout import CheckpointInfo
from .errors import CheckpointError, on_main

__all__ = ["Chosen", "newest_readable", "read_agreed"]


@attrs.frozen
class Chosen(CheckpointInfo):
    """A checkpoint a resume chose, with what this rank read of it (``loaded``)."""

    loaded: LoadedCheckpoint | None = attrs.field(default=None, eq=False, repr=False)


def newest_readable(model_dir: str | os.PathLike, say: Callable[[str], None]) -> Chosen | None:
    """The newest checkpoint under ``model_dir`` that validates and reads back on every rank, or ``None``.

    Collective in a process group. ``say`` gets one line per checkpoint
    skipped and, when none is usable but some were found, the line saying
    the run starts fresh.
    """
    listing = on_main(lambda: validation.candidates(model_dir))  # rank 0's listing: every rank walks the same
    ignored = []
    for candidate in listing:
        error = candidate.error
        if error is None:
            outcome = _read_everywhere(candidate.info)
            if not isinstance(outcome, CheckpointError):
                return _chosen(candidate.info, outcome)
            error = outcome
        step = "step unknown" if candidate.step is None else f"step {candidate.step}"
        say(f"skipped checkpoint {candidate.path} ({step}): {error.file} {error.problem}")
        ignored.append(f"{candidate.path.name} ({error.file})")
    if ignored:
        say(f"no usable checkpoint in {model_dir}: ignored {', '.join(ignored)}; starting fresh from step 0")
    return None


def read_agreed(path: str | os.PathLike) -> Chosen:
    """The checkpoint at ``path`` (as :func:`find_checkpoint` resolves it on rank 0), read on every rank.

    Raises:
        CheckpointError: on every rank, when it is damaged on any (naming the rank).
        FileNotFoundError: on every rank, when rank 0 finds nothing there.
    """
    resolved = on_main(lambda: _resolve(path))
    if isinstance(resolved, BaseException):
        raise resolved
    outcome = _read_everywhere(resolved)
    if isinstance(outcome, CheckpointError):
        raise outcome
    return _chosen(resolved, outcome)


def _resolve(path) -> CheckpointInfo | BaseException:
    try:
        return find_checkpoint(path)
    except (FileNotFoundError, CheckpointError) as exc:
        return exc


def _chosen(info: CheckpointInfo, loaded: LoadedCheckpoint) -> Chosen:
    return Chosen(info.path, info.step, info.format, info.world_size, loaded=loaded)


def _read_everywhere(info: CheckpointInfo) -> LoadedCheckpoint | CheckpointError:
    """What this rank read of ``info``, or the first failing rank's error, the same on every rank (collective)."""
    loaded, problem = None, None
    try:
        loaded = load_checkpoint(info)
    except CheckpointError as exc:
        problem = exc
    except Exception as exc:  # noqa: BLE001 - not damage but a bug: still said to every rank, so none waits
        problem = f"{type(exc).__name__}: {exc}"
        unexpected = exc
    problems = dist.all_gather_object(problem)
    failed = [(rank, p) for rank, p in enumerate(problems) if p is not None]
    if not failed:
        return loaded
    rank, first = failed[0]
    if isinstance(first, str):
        if isinstance(problem, str):
            raise unexpected
        raise RuntimeError(f"rank {rank} failed to read the checkpoint {info.path}: {first}")
    if len(problems) == 1:
        return first
    return CheckpointError(first.path, first.file, f"{first.problem} (on rank {rank})")
