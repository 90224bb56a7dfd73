"""Reusable CPU memory that background saves copy the training state into.

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

import threading
import time

import torch

__all__ = [
    "POOL", "Copy", "Prewarm", "StagingArea", "StagingPool", "acquire", "drop_idle", "layout_of", "prewarm", "release",
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
        self._tensors = [kept.pop(entry, None) for entry in layout]
        del kept  # tensors for entries that are gone are freed here
        fresh = []
        for j, (entry, t) in enumerate(zip(layout, self._tensors)):
            if t is None:
                self._tensors[j] = t = torch.empty(entry[3], dtype=entry[2])
                fresh.append(t)
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
    return [(d[a:a + step], s[a:a + step]) for a in range(0, d.numel(), step)]


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
