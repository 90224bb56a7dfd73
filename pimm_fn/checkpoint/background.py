"""Saving in the background: a run's ``BackgroundSaver``, its one save in flight, and the reusable CPU memory it copies into.

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

Staging memory belongs to the process, not to a run (``pimm_fn.checkpoint.background.POOL``): a
saver borrows its areas, so a second run of a notebook copies into the
memory the first one readied. :func:`save_checkpoint_async` and
:func:`prewarm_async_save` are the same operations on the process's own
saver, for code that writes its own loop.

One standard checkpoint written in the background while training goes on.

:func:`start` does the cheap, collective part at once (the
staging directory, packing, the agreement check), then a worker thread:

1. *stages*: copies every tensor into a reused CPU staging area (see
   :mod:`pimm_fn.checkpoint.background`: no allocation or page fault after the first save); the
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

Reusable CPU memory that background saves copy the training state into.

A background save must copy every tensor before the next optimizer step
may change it. Copying into fresh memory costs far more than the copy
itself: each 4 KiB page is faulted in and zeroed by the kernel on first
touch (on the 2-core benchmark machine: ~95 ms for 500 MB, against ~25 ms
for the same copy into memory touched before). A :class:`StagingArea`
therefore keeps the CPU tensors of the last save and copies the next save
into them when the keys, shapes and dtypes are the same, which they are for
every save of a training run: no allocation, no page fault.

Each staged tensor has a storage of its own, of exactly its bytes, so
``torch.save`` and DCP write that tensor and nothing else, and every staged
tensor is overwritten in full by each save: no byte of an earlier save can
reach a later file. (Transparent huge pages were tried for the first save
and rejected: the kernel's compaction made the first huge-page fault of a
process slower, ~300 ms for 500 MB, than plain pages.)

The reusable memory is a :class:`StagingPool`: at most one idle area (the
largest) and the prewarm readying it. A save takes the idle area for its
whole write and gives it back afterwards, so two saves never share one.
Memory belongs to the process, not to a run: every save and prewarm of the
process shares one pool (:data:`POOL`; ``acquire``, ``release``,
``prewarm`` and ``drop_idle`` here are its methods), so a second run in a
notebook copies into the memory the first one readied.

The first save of a process would still pay the page faults, on the other
core while the next forward and backward run. :func:`prewarm` pays them
ahead, on a thread of its own: it holds the idle area, allocates the
tensors of a given layout and writes every page, chunk by chunk. A save
that arrives meanwhile takes over (see :func:`acquire`): the prewarm stops
at its next chunk and hands its area on, so the save copies into the
memory readied so far and faults only the rest; nothing is allocated
twice and no save ever waits for more than one chunk.

Example:
    >>> import torch
    >>> area = acquire()
    >>> staged = area.stage({"w": torch.ones(3)})
    >>> staged["w"].tolist(), staged["w"].untyped_storage().nbytes()
    ([1.0, 1.0, 1.0], 12)
    >>> release(area)
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint import publish as _publish
from pimm_fn.checkpoint import retention as _retain
from pimm_fn.checkpoint.errors import SHARED
from pimm_fn.checkpoint.files import CheckpointInfo
from pimm_fn.checkpoint.formats import standard
from pimm_fn.checkpoint.saving import _check_args
from pimm_fn.core import retention

__all__ = [
    "POOL",
    "Copy",
    "Prewarm",
    "StagingArea",
    "StagingPool",
    "acquire",
    "drop_idle",
    "layout_of",
    "prewarm",
    "release",
    "AsyncSave",
    "start",
    "BackgroundSaver",
    "prewarm_async_save",
    "save_checkpoint_async",
]


_CHUNK = 8 * 2**20  # bytes per copy step shared between threads


def _plain(value) -> bool:
    """Whether ``value`` is a dense tensor that can live in a staging area."""
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and not value.is_meta
        and type(value) in (torch.Tensor, torch.nn.Parameter)
    )


def layout_of(*parts: dict) -> tuple:
    """The layout :meth:`StagingArea.prepare` gives ``parts``: ``(part, key, dtype, shape)`` per tensor kept."""
    return tuple((i, k, v.dtype, tuple(v.shape)) for i, part in enumerate(parts) for k, v in part.items() if _plain(v))


class StagingArea:
    """CPU tensors, kept from one save to the next, that saves copy into.

    Not thread-safe: one save uses an area at a time (see :func:`acquire`).
    """

    def __init__(self) -> None:
        self._layout: tuple = ()
        self._tensors: list[torch.Tensor] = []
        self.nbytes = 0  # bytes of memory this area holds

    def tensors(self) -> dict:
        """``{layout entry: tensor}``: what this area holds now (for inspection)."""
        return dict(zip(self._layout, self._tensors))

    def stage(self, *parts: dict) -> dict | tuple[dict, ...]:
        """Copy the tensors of each dict in ``parts`` into this area, now.

        Returns:
            What :meth:`prepare` returns, with the copy finished; one dict
            when one part was given.
        """
        staged, copy = self.prepare(*parts)
        copy.run()
        copy.wait()
        return staged[0] if len(parts) == 1 else staged

    def prepare(self, *parts: dict) -> tuple[tuple[dict, ...], "Copy"]:
        """Allocate (or reuse) this area's tensors for ``parts``; the copy runs later.

        Args:
            *parts: flat dicts; tensor values are copied, other values pass
                through. Tensors that cannot be reused this way (quantized,
                tensor subclasses) get a fresh copy, made here.

        Returns:
            ``(staged, copy)``: for each part a dict with the same keys whose
            tensors are this area's CPU tensors (contiguous), owned by it
            until its next ``prepare``; they hold the values once
            ``copy.run()`` (from any threads) and ``copy.wait()`` returned.
        """
        entries = [(i, k, v) for i, part in enumerate(parts) for k, v in part.items() if _plain(v)]
        layout = layout_of(*parts)
        if layout != self._layout:
            self._allocate(layout)
        staged = tuple(dict(part) for part in parts)
        pairs = []
        for (i, k, v), dst in zip(entries, self._tensors):
            pairs.append((dst, v.detach()))
            staged[i][k] = dst
        for i, part in enumerate(parts):
            for k, v in part.items():
                if isinstance(v, torch.Tensor) and not _plain(v):
                    staged[i][k] = v.detach().to("cpu", copy=True)
        return staged, Copy(pairs)

    def warm(self, layout: tuple, *, stop: threading.Event | None = None, pause_s: float = 0.0) -> bool:
        """Allocate this area's tensors for ``layout`` and write every page of the new ones.

        Args:
            layout: what :func:`layout_of` gives the parts a later save stages.
            stop: when set, return before the next chunk.
            pause_s: seconds to sleep after each chunk (tests use it to keep
                a prewarm running while a save arrives).

        Returns:
            True when every new tensor was written in full.
        """
        fresh = self._allocate(layout) if layout != self._layout else []
        for tensor in fresh:
            for piece, _ in _chunks(tensor, tensor):
                if stop is not None and stop.is_set():
                    return False
                piece.zero_()  # the write faults the pages in; a read would map the shared zero page
                if pause_s:
                    time.sleep(pause_s)
        return True

    def _allocate(self, layout: tuple) -> list[torch.Tensor]:
        """Keep the tensors whose (key, dtype, shape) did not change, allocate the rest; returns the new ones."""
        kept = {entry: t for entry, t in zip(self._layout, self._tensors)}
        reused = [kept.pop(entry, None) for entry in layout]
        self._tensors = []
        del kept  # tensors for entries that are gone are freed here
        fresh: list[torch.Tensor] = []
        for entry, t in zip(layout, reused):
            if t is None:
                t = torch.empty(entry[3], dtype=entry[2])
                fresh.append(t)
            self._tensors.append(t)
        self._layout = layout
        self.nbytes = sum(t.untyped_storage().nbytes() for t in self._tensors)
        return fresh


class Copy:
    """Tensor copies split in chunks that any number of threads can share.

    The save's worker thread runs it; a training thread that must wait for
    it (right before ``optimizer.step()``) calls :meth:`run` too instead of
    idling, so the rest of the copy goes about twice as fast on two cores.
    ``copy_`` releases the GIL, so the threads really run in parallel.
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        self._chunks = [chunk for dst, src in pairs for chunk in _chunks(dst, src)]
        self._next = 0
        self._left = len(self._chunks)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None
        if not self._chunks:
            self._done.set()

    def run(self) -> None:
        """Copy chunks until none is left to start (others may still be in flight)."""
        while True:
            with self._lock:
                if self._next >= len(self._chunks) or self._error is not None:
                    return
                dst, src = self._chunks[self._next]
                self._next += 1
            try:
                with torch.no_grad():
                    dst.copy_(src)
            except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
                self._error = exc
                self._done.set()
                return
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._done.set()

    def wait(self) -> None:
        """Block until every chunk was copied; raise a copy's error."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    @property
    def done(self) -> bool:
        return self._done.is_set()


def _chunks(dst: torch.Tensor, src: torch.Tensor):
    """(dst, src) pieces of at most ``_CHUNK`` bytes (whole when not both contiguous)."""
    step = max(_CHUNK // max(dst.element_size(), 1), 1)
    if dst.numel() <= step or not (dst.is_contiguous() and src.is_contiguous()):
        return [(dst, src)]
    d, s = dst.view(-1), src.reshape(-1)
    return [(d[a : a + step], s[a : a + step]) for a in range(0, d.numel(), step)]


class Prewarm:
    """A thread readying the process's staging memory for a layout (see :func:`prewarm`).

    Attributes:
        area: the area it readies (a save may hold it before the prewarm ends).
        finished: None while it runs; then True when every page was
            written, False when a save took the area over first.
        error: what stopped it, if it failed (a later save allocates anew).
    """

    def __init__(self, pool: "StagingPool", area: StagingArea, layout: tuple, pause_s: float):
        self.area = area
        self._pool = pool
        self.finished: bool | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(area, layout, pause_s), name="pimm_fn-staging-prewarm", daemon=True
        )

    def _run(self, area: StagingArea, layout: tuple, pause_s: float) -> None:
        finished = False
        try:
            finished = area.warm(layout, stop=self._stop, pause_s=pause_s)
        except BaseException as exc:  # noqa: BLE001 - kept for inspection; the save allocates what is missing
            self.error = exc
        finally:
            self._pool._returned(self, area)
            self.finished = finished

    def stop(self) -> None:
        """Stop at the next chunk and wait until the area is idle again."""
        self._stop.set()
        self.wait()

    def wait(self) -> "Prewarm":
        """Block until the thread ended (its area is then the idle one, or a larger one is)."""
        self._thread.join()
        return self

    def done(self) -> bool:
        return not self._thread.is_alive() and self.finished is not None

    def __repr__(self):
        status = "running" if self.finished is None else "finished" if self.finished else "taken over"
        return f"<Prewarm {status}>"


class StagingPool:
    """The staging memory of a process: at most one idle area (the largest) and the prewarm readying it.

    Thread-safe: saves take and give back areas from their worker threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: StagingArea | None = None
        self._warming: Prewarm | None = None  # the prewarm holding an area, while it runs

    def prewarm(self, layout: tuple, *, pause_s: float = 0.0) -> Prewarm:
        """Ready the idle staging area for ``layout`` on a background thread; returns at once.

        The thread holds the area until done; the prewarm already running, if
        any, is returned instead of starting a second one.

        Args:
            layout: what :func:`layout_of` gives the parts the next save stages.
            pause_s: seconds to sleep after each chunk written (tests).
        """
        with self._lock:
            if self._warming is not None:
                return self._warming
            area, self._idle = self._idle, None
            self._warming = Prewarm(self, area if area is not None else StagingArea(), layout, pause_s)
            self._warming._thread.start()
            return self._warming

    def acquire(self) -> StagingArea:
        """Take the idle staging area, or a new one when it is in use.

        A prewarm holding the area is stopped at its next chunk, and its area
        taken: the memory it readied is used, none is allocated twice.
        """
        while True:
            with self._lock:
                area, self._idle = self._idle, None
                warming = self._warming
            if area is not None or warming is None:
                return area if area is not None else StagingArea()
            warming.stop()  # returns once the area is idle; the next turn takes it

    def release(self, area: StagingArea) -> None:
        """Give ``area`` back once nothing reads its tensors any more; the larger idle area is kept."""
        with self._lock:
            self._offer(area)

    def drop_idle(self) -> None:
        """Forget the idle area (freed once no save holds it): the next save starts from fresh memory, as in a new process."""
        with self._lock:
            self._idle = None

    def _returned(self, warming: Prewarm, area: StagingArea) -> None:
        """A prewarm ended: in one step, so that no ``acquire`` sees neither the prewarm nor its area."""
        with self._lock:
            if self._warming is warming:
                self._warming = None
            self._offer(area)

    def _offer(self, area: StagingArea) -> None:
        if self._idle is None or area.nbytes >= self._idle.nbytes:  # the caller holds the lock
            self._idle = area


POOL = StagingPool()


"""The process's staging memory, shared by every save and prewarm of the process."""


prewarm, acquire, release, drop_idle = POOL.prewarm, POOL.acquire, POOL.release, POOL.drop_idle


def _stage(area: StagingArea, state: dict, weights: dict | None):
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

    def __init__(self, step: int) -> None:
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
        assert self._info is not None  # the work finished without an error: it returned the checkpoint
        return self._info

    def __repr__(self):
        status = "done" if self.done() else "staged" if self.staged else "staging"
        return f"<AsyncSave step={self.step} {status}>"


def start(
    model_dir: str | os.PathLike,
    *,
    pool: StagingPool,
    group,
    step: int,
    weights: dict,
    trainer: dict,
    local: dict,
    snapshot: bool,
    keep_snapshots: int | None,
    sharded: dict | None,
    keep,
    metrics: dict | None,
    digests: bool,
) -> AsyncSave:
    """Start a save as :func:`.background.save_checkpoint_async` says: staging into ``pool``, collectives on ``group``."""
    _check_args(step, "standard", keep_snapshots, weights=weights, trainer=trainer, local=local, sharded=sharded)
    policy = retention.resolve(keep, keep_snapshots, caller="save_checkpoint_async")
    recorded = retention.recordable(metrics) if metrics is not None else None
    root = storage.location(model_dir)
    world = dist.world_size()
    staging = dist.run_on_main(lambda: _publish.fresh_staging(root, step), shared=SHARED)
    state = standard.packed_state(trainer, local)  # non-tensor values are frozen into JSON now
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
            weights_file = files.weights_write(staging, staged_weights, digest=digests) if dist.is_main() else None
            try:
                standard.write_state(staging, staged_state, group=group)  # a full disk: DiskFullError on every rank
            except BaseException:
                _publish.discard(
                    staging, weights_file
                )  # the space comes back; the previous checkpoint stays the latest
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

        return dist.run_on_main(
            publish, group=group, shared=SHARED
        )  # rank 0's DiskFullError is raised as itself on every rank

    return pending._start(work)


class BackgroundSaver:
    """One run's background saving: the save in flight, the prewarm, the optimizer hooks, the process group.

    Attributes:
        pending: the :class:`~pimm_fn.checkpoint.background.AsyncSave` in flight, if any.
        prewarm: the staging :class:`~pimm_fn.checkpoint.background.Prewarm` of this run once
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

    def __init__(self, pool: StagingPool | None = None) -> None:
        self.pool = pool if pool is not None else POOL
        self.pending: AsyncSave | None = None
        self.prewarm: Prewarm | bool | None = None
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

    def begin(
        self,
        model_dir: str | os.PathLike,
        *,
        step: int,
        weights: dict,
        trainer: dict,
        local: dict,
        snapshot: bool = False,
        keep_snapshots: int | None = None,
        sharded: dict | None = None,
        keep: retention.Policy | None = None,
        metrics: dict | None = None,
        digests: bool = False,
    ) -> AsyncSave:
        """Start a save on this saver's memory and group, not waiting for nor keeping track of any other."""
        return start(
            model_dir,
            pool=self.pool,
            group=self._background_group(),
            step=step,
            weights=weights,
            trainer=trainer,
            local=local,
            snapshot=snapshot,
            keep_snapshots=keep_snapshots,
            sharded=sharded,
            keep=keep,
            metrics=metrics,
            digests=digests,
        )

    def warm(self, *, weights: dict, trainer: dict, local: dict, pause_s: float = 0.0) -> Prewarm:
        """Ready the memory a later save of state shaped like this copies into (see :func:`prewarm_async_save`)."""
        state = standard.flat_state(trainer, local)
        layout = layout_of(state, weights) if dist.is_main() else layout_of(state)
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
        if isinstance(self.prewarm, Prewarm) and not self.prewarm.done():
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
    keep: retention.Policy | None = None,
    metrics: dict | None = None,
    digests: bool = False,
    saver: BackgroundSaver | None = None,
) -> AsyncSave:
    """Start a standard-format save that stages, writes and publishes in the background.

    Collective like ``save_checkpoint``: every rank calls it, in the same
    order. The caller must not change ``weights`` or ``trainer`` tensors in
    place before ``wait_staged()`` returns, nor start another save before
    ``wait()`` returned.

    Every argument but ``saver`` is :func:`save_checkpoint`'s, in the standard format only.

    Args:
        model_dir: the checkpoint root (``save_dir/"model"``).
        step: the global step, ``>= 0``.
        weights: the model state_dict (replicated; rank 0's is written).
        trainer: replicated nested state; must be identical on every rank.
        local: this rank's nested state.
        snapshot: also keep a copy as ``iter_<step>``.
        keep_snapshots: keep only the newest N ``iter_*`` snapshots (``keep=keep_last(N)``).
        sharded: this rank's shards of a sharded model and optimizer. Shards
            (DTensors) are copied into fresh memory, not the reused staging area.
        keep: a retention policy applied to the complete ``iter_*`` snapshots
            after the publish; ``None`` keeps them all.
        metrics: the run's metrics at this save, recorded in the marker.
        digests: also record each file's SHA-256 in the marker.
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
        model_dir,
        step=step,
        weights=weights,
        trainer=trainer,
        local=local,
        snapshot=snapshot,
        keep_snapshots=keep_snapshots,
        sharded=sharded,
        keep=keep,
        metrics=metrics,
        digests=digests,
    )


def prewarm_async_save(*, weights: dict, trainer: dict, local: dict, pause_s: float = 0.0) -> Prewarm:
    """Ready, in the background, the memory a later async save of state shaped like this copies into.

    Not collective, and reads no tensor's values: only keys, shapes and
    dtypes, taken now, so the caller may go on changing the tensors. A
    background thread allocates the process's staging tensors and writes
    every page, so the first :func:`save_checkpoint_async` of the process
    finds them ready instead of faulting fresh memory in while the training
    runs beside it. A save that starts before the prewarm ends takes over
    what it readied (see :mod:`pimm_fn.checkpoint.background`).

    ``weights``, ``trainer`` and ``local`` are the later save's as it will pass
    them: their values may differ, their keys, shapes and dtypes should not.

    Args:
        weights: the later save's ``weights``.
        trainer: the later save's ``trainer``.
        local: the later save's ``local``.
        pause_s: seconds to sleep after each chunk written (tests).

    Returns:
        The running :class:`~pimm_fn.checkpoint.background.Prewarm` (``wait()`` blocks until it ended).

    Example:
        >>> import torch
        >>> prewarm_async_save(weights={"w": torch.ones(4)}, trainer={}, local={}).wait().finished
        True
    """
    return _PROCESS.warm(weights=weights, trainer=trainer, local=local, pause_s=pause_s)
