"""Checkpoints another library wrote, resumed through a reader that a plug-in provides.

pimm_fn finds and reads its own checkpoints (:mod:`.choice`). A run resumes
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

import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # for the annotations only
    from . import CheckpointInfo

__all__ = ["Reader", "readers", "recognised"]


@runtime_checkable
class Reader(Protocol):
    """What a plug-in's reader of another checkpoint layout provides (see the module docstring)."""

    name: str

    def recognise(self, path) -> pathlib.Path | None: ...

    def resume_from(self, found: pathlib.Path, model_dir: pathlib.Path | None, *, iters_per_epoch: int | None,
                    say) -> CheckpointInfo: ...


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
    found = {}
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
