"""The entries of a model_dir, named by what they are: checkpoints, best-model files, unfinished saves."""

from __future__ import annotations

import pathlib
import re

import attrs

from pimm_fn.checkpoint import _layout as L
from pimm_fn.checkpoint.errors import CheckpointError, cause
from pimm_fn.cli import NOT_FOUND, Failure

__all__ = ["Entry", "entries", "entry_of", "model_dir_of", "is_checkpoint_dir", "is_best_file", "reason"]

# The order ``ls`` lists kinds in.
KINDS = ("checkpoint", "best", "retired", "unfinished")


@attrs.frozen
class Entry:
    """One entry of a model_dir.

    Attributes:
        path: where it is.
        kind: ``"checkpoint"`` (``last``, ``iter_<step>``, either format),
            ``"best"`` (``model_best*.pth``), ``"retired"`` (the previous
            ``last`` during a publish) or ``"unfinished"`` (``.staging-*``:
            a save in progress or interrupted, or a snapshot being removed).
        step: the step its name says, if any.
    """

    path: pathlib.Path
    kind: str
    step: int | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def format(self) -> str:
        if self.kind == "best":
            return "weights"
        return "legacy" if self.path.suffix == ".pth" else "standard"


def is_checkpoint_dir(path: pathlib.Path) -> bool:
    """A directory laid out as a standard checkpoint (complete or not)."""
    return path.is_dir() and any((path / name).exists() for name in (L.MARKER, L.TRAINER, L.WEIGHTS))


def is_best_file(path: pathlib.Path) -> bool:
    """A ``model_best.pth`` or ``model_best_<metric>.pth`` file."""
    return path.is_file() and path.suffix == ".pth" and path.stem.startswith(L.best_stem())


def model_dir_of(path: pathlib.Path, command: str) -> pathlib.Path:
    """The model_dir that ``path`` names: itself, or ``path/model`` for a save_dir.

    Raises:
        Failure: (not found) ``path`` is not a directory.
    """
    if not path.exists():
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a save_dir, a model_dir or a checkpoint")
    if not path.is_dir():
        raise Failure(NOT_FOUND, f"{str(path)!r} is a file; {command} takes a save_dir or model_dir")
    return path / "model" if (path / "model").is_dir() else path


def reason(exc: BaseException) -> str:
    """Why reading a checkpoint failed, in one line (DCP's wrapped failure unwrapped)."""
    return exc.summary() if isinstance(exc, CheckpointError) else cause(exc)


def entry_of(path: pathlib.Path) -> Entry | None:
    """What ``path`` is by its name, or ``None`` for a name no checkpoint, best file or save in progress has."""
    name = path.name
    if name.startswith(L.STAGING):
        return Entry(path, "unfinished", _trailing_step(name))
    if name.startswith(L.RETIRED):
        return Entry(path, "retired", _trailing_step(name))
    if is_best_file(path):
        return Entry(path, "best")
    if name in (L.LAST, L.LEGACY_LAST):
        return Entry(path, "checkpoint")
    match = (L.ITER_DIR if path.is_dir() else L.ITER_FILE).match(name)
    return Entry(path, "checkpoint", int(match.group(1))) if match else None


def _trailing_step(name: str) -> int | None:
    """The step in ``.staging-last-<step>``, ``.staging-removed-iter_<step>``, ``.retired-last-<step>``."""
    match = re.search(r"(?:last-|iter_)(\d+)(?:\.pth)?$", name)
    return int(match.group(1)) if match else None


def entries(model_dir: pathlib.Path) -> list[Entry]:
    """The entries of ``model_dir`` by kind (checkpoints first), newest first within a kind."""
    found = [e for e in map(entry_of, model_dir.iterdir()) if e is not None]
    return sorted(found, key=lambda e: (KINDS.index(e.kind), e.step is not None, -(e.step or 0), e.name))
