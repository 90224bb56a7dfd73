"""One standard checkpoint written in the background while training goes on.

:func:`start` does the cheap, collective part at once (the
staging directory, packing, the agreement check), then a worker thread:

1. *stages*: copies every tensor into a reused CPU staging area (see
   :mod:`._staging`: no allocation or page fault after the first save); the
   training may run its next forward and backward meanwhile, but must not
   change parameters or optimizer state before :meth:`AsyncSave.wait_staged`
   returns (the loop waits right before ``optimizer.step()``);
2. *writes* the copy: the DCP trainer directory (every rank) and, at the
   same time on a second thread of the main rank, the weights file;
3. *publishes* on the main rank: marker, rename to ``last/``, snapshot,
   pruning; exactly the synchronous save's steps, after the write completed.

A crash at any point before the rename leaves only a ``.staging-*``
directory, which discovery ignores: the previous checkpoint stays the
latest. In a process group the worker's collectives run on a dedicated gloo
group, so they never interleave with the training's own collectives.

This module is the mechanism; :mod:`.background` is the API: the
:class:`~.background.BackgroundSaver` a run owns, ``save_checkpoint_async``
and ``prewarm_async_save``.
"""

from __future__ import annotations

import os
import threading
import time

from pimm_fn import dist
from pimm_fn.core import retention

from . import _safe_writes as W
from . import _publish, _retain, _staging, _standard, storage
from ._api import _check_args
from ._marker import CheckpointInfo
from .errors import SHARED

__all__ = ["AsyncSave", "start"]


def _stage(area: _staging.StagingArea, state: dict, weights: dict | None):
    """``(staged state, staged weights or None, copy)``: ``area``'s tensors, filled once ``copy`` is done."""
    if weights is None:
        (staged_state,), copy = area.prepare(state)
        return staged_state, None, copy
    (staged_state, staged_weights), copy = area.prepare(state, weights)
    return staged_state, staged_weights, copy


class AsyncSave:
    """A checkpoint being staged, written and published by a worker thread.

    Attributes:
        step: the global step being saved.
        requested_at: ``time.perf_counter()`` when the save was requested.
        staged_at / done_at: when staging / the whole save finished (or None).
        waited_s: seconds callers spent blocked in ``wait_staged``/``wait``.
    """

    def __init__(self, step: int):
        self.step = step
        self.requested_at = time.perf_counter()
        self.staged_at: float | None = None
        self.done_at: float | None = None
        self.waited_s = 0.0
        self._staged = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._info: CheckpointInfo | None = None
        self._thread: threading.Thread | None = None
        self._copy = None  # the staging copy, once the worker has prepared it

    def _start(self, work) -> "AsyncSave":
        self._thread = threading.Thread(target=self._run, args=(work,), name=f"pimm_fn-save-{self.step}", daemon=True)
        self._thread.start()
        return self

    def _run(self, work) -> None:
        try:
            self._info = work(self._mark_staged)
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc
        finally:
            self._mark_staged()
            self._copy = None  # the staged tensors and their sources are the pool's and the caller's again
            self.done_at = time.perf_counter()
            self._done.set()

    def _mark_staged(self) -> None:
        if not self._staged.is_set():
            self.staged_at = time.perf_counter()
            self._staged.set()

    @property
    def staged(self) -> bool:
        """True once every tensor was copied: parameters may change."""
        return self._staged.is_set()

    def done(self) -> bool:
        """True once the checkpoint is published (or the save failed)."""
        return self._done.is_set()

    def wait_staged(self) -> None:
        """Block until staging finished; parameters may change afterwards.

        Rather than idle, the caller copies what the worker has not started.
        """
        if not self._staged.is_set():
            t = time.perf_counter()
            copy = self._copy
            if copy is not None:
                copy.run()  # errors surface through the worker, in wait()
            self._staged.wait()
            self.waited_s += time.perf_counter() - t
        if self._error is not None and self._done.is_set():
            raise self._error

    def wait(self) -> CheckpointInfo:
        """Block until the checkpoint is published; returns it, or raises the save's error."""
        if not self._done.is_set():
            t = time.perf_counter()
            self._done.wait()
            self.waited_s += time.perf_counter() - t
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._info

    def __repr__(self):
        status = "done" if self.done() else "staged" if self.staged else "staging"
        return f"<AsyncSave step={self.step} {status}>"


def start(
    model_dir: str | os.PathLike, *, pool: _staging.StagingPool, group, step: int, weights: dict, trainer: dict,
    local: dict, snapshot: bool, keep_snapshots: int | None, sharded: dict | None, keep, metrics: dict | None,
    digests: bool,
) -> AsyncSave:
    """Start a save as :func:`.background.save_checkpoint_async` says: staging into ``pool``, collectives on ``group``."""
    _check_args(step, "standard", keep_snapshots, weights=weights, trainer=trainer, local=local, sharded=sharded)
    policy = retention.resolve(keep, keep_snapshots, caller="save_checkpoint_async")
    recorded = retention.recordable(metrics) if metrics is not None else None
    root = storage.location(model_dir)
    world = dist.world_size()
    staging = dist.run_on_main(lambda: _publish.fresh_staging(root, step), shared=SHARED)
    state = _standard.packed_state(trainer, local)  # non-tensor values are frozen into JSON now
    state.update(sharded or {})
    pending = AsyncSave(step)

    def work(mark_staged) -> CheckpointInfo:
        area = pool.acquire()
        try:
            staged_state, staged_weights, copy = _stage(area, state, weights if dist.is_main() else None)
            pending._copy = copy  # from now on a thread waiting in wait_staged() helps copying
            copy.run()
            copy.wait()
            mark_staged()
            weights_file = W.weights_write(staging, staged_weights, digest=digests) if dist.is_main() else None
            try:
                _standard.write_state(staging, staged_state, group=group)  # a full disk: DiskFullError on every rank
            except BaseException:
                _publish.discard(staging, weights_file)  # the space comes back; the previous checkpoint stays the latest
                raise
            finally:
                if weights_file is not None:
                    weights_file.join()
        finally:
            pool.release(area)  # nothing reads the staged copy any more

        def publish() -> CheckpointInfo:
            published = _publish.publish_staged(
                root, staging, step, world, recorded, weights_file=weights_file, digests=digests
            )
            if snapshot:
                _publish.snapshot(root, published, step)
            _retain.retain(root, policy, step)
            return CheckpointInfo(published, step, "standard", world)

        return dist.run_on_main(publish, group=group, shared=SHARED)  # rank 0's DiskFullError is raised as itself on every rank

    return pending._start(work)
