"""The entries of a model_dir, named by what they are: checkpoints, best-model files, unfinished saves."""

from __future__ import annotations

import pathlib

import attrs

from pimm_fn.checkpoint import inspection
from pimm_fn.checkpoint.errors import CheckpointError, cause
from pimm_fn.checkpoint.inspection import is_best_file, is_checkpoint_dir
from pimm_fn.cli import DAMAGED, NOT_FOUND, Failure

__all__ = ["Entry", "entries", "entry_of", "model_dir_of", "is_checkpoint_dir", "is_best_file", "reason",
           "some_damaged"]

# The order ``ls`` lists kinds in.
KINDS = ("checkpoint", "best", "retired", "unfinished", "set aside")


@attrs.frozen
class Entry:
    """One entry of a model_dir.

    Attributes:
        path: where it is.
        kind: ``"checkpoint"`` (``last``, ``iter_<step>``, either format),
            ``"best"`` (``model_best*.pth``), ``"retired"`` (the previous
            ``last`` during a publish), ``"unfinished"`` (``.staging-*``:
            a save in progress or interrupted, or a snapshot being removed)
            or ``"set aside"`` (``damaged-*``: kept by a save that found it damaged).
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


def some_damaged(names: list[str], total: int) -> Failure:
    """A listing's failure (exit 1) when some of its ``total`` entries, ``names``, are damaged or incomplete."""
    return Failure(DAMAGED, f"{len(names)} of {total} damaged or incomplete: {', '.join(names)}")


def entry_of(path: pathlib.Path) -> Entry | None:
    """What ``path`` is by its name, or ``None`` for a name no checkpoint, best file or save in progress has."""
    found = inspection.kind_of(path)
    return Entry(path, *found) if found is not None else None


def entries(model_dir: pathlib.Path) -> list[Entry]:
    """The entries of ``model_dir`` by kind (checkpoints first), newest first within a kind."""
    found = [e for e in map(entry_of, model_dir.iterdir()) if e is not None]
    return sorted(found, key=lambda e: (KINDS.index(e.kind), e.step is not None, -(e.step or 0), e.name))
