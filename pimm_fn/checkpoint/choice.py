"""Which checkpoint a resume reads: the newest that validates and reads back on every rank, agreed.

``resume="auto"`` walks :func:`.candidates.candidates` newest first, as
rank 0 lists them (broadcast once, so every rank walks the same list). A
candidate that does not validate is skipped at once; one that does is read
on every rank (:func:`load_checkpoint`) and the ranks agree on the outcome
with one all-gather: when any rank could not read it, every rank skips it,
with that rank's reason. So no rank loads another step than the others, and
none waits for a rank that gave up. Each skipped checkpoint is said in one
line.

Auto-resume never destroys: when checkpoints are published (``last``,
``iter_<step>``, legacy files, a retired copy; not ``model_best`` nor a
``.staging-*`` directory) and none is usable, every rank raises the same
:class:`NoIntactCheckpointError`, naming each checkpoint and why it was
rejected: starting fresh would have the run's first save replace them. The
ranks agree without waiting: they walk one listing and agree on each read.
A file missing when validated (as a slow NFS mount shows a new file late)
is looked for again a few times, about a second in all
(:data:`RECHECK_S`), before its checkpoint is rejected. Only when
``model_dir`` holds no checkpoint at all does the run start fresh, saying
``no checkpoint in <model_dir>: starting fresh``.

An explicit path is resolved on rank 0 and read on every rank the same way:
a damaged checkpoint raises the same :class:`CheckpointError` on every rank.
Either way, before any rank reads a checkpoint, rank 0 checks the SHA-256
digests its marker records (``loop(saving=Saving(digests=True))``): a file whose bytes
changed at the same size rejects the checkpoint like any other damage.

What was read comes back inside a :class:`Chosen`, a ``CheckpointInfo``
that carries it, so the resume reads nothing twice (the weights file is
memory-mapped: a sharded model that loads its shards instead never reads it).
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Callable

import attrs

from pimm_fn import dist
from . import candidates, storage, validation
from ._api import LoadedCheckpoint, load_checkpoint
from ._discovery import find_checkpoint
from ._marker import CheckpointInfo
from .errors import SHARED, CheckpointError

__all__ = ["Chosen", "NoIntactCheckpointError", "RECHECK_S", "newest_readable", "read_agreed"]

# Pauses before a file missing at validation is looked for again (storage that shows a new file late): 1 s in all.
RECHECK_S = (0.1, 0.2, 0.3, 0.4)


@attrs.frozen
class Chosen(CheckpointInfo):
    """A checkpoint a resume chose, with what this rank read of it (``loaded``)."""

    loaded: LoadedCheckpoint | None = attrs.field(default=None, eq=False, repr=False)


def newest_readable(model_dir: str | os.PathLike, say: Callable[[str], None]) -> Chosen | None:
    """The newest checkpoint under ``model_dir`` that validates and reads back on every rank; ``None`` if there is none.

    Collective in a process group. ``say`` gets one line per checkpoint
    skipped, or the line saying the run starts fresh when there is none.

    Raises:
        NoIntactCheckpointError: on every rank, when checkpoints exist and none is usable.
    """
    listing = dist.run_on_main(lambda: _rechecked(model_dir), shared=SHARED)  # rank 0's listing: every rank walks the same
    if not listing:
        say(f"no checkpoint in {model_dir}: starting fresh")
        return None
    rejected = []
    for candidate in listing:
        error = candidate.error
        if error is None:
            outcome = _read_everywhere(candidate.info)
            if not isinstance(outcome, CheckpointError):
                return _chosen(candidate.info, outcome)
            error = outcome
        step = "step unknown" if candidate.step is None else f"step {candidate.step}"
        say(f"skipped checkpoint {candidate.path} ({step}): {error.file} {error.problem}")
        rejected.append((str(candidate.path), step, error.file, error.problem))
    raise NoIntactCheckpointError(model_dir, tuple(rejected))


class NoIntactCheckpointError(CheckpointError):
    """``resume="auto"`` found checkpoints and none is usable: it refuses to start fresh over them.

    Attributes:
        path: the model directory.
        rejected: ``(checkpoint, "step <n>", file, problem)`` for each, newest first.
        file, problem: the newest one's.
    """

    def __init__(self, model_dir, rejected: tuple):
        self.rejected = tuple(tuple(r) for r in rejected)
        self.path, self.file, self.problem = str(model_dir), self.rejected[0][2], self.rejected[0][3]
        ValueError.__init__(self, self._message())

    def summary(self) -> str:
        return f"no intact checkpoint in {self.path}: {len(self.rejected)} rejected"

    def _message(self) -> str:
        lines = "".join(f"\n  {path} ({step}): {file} {problem}" for path, step, file, problem in self.rejected)
        save_dir = pathlib.PurePath(self.path).parent
        return (
            f"resume='auto' found checkpoints in {self.path} but none is intact, and will not start fresh over "
            f"them (the new run's first save would replace them):{lines}\n"
            f"Repair one (`python -m pimm_fn verify {self.path}` says what is wrong), move them aside "
            f"(mv {self.path} {self.path}.rejected) to start fresh, or pass resume=None with a new save_dir "
            f"(not {str(save_dir)!r})"
        )

    def __reduce__(self):
        return (type(self), (self.path, self.rejected))


def _rechecked(model_dir) -> list:
    """:func:`.candidates.candidates`, listed again after a pause while a file one of them lacks may still appear."""
    listing = candidates.candidates(model_dir)
    for pause in RECHECK_S:
        if not _lacks_a_file(listing):
            break
        time.sleep(pause)
        listing = candidates.candidates(model_dir)
    return listing


def _lacks_a_file(listing) -> bool:
    """Whether a candidate newer than the first usable one was rejected for a file that is not there."""
    for candidate in listing:
        if candidate.error is None:
            return False
        file = pathlib.PurePosixPath(candidate.error.file)
        if file.is_absolute() or ".." in file.parts:
            continue  # a marker naming a path outside its checkpoint: damaged, never looked for
        named = candidate.path / file if candidate.path.is_dir() else candidate.path
        if not (named.exists() if storage.is_store(named) else os.path.lexists(named)):
            return True
    return False


def read_agreed(path: str | os.PathLike) -> Chosen:
    """The checkpoint at ``path`` (as :func:`find_checkpoint` resolves it on rank 0), read on every rank.

    Raises:
        CheckpointError: on every rank, when it is damaged on any (naming the rank).
        FileNotFoundError: on every rank, when rank 0 finds nothing there.
    """
    resolved = dist.run_on_main(lambda: _resolve(path), shared=SHARED)
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


def _changed_bytes(info: CheckpointInfo) -> CheckpointError | None:
    """Why ``info`` fails the SHA-256 digests its marker records (``None``: they match, or none are recorded)."""
    try:
        validation.validate(info.path, digests=True)
    except CheckpointError as exc:
        return exc
    return None


def _chosen(info: CheckpointInfo, loaded: LoadedCheckpoint) -> Chosen:
    return Chosen(info.path, info.step, info.format, info.world_size, loaded=loaded)


def _read_everywhere(info: CheckpointInfo) -> LoadedCheckpoint | CheckpointError:
    """What this rank read of ``info``, or the first failing rank's error, the same on every rank (collective)."""
    changed = dist.run_on_main(lambda: _changed_bytes(info), shared=SHARED)  # rank 0 hashes each file once, before any rank reads one
    if changed is not None:
        return changed
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
