"""Standard checkpoints written in the background while training goes on.

``save_checkpoint_async`` does the cheap, collective part at once (the
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
"""

from __future__ import annotations

import os
import pathlib
import threading
import time

from pimm_fn.core import retention

from . import _layout as L
from . import _publish, _retain, _staging, _standard, dist
from ._api import _check_args
from ._layout import CheckpointInfo
from .errors import on_main

__all__ = ["AsyncSave", "prewarm_async_save", "save_checkpoint_async"]

_GROUP = None  # the gloo group background saves use, made once per process group


def _background_group():
    global _GROUP
    if not dist.is_initialized():
        return None
    if _GROUP is None:
        import torch.distributed as td

        _GROUP = td.new_group(backend="gloo")  # collective: every rank reaches its first async save together
    return _GROUP


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
    _check_args(step, "standard", keep_snapshots, weights=weights, trainer=trainer, local=local, sharded=sharded)
    policy = retention.resolve(keep, keep_snapshots, caller="save_checkpoint_async")
    recorded = retention.recordable(metrics) if metrics is not None else None
    root = pathlib.Path(model_dir)
    world = dist.world_size()
    group = _background_group()
    staging = on_main(lambda: _publish.fresh_staging(root, step))
    state = _standard.packed_state(trainer, local)  # non-tensor values are frozen into JSON now
    state.update(sharded or {})
    pending = AsyncSave(step)

    def work(mark_staged) -> CheckpointInfo:
        area = _staging.acquire()
        try:
            staged_state, staged_weights, copy = _stage(area, state, weights if dist.is_main() else None)
            pending._copy = copy  # from now on a thread waiting in wait_staged() helps copying
            copy.run()
            copy.wait()
            mark_staged()
            weights_file = L.weights_write(staging, staged_weights, digest=digests) if dist.is_main() else None
            try:
                _standard.write_state(staging, staged_state, group=group)  # a full disk: DiskFullError on every rank
            except BaseException:
                _publish.discard(staging, weights_file)  # the space comes back; the previous checkpoint stays the latest
                raise
            finally:
                if weights_file is not None:
                    weights_file.join()
        finally:
            _staging.release(area)  # nothing reads the staged copy any more

        def publish() -> CheckpointInfo:
            published = _publish.publish_staged(
                root, staging, step, world, recorded, weights_file=weights_file, digests=digests
            )
            if snapshot:
                _publish.snapshot(root, published, step)
            _retain.retain(root, policy, step)
            return CheckpointInfo(published, step, "standard", world)

        return on_main(publish, group=group)  # rank 0's DiskFullError is raised as itself on every rank

    return pending._start(work)


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
    state = _standard.flat_state(trainer, local)
    layout = _staging.layout_of(state, weights) if dist.is_main() else _staging.layout_of(state)
    return _staging.prewarm(layout, pause_s=pause_s)
