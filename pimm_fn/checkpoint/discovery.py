"""Finding the checkpoint to read: candidates examined and ranked, the newest usable agreed by every rank, another library's through a plug-in.

Which entries of a model_dir count, and in which order, is
:func:`pimm_fn.checkpoint.discovery.candidates`: ``last/``, ``iter_<step>/``, leftover
``.retired-*/`` directories and the legacy ``last.pth`` / ``iter_<step>.pth``
files, highest step first (on a tie ``last`` beats a snapshot, which beats a
retired copy: they hold the same data when their steps agree), each valid
only when :func:`.validation.validate` says so; ``.staging-*`` entries are
never read.

The entries of a ``model_dir`` that could be resumed from, each examined and ranked: what discovery walks.

``candidates`` lists every checkpoint under a ``model_dir``, usable or
not, newest first; each is checked by :mod:`.validation` (its marker and
file sizes, no digests) and its error kept, so a caller can say why a
newer one was passed over. Local, no collectives: :mod:`pimm_fn.checkpoint.discovery` agrees
across ranks on which one to use.

Which checkpoint a resume reads: the newest that validates and reads back on every rank, agreed.

``resume="auto"`` walks :func:`pimm_fn.checkpoint.discovery.candidates` newest first, as
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

Checkpoints another library wrote, resumed through a reader that a plug-in provides.

pimm_fn finds and reads its own checkpoints (:mod:`pimm_fn.checkpoint.discovery`). A run resumes
from another layout (pimm's ``last/`` or ``model_last.pth``) only when it
is handed a *reader* for that layout: an object with

``name``
    the layout's name, said in messages (``"pimm"``).
``recognise(path) -> pathlib.Path | None``
    the foreign checkpoint ``path`` names (a checkpoint, or a ``save_dir`` /
    ``model_dir`` holding one), else ``None``. Local and cheap, no
    collective: the resume calls it on rank 0 alone, and only where pimm_fn's
    own discovery found nothing of its own.
``resume_from(found, model_dir, *, iters_per_epoch, say) -> CheckpointInfo``
    ``found`` translated into a pimm_fn checkpoint, which the run then
    resumes as its own. Collective: every rank calls it. ``model_dir`` is
    the run's (``None`` without a ``save_dir``), ``iters_per_epoch`` the run's
    steps per epoch, ``say`` the run's console line.

A reader travels with the handlers its plug-in provides: a handler passed
to ``loop(handlers=...)`` that has these three is one (``pimm_fn.compat.HANDLERS``
holds pimm's, its ``LoadWeights`` handler). Nothing is registered globally,
so a run given no reader never looks for another layout.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

import attrs

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage, validation
from pimm_fn.checkpoint.errors import SHARED, CheckpointError, NoIntactCheckpointError
from pimm_fn.checkpoint.files import CheckpointInfo
from pimm_fn.checkpoint.formats import one_file
from pimm_fn.checkpoint.saving import LoadedCheckpoint, load_checkpoint
from pimm_fn.checkpoint.validation import check_files, read_marker

__all__ = [
    "Candidate",
    "candidates",
    "Chosen",
    "RECHECK_S",
    "newest_readable",
    "read_agreed",
    "Reader",
    "readers",
    "recognised",
]


@attrs.frozen
class Candidate:
    """One entry of a model_dir that could be resumed from: usable (``info``) or not (``error``).

    Attributes:
        path: the checkpoint directory or legacy file.
        step: its step: from the marker, else from the name (``iter_<step>``); ``None`` when unknown.
        info: the checkpoint, when it validates.
        error: why it does not, otherwise.
        priority: how it ranks among entries of one step: 2 ``last``, 1 a snapshot, 0 a retired copy.
    """

    path: storage.Location
    step: int | None
    info: CheckpointInfo | None = None
    error: CheckpointError | None = None
    priority: int = 0


def candidates(model_dir: str | os.PathLike) -> list[Candidate]:
    """Every checkpoint under ``model_dir``, usable or not, newest first (local, no collectives).

    Newest means the highest step; a damaged ``last`` whose step is unknown
    counts as the newest. On a tie ``last`` beats a snapshot, which beats a
    retired copy, and the standard format beats the legacy one.
    ``.staging-*`` entries are never looked at, nor retired copies whose
    marker is gone (a deletion under way), nor, on an fsspec store, any
    directory without a marker (being written or deleted: the marker commits).
    """
    root = storage.location(model_dir)
    if not root.is_dir():
        return []
    found = [c for c in map(_examine, root.iterdir()) if c is not None]
    key = lambda c: (float("inf") if c.step is None else c.step, c.priority, c.path.is_dir(), c.path.name)
    return sorted(found, key=key, reverse=True)


def _examine(entry: storage.Location) -> Candidate | None:
    priority = _priority(entry)
    if priority is None:
        return None
    if not entry.is_dir():
        try:
            info = one_file.read_info(entry)
        except CheckpointError as exc:
            return Candidate(entry, _named_step(entry), error=exc, priority=priority)
        return Candidate(entry, info.step, info, priority=priority)
    try:
        info, payload = read_marker(entry)
    except CheckpointError as exc:
        if storage.is_store(entry) and not (entry / files.MARKER).exists():
            return None  # on a store the marker commits: without it, being written or deleted
        return None if priority == 0 else Candidate(entry, _named_step(entry), error=exc, priority=priority)
    try:
        check_files(entry, payload, False)
    except CheckpointError as exc:
        return Candidate(entry, info.step, error=exc, priority=priority)
    return Candidate(entry, info.step, info, priority=priority)


def _priority(entry: storage.Location) -> int | None:
    name = entry.name
    if name.startswith(files.STAGING):
        return None
    if entry.is_dir():
        if name == files.LAST or (storage.is_store(entry) and files.STORE_LAST.match(name)):
            return 2
        if files.ITER_DIR.match(name):
            return 1
        return 0 if name.startswith(files.RETIRED) else None
    if name == files.LEGACY_LAST:
        return 2
    return 1 if files.ITER_FILE.match(name) else None


def _named_step(entry: storage.Location) -> int | None:
    match = (files.ITER_DIR if entry.is_dir() else files.ITER_FILE).match(entry.name)
    return int(match.group(1)) if match else None


_MODEL = "model"


def discover(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest usable checkpoint under ``model_dir`` (local, no collectives)."""
    return next((c.info for c in candidates(model_dir) if c.info is not None), None)


def latest_checkpoint(model_dir: str | os.PathLike) -> CheckpointInfo | None:
    """The newest usable checkpoint under ``model_dir``, agreed by all ranks.

    In a process group rank 0 looks and broadcasts its answer, so every rank
    resumes from the same checkpoint even if file listings lag on some.

    Args:
        model_dir: the checkpoint root (``save_dir/"model"``).

    Returns:
        The checkpoint's info, or ``None`` when there is none.

    Example:
        >>> latest_checkpoint("/nonexistent/model") is None
        True
    """
    return dist.run_on_main(lambda: discover(model_dir))


def find_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Resolve a user-given path to a usable checkpoint (local, no collectives).

    Args:
        path: a checkpoint directory (``.../last``, ``.../iter_100``), a legacy
            file (``last.pth``), a ``model_dir``, or a ``save_dir`` holding
            ``model/``; the latter two resolve to their newest usable checkpoint.

    Returns:
        The checkpoint's info.

    Raises:
        FileNotFoundError: ``path`` does not exist, or holds no checkpoint.
        CheckpointError: (a ``ValueError``) ``path`` is a checkpoint that is
            incomplete or damaged, or a model_dir whose checkpoints all are
            (naming the newest, its damaged file, and what to do).
    """
    p = storage.location(path)
    expected = "a checkpoint directory with a COMPLETE marker, a legacy .pth file, or a save_dir/model_dir"
    if not p.exists():
        raise FileNotFoundError(f"find_checkpoint: {str(p)!r} does not exist; expected {expected}")
    named = p.name == files.LAST or files.ITER_DIR.match(p.name) or p.name.startswith(files.RETIRED)
    if p.is_file() or named or any((p / name).exists() for name in (files.MARKER, files.TRAINER, files.WEIGHTS)):
        return validation.validate(p)
    model_dir = p / _MODEL if (p / _MODEL).is_dir() else p
    found = candidates(model_dir)
    usable = next((c.info for c in found if c.info is not None), None)
    if usable is not None:
        return usable
    if found:
        assert found[0].error is not None  # a candidate that is not usable holds why
        raise found[0].error
    raise FileNotFoundError(f"find_checkpoint: no complete checkpoint under {str(model_dir)!r}; expected {expected}")


def rolling_checkpoint(
    model_dir: str | os.PathLike, step: int, format: str = "standard"
) -> pathlib.Path | storage.StorePath:
    """Where the rolling checkpoint of ``step`` lives under ``model_dir``: the name a line should show.

    ``last/`` (``last.pth`` in the legacy format) on a file system; on an
    fsspec store, where a checkpoint is written under its final name, the
    committed ``last-<step>-<token>/`` (``model_dir/last`` only if none is
    listed, as a hint of where to look). Local: no collectives.
    """
    model_dir = storage.location(model_dir)
    if storage.is_store(model_dir):
        for entry in model_dir.iterdir():  # [] where the store has no such directory
            named = files.STORE_LAST.match(entry.name)
            if named and int(named.group(1)) == step and (entry / files.MARKER).exists():
                return entry
    return model_dir / (files.LAST if format == "standard" else files.LEGACY_LAST)


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
    listing = dist.run_on_main(
        lambda: _rechecked(model_dir), shared=SHARED
    )  # rank 0's listing: every rank walks the same
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


def _rechecked(model_dir) -> list:
    """:func:`pimm_fn.checkpoint.discovery.candidates`, listed again after a pause while a file one of them lacks may still appear."""
    listing = candidates(model_dir)
    for pause in RECHECK_S:
        if not _lacks_a_file(listing):
            break
        time.sleep(pause)
        listing = candidates(model_dir)
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
    changed = dist.run_on_main(
        lambda: _changed_bytes(info), shared=SHARED
    )  # rank 0 hashes each file once, before any rank reads one
    if changed is not None:
        return changed
    loaded: LoadedCheckpoint | None = None
    problem: CheckpointError | str | None = None
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
        assert loaded is not None  # this rank read it: no problem here either
        return loaded
    rank, first = failed[0]
    if isinstance(first, str):
        if isinstance(problem, str):
            raise unexpected
        raise RuntimeError(f"rank {rank} failed to read the checkpoint {info.path}: {first}")
    if len(problems) == 1:
        return first
    return CheckpointError(first.path, first.file, f"{first.problem} (on rank {rank})")


if TYPE_CHECKING:  # for the annotations only
    from pimm_fn.checkpoint.files import CheckpointInfo


@runtime_checkable
class Reader(Protocol):
    """What a plug-in's reader of another checkpoint layout provides (see the module docstring)."""

    name: str

    def recognise(self, path) -> pathlib.Path | None: ...

    def resume_from(
        self, found: pathlib.Path, model_dir: pathlib.Path | None, *, iters_per_epoch: int | None, say
    ) -> CheckpointInfo: ...


def readers(handlers: Iterable) -> tuple:
    """The readers among ``handlers`` (the values of ``loop(handlers=...)``), each once, in order.

    >>> class Pimm:
    ...     name = "pimm"
    ...     def recognise(self, path): return None
    ...     def resume_from(self, found, model_dir, *, iters_per_epoch, say): ...
    ...     def __call__(self, effect, state, ctx): return ()
    >>> reader = Pimm()
    >>> readers([print, reader, reader]) == (reader,)
    True
    """
    found: dict[int, Reader] = {}
    for handler in handlers:
        if isinstance(handler, Reader) and isinstance(getattr(handler, "name", None), str):
            found.setdefault(id(handler), handler)
    return tuple(found.values())


def recognised(found_readers: tuple, path) -> tuple[int, pathlib.Path] | None:
    """``(index of the reader, the foreign checkpoint)`` for the first reader recognising ``path``; ``None`` if none.

    Local: call it on one rank and share the answer (``pimm_fn.dist.run_on_main``).
    """
    for index, reader in enumerate(found_readers):
        found = reader.recognise(path)
        if found is not None:
            return index, pathlib.Path(found)
    return None
