"""Which checkpoint a run resumes from, or none: a fresh start.

``loop(resume=...)`` takes ``None`` (fresh), ``"auto"`` or a path. pimm_fn's
own checkpoints are found and read by ``pimm_fn.checkpoint.choice``. Another
library's layout is resumed only through a reader the run was handed with
its handlers (``pimm_fn.checkpoint.foreign``; ``pimm_fn.compat.HANDLERS``
holds pimm's), and looked for only where pimm_fn's own discovery found
nothing of its own: a run given no reader, or whose ``save_dir`` holds
pimm_fn checkpoints, never looks, and never pays a collective for it.
A fresh start is refused where its first save would replace a checkpoint:
one of ours, one a reader recognises, or a ``last/`` that is no pimm_fn
checkpoint at all (another library's, read or not).
"""

from __future__ import annotations

import pathlib

from pimm_fn import checkpoint, dist
from pimm_fn.checkpoint import candidates, choice, foreign, inspection, storage

__all__ = ["locate"]


def locate(resume, save_dir, *, say=None, iters_per_epoch=None, readers=()):
    """The checkpoint to resume from, read on every rank (``pimm_fn.checkpoint.choice``), or ``None`` for a fresh start.

    ``resume="auto"`` takes the newest checkpoint that validates and reads
    back on every rank, skipping damaged ones with a line each (``say``,
    default: printed by rank 0). It starts fresh only when ``save_dir/model``
    holds no checkpoint, saying ``no checkpoint in <dir>: starting fresh``
    (a mistyped ``save_dir`` shows there); checkpoints that are all damaged
    are refused, never replaced.

    ``readers``: readers of other layouts (``pimm_fn.checkpoint.foreign.readers``
    of the run's handlers). Where pimm_fn's discovery finds nothing of its
    own, rank 0 asks them about ``resume`` (``"auto"``: ``save_dir/model``),
    and a checkpoint one recognises is translated and resumed.
    ``iters_per_epoch``: the run's steps per epoch, handed to the reader
    (pimm's legacy ``model_last.pth`` records none of its own).

    Raises:
        FileExistsError: a fresh start into a ``save_dir`` that holds checkpoints (a reader's included).
        CheckpointError: (on every rank) ``resume=<path>`` names a damaged
            checkpoint, or ``resume="auto"`` found checkpoints and none intact
            (``pimm_fn.checkpoint.choice.NoIntactCheckpointError``, naming each
            and why); nothing under ``save_dir`` was changed.
    """
    say = say or _say
    readers = tuple(readers)
    model_dir = storage.location(save_dir) / "model" if save_dir is not None else None  # a URL: on its store
    if resume is None or resume is False:
        _refuse_checkpoints_in(save_dir, model_dir, readers)
        return None
    if resume == "auto":
        if save_dir is None:
            raise ValueError("resume='auto' needs save_dir= to look for checkpoints in")
        return _newest(model_dir, readers, say, iters_per_epoch)
    return _at(resume, model_dir, readers, say, iters_per_epoch)


def _say(message: str) -> None:
    if dist.is_main():
        print(f"[pimm_fn] {message}", flush=True)


def _refuse_checkpoints_in(save_dir, model_dir, readers) -> None:
    """A fresh start refused where its first save would replace a checkpoint (one look, on rank 0, shared)."""
    if model_dir is not None:
        refusal = dist.run_on_main(lambda: _refusal(save_dir, model_dir, readers))
        if refusal is not None:
            raise FileExistsError(refusal)


def _refusal(save_dir, model_dir: pathlib.Path, readers) -> str | None:
    """Why a fresh run may not start in ``model_dir`` (local), or ``None``.

    It holds a usable checkpoint of ours; or one a reader recognises; or,
    where a save of ours would go (``last/``), a directory that is no
    checkpoint of ours at all: another library's, which the run could not read.
    """
    listing = candidates.candidates(model_dir)
    again = "a fresh run would overwrite them. Pass resume='auto' to continue that run, or choose another save_dir"
    if any(c.info is not None for c in listing):
        return f"save_dir {str(save_dir)!r} already holds checkpoints; {again}"
    found = foreign.recognised(readers, model_dir) if readers and model_dir.is_dir() else None
    if found is not None:
        index, path = found
        return f"save_dir {str(save_dir)!r} already holds {readers[index].name} checkpoints ({path.name}); {again}"
    strangers = [c.path.name for c in listing if c.path.is_dir() and not inspection.is_checkpoint_dir(c.path)]
    if strangers:
        return (f"save_dir {str(save_dir)!r} holds {', '.join(strangers)} in model/, which is not a pimm_fn checkpoint "
                f"(another library's?); a fresh run would overwrite it. Pass the handlers of the plug-in that reads "
                f"it (pimm's: handlers=pimm_fn.compat.HANDLERS) with resume='auto', or choose another save_dir")
    return None


def _newest(model_dir, readers, say, iters_per_epoch):
    """``choice.newest_readable``; where it finds nothing of ours, a checkpoint a reader recognises in ``model_dir``.

    Nothing of ours: no checkpoint at all, or none intact (another layout's
    ``last/`` is a candidate that does not validate as ours).
    """
    if not readers:
        return choice.newest_readable(model_dir, say)
    held: list[str] = []  # its lines, said once we know whether they are true ('starting fresh', 'skipped')
    chosen, refused = None, None
    try:
        chosen = choice.newest_readable(model_dir, held.append)
    except choice.NoIntactCheckpointError as exc:
        refused = exc
    except BaseException:
        _say_all(say, held)
        raise
    if chosen is None:
        found = dist.run_on_main(lambda: foreign.recognised(readers, model_dir))
        if found is not None:
            return _translated(readers, found, model_dir, say, iters_per_epoch)
    _say_all(say, held)
    if refused is not None:
        raise refused
    return chosen


def _at(path, model_dir, readers, say, iters_per_epoch):
    """``choice.read_agreed(path)``; where ``path`` is not one of ours, a checkpoint a reader recognises there."""
    try:
        return choice.read_agreed(path)
    except (FileNotFoundError, checkpoint.CheckpointError):  # raised on every rank alike
        found = dist.run_on_main(lambda: foreign.recognised(readers, path)) if readers else None
        if found is None:
            raise
    return _translated(readers, found, model_dir, say, iters_per_epoch)


def _say_all(say, lines) -> None:
    for line in lines:
        say(line)


def _translated(readers, found, model_dir, say, iters_per_epoch):
    """The checkpoint of ours the reader that recognised ``found`` writes from it (collective)."""
    index, path = found
    return readers[index].resume_from(path, model_dir, iters_per_epoch=iters_per_epoch, say=say)
