"""Saving in the background, as one object a run owns: :class:`BackgroundSaver`.

A run whose hooks save in the background (``save_every(n, async_save=True)``)
opens a :class:`BackgroundSaver`, which holds all that such saves keep
between two steps: the save in flight (one at most), the staging prewarm,
the optimizer hooks that wait for a save's copy and that start the prewarm,
and the gloo process group the saves' collectives run on (made at the first
save, when every rank is there). Closing it when the run ends, or stops on
an error, stops a running prewarm, removes those hooks and, with no save in
flight, destroys that group (the next save makes another); the save in
flight is waited for by :meth:`~BackgroundSaver.wait` (the loop waits before
it closes; after an error, the next ``wait`` tells how the save ended).

Staging memory belongs to the process, not to a run (``_staging.POOL``): a
saver borrows its areas, so a second run of a notebook copies into the
memory the first one readied. :func:`save_checkpoint_async` and
:func:`prewarm_async_save` are the same operations on the process's own
saver, for code that writes its own loop.
"""

from __future__ import annotations

import os
from typing import Any

from pimm_fn import dist

from . import _async, _staging, _standard
from ._async import AsyncSave
from ._marker import CheckpointInfo

__all__ = ["BackgroundSaver", "prewarm_async_save", "save_checkpoint_async"]


class BackgroundSaver:
    """One run's background saving: the save in flight, the prewarm, the optimizer hooks, the process group.

    Attributes:
        pending: the :class:`~._async.AsyncSave` in flight, if any.
        prewarm: the staging :class:`~._staging.Prewarm` of this run once
            started (``False``: asked for, but the state could not be packed).
        arming / gate: the optimizer hooks (anything with ``remove()``)
            that start the prewarm / make a step wait for a save's copy.
        is_open: between :meth:`open` and :meth:`close`.

    Example:
        >>> import tempfile, torch
        >>> saver = BackgroundSaver().open()
        >>> _ = saver.save(tempfile.mkdtemp(), step=1, weights={"w": torch.ones(2)}, trainer={}, local={})
        >>> saver.wait().step
        1
        >>> saver.close()
    """

    def __init__(self, pool: _staging.StagingPool | None = None):
        self.pool = pool if pool is not None else _staging.POOL
        self.pending: AsyncSave | None = None
        self.prewarm: _staging.Prewarm | bool | None = None
        self.arming: Any = None
        self.gate: Any = None
        self.is_open = False
        self._group = None

    def open(self) -> BackgroundSaver:
        """Begin (or, after :meth:`close`, resume) this run's background saving; returns the saver."""
        self.is_open = True
        return self

    def save(self, model_dir: str | os.PathLike, **save: Any) -> AsyncSave:
        """Start a save (``save_checkpoint_async``'s arguments) once the one in flight is published: never two."""
        self.wait()
        self.open()
        self.pending = self.begin(model_dir, **save)
        return self.pending

    def begin(self, model_dir: str | os.PathLike, *, step: int, weights: dict, trainer: dict, local: dict,
              snapshot: bool = False, keep_snapshots: int | None = None, sharded: dict | None = None, keep=None,
              metrics: dict | None = None, digests: bool = False) -> AsyncSave:
        """Start a save on this saver's memory and group, not waiting for nor keeping track of any other."""
        return _async.start(
            model_dir, pool=self.pool, group=self._background_group(), step=step, weights=weights, trainer=trainer,
            local=local, snapshot=snapshot, keep_snapshots=keep_snapshots, sharded=sharded, keep=keep,
            metrics=metrics, digests=digests,
        )

    def warm(self, *, weights: dict, trainer: dict, local: dict, pause_s: float = 0.0) -> _staging.Prewarm:
        """Ready the memory a later save of state shaped like this copies into (see :func:`prewarm_async_save`)."""
        state = _standard.flat_state(trainer, local)
        layout = _staging.layout_of(state, weights) if dist.is_main() else _staging.layout_of(state)
        return self.pool.prewarm(layout, pause_s=pause_s)

    def wait(self) -> CheckpointInfo | None:
        """Block until the save in flight (if any) is published; returns it, or raises what failed."""
        pending, self.pending = self.pending, None
        return pending.wait() if pending is not None else None

    def wait_staged(self) -> None:
        """Block until the save in flight (if any) has copied what it saves: its sources may change after."""
        if self.pending is not None and not self.pending.staged:
            self.pending.wait_staged()

    def close(self) -> None:
        """The run ended or stopped: remove the optimizer hooks and stop a running prewarm (its memory is kept).

        A save in flight goes on; its copy is finished first, as no hook is
        left to hold the next optimizer step back (:meth:`wait` says how it ended).
        With none in flight, the saver's process group is destroyed.
        """
        self.wait_staged()
        for hooks in (self.arming, self.gate):
            if hooks is not None:
                hooks.remove()
        self.arming = self.gate = None
        if isinstance(self.prewarm, _staging.Prewarm) and not self.prewarm.done():
            self.prewarm.stop()
        if self.pending is None:  # no save uses the group: destroyed (its threads joined), made anew by the next save
            group, self._group = self._group, None
            dist.destroy_group(group)
        self.is_open = False

    def _background_group(self):
        """The gloo group of this saver's collectives, made at its first save (collective: every rank is there)."""
        if self._group is None:
            self._group = dist.new_gloo_group()
        return self._group

    def __repr__(self):
        return f"<BackgroundSaver {'open' if self.is_open else 'closed'}, pending={self.pending!r}>"


_PROCESS = BackgroundSaver()  # the process's own saver: the functions below, for code that writes its own loop


def save_checkpoint_async(
    model_dir: str | os.PathLike,
    *,
    step: int,
    weights: dict,
    trainer: dict,
    local: dict,
    snapshot: bool = False,
    keep_snapshots: int | None = None,
    sharded: dict | None = None,
    keep=None,
    metrics: dict | None = None,
    digests: bool = False,
    saver: BackgroundSaver | None = None,
) -> AsyncSave:
    """Start a standard-format save that stages, writes and publishes in the background.

    Collective like ``save_checkpoint``: every rank calls it, in the same
    order. The caller must not change ``weights`` or ``trainer`` tensors in
    place before ``wait_staged()`` returns, nor start another save before
    ``wait()`` returned.

    Args:
        model_dir, step, weights, trainer, local, snapshot, keep_snapshots, sharded, keep, metrics, digests:
            as for :func:`save_checkpoint` (standard format only). Shards
            (DTensors) are copied into fresh memory, not the reused staging area.
        saver: the :class:`BackgroundSaver` whose process group the save's
            collectives use (default: the process's own).

    Returns:
        An :class:`AsyncSave`; ``wait()`` gives the published ``CheckpointInfo``,
        or raises what failed: a full disk as ``DiskFullError`` on every rank,
        its staging directory removed and the previous checkpoint the latest.

    Example:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp()
        >>> pending = save_checkpoint_async(d, step=2, weights={"w": torch.ones(2)},
        ...                                 trainer={"lr": 0.1}, local={})
        >>> pending.wait().step
        2
    """
    return (saver if saver is not None else _PROCESS).begin(
        model_dir, step=step, weights=weights, trainer=trainer, local=local, snapshot=snapshot,
        keep_snapshots=keep_snapshots, sharded=sharded, keep=keep, metrics=metrics, digests=digests,
    )


def prewarm_async_save(*, weights: dict, trainer: dict, local: dict, pause_s: float = 0.0) -> _staging.Prewarm:
    """Ready, in the background, the memory a later async save of state shaped like this copies into.

    Not collective, and reads no tensor's values: only keys, shapes and
    dtypes, taken now, so the caller may go on changing the tensors. A
    background thread allocates the process's staging tensors and writes
    every page, so the first :func:`save_checkpoint_async` of the process
    finds them ready instead of faulting fresh memory in while the training
    runs beside it. A save that starts before the prewarm ends takes over
    what it readied (see :mod:`._staging`).

    Args:
        weights, trainer, local: as the later save will pass them (values
            may differ; keys, shapes and dtypes should not).
        pause_s: seconds to sleep after each chunk written (tests).

    Returns:
        The running :class:`~._staging.Prewarm` (``wait()`` blocks until it ended).

    Example:
        >>> import torch
        >>> prewarm_async_save(weights={"w": torch.ones(4)}, trainer={}, local={}).wait().finished
        True
    """
    return _PROCESS.warm(weights=weights, trainer=trainer, local=local, pause_s=pause_s)
