"""The training data as the loop consumes it: epochs, a cursor, exact resume, and a fetch that failed.

How a run resumes mid-epoch depends on the data:

* a loader with ``state_dict()``/``load_state_dict()`` (torchdata's
  ``StatefulDataLoader``) shuffling from the global RNG or a
  ``DistributedSampler`` is restored from its own state: it continues at the
  exact next batch without reading the consumed ones;
* any other re-iterable with ``len()`` (a ``DataLoader``, or a loader with
  its own ``generator``) is *replayed*: the RNG states from the start of the
  epoch are put back, the epoch's iterator is rebuilt and the consumed
  batches are read and skipped. Order, shuffles and augmentations come out
  exactly as before, at the cost of loading the skipped batches;
* a one-shot iterator cannot be rewound: a warning says so.

A ``DistributedSampler`` gets ``set_epoch(epoch)`` at every epoch, resumed
ones included. An epoch can also continue at a position of its permutation
(``continue_at``, see ``pimm_fn.runtime.data.positioning``): how a resume on
another world size goes on after the last sample consumed on all ranks. The
cursor records that position, so a later resume mid-epoch continues it too.

The cursor also records the loader's batch size, ``num_workers`` and
dataset length. When one of them changed, the loader's own state (which
describes the old ones) is not loaded: one ``ResumeNotExactWarning`` line
names the change and the epoch is replayed from its start to the same batch
(the same samples in the same order when only ``num_workers`` changed; see
``pimm_fn.runtime.data.positioning`` for another batch size).

A fetch that raises (an exception, a KeyboardInterrupt) loses no batch: the
feed rebuilds its iterator at the cursor from before the fetch, the same
way (replayed from the iterator's start, or reloaded from the loader's
state), and puts the torch RNG back as it was, so the next fetch returns
the batch the failed one would have.

Grouped (``Feed(data, group=k)``, for a step accumulating ``k``
micro-batches), each step draws ``k`` batches and gets them as one
``MicroBatches``. The progress counts steps; the cursor, replay and a
failed fetch count batches: ``i`` steps into an epoch are ``i * k``
batches, and a fetch that raises puts the cursor back to the start of its
group, so no step ever holds part of a group. An epoch is ``len(data) // k``
steps by default: the last ``len(data) % k`` batches are left out.

Dealt (``Feed.deal(membership)``, under fault tolerance), each step's batch
is the one ``pimm_fn.runtime.data.dealing.Dealer`` draws for the
``(participant, participants)`` that ``membership()`` returns at draw time;
the loader's own iterator is not opened. The dealer's cursor is in the
feed's ``state_dict()`` (``"dealt"``), so checkpoints and heals carry it.

After a fetch raised: the iterator a feed puts in place so that the next fetch rebuilds it at the cursor.

See ``pimm_fn.runtime.data.feed`` (a fetch that raises loses no batch).
"""

import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pimm_fn.core.validate import int_at_least
from pimm_fn.runtime.data import positioning
from pimm_fn.runtime.data.dealing import Dealer
from pimm_fn.runtime.data.positioning import changes, describe, epoch_sampler, sampler_generators, steps_per_epoch
from pimm_fn.runtime.errors import ResumeNotExactWarning
from pimm_fn.runtime.step.driver import MicroBatches
from pimm_fn.runtime.step.rng import rng_kept, set_torch_rng, torch_rng

__all__ = [
    "ReopenAtCursor",
    "Feed",
]


class ReopenAtCursor:
    """The iterator of a feed whose last fetch raised: the next fetch first rebuilds it at the cursor.

    The feed rebuilds it the way the failed iterator was opened, past the
    batches given before (``Feed.reopen_at_cursor``); then ``rng``, the torch
    RNG from before the failed fetch (or drain), is put back (``None`` when the loader
    fetches in worker processes, which draw nothing here). If that raises
    too, it stays in place for the fetch after.
    """

    def __init__(self, feed, rng):
        self.feed = feed
        self.rng = rng

    def reopen(self):
        iterator = self.feed.reopen_at_cursor()  # when it raises, this one is still in place
        if self.rng is not None:
            set_torch_rng(self.rng)
        return iterator

    def __iter__(self):
        return self

    def __next__(self):
        iterator = self.reopen()
        try:
            return next(iterator)
        except BaseException:
            self.feed.put_back(self)  # the retry starts from this fetch's cursor and RNG again
            raise


# Data whose iteration is pure (these exact types: a subclass may draw): fetching never draws from torch's RNG.
_DRAW_NOTHING = (list, tuple, range, torch.Tensor)


# Iterators whose next() runs no user code, whatever container handed them out (an in-memory batch list's).
_PURE_ITERATORS = frozenset({type(iter([])), type(iter(())), type(iter(range(0)))})


class Feed:
    """Batches for the loop, epoch by epoch, with a checkpointable cursor.

    Args:
        data: the training data (see the module docstring for what resumes exactly).
        iters_per_epoch: steps per epoch (default ``len(data) // group``).
        group: batches per step; above 1 a step gets them as one ``MicroBatches``.
        exact: a fetch that failed is fetched again from the torch RNG of
            before it (the default), for data that may draw from it while
            fetched here (``draws_in_fetch``: a loader without workers, not a
            plain list); ``False`` (``Training(exact_retry=False)``) skips that
            capture a fetch, and the retry draws from the RNG as it is.
    """

    def __init__(self, data, iters_per_epoch: int | None = None, group: int = 1, exact: bool = True):
        if not isinstance(group, int) or isinstance(group, bool) or group < 1:
            raise ValueError(f"Feed: 'group' must be an int >= 1 (got {group!r})")
        self.data = data
        self.group = group
        self.one_shot = isinstance(data, Iterator)
        # 0 is refused, never replaced by len(data): None alone means "the data's length".
        self.iters_per_epoch = (
            steps_per_epoch(data, group)
            if iters_per_epoch is None
            else int_at_least(1)
            .with_hint("leave it None for len(train_data)")
            .check(iters_per_epoch, "iters_per_epoch", owner="loop")
        )
        self.generator = getattr(data, "generator", None)
        self.stateful = (
            callable(getattr(data, "state_dict", None))
            and callable(getattr(data, "load_state_dict", None))
            and self.generator is None  # its restore leaves an own generator off by a draw
        )
        # Drawn from when an epoch opens: part of the RNG an opening that failed, or a replay, puts back.
        self._sampler_generators = sampler_generators(data, self.generator)
        self._drains = self.stateful and hasattr(data, "__len__") and len(data) // group == self.iters_per_epoch
        # The iterator is held in a list that a finalizer empties when the feed is collected: a loader's worker
        # processes are then shut down while their queues still work. Collected with the feed, in a run's reference
        # cycle, the queues' own finalizers may run first, and torch's shutdown then waits 5 s a worker in vain.
        self._held: list[Any] = [None]
        weakref.finalize(self, self._held.clear)
        self._epoch_start: dict | None = None  # the RNG the epoch opened from (``_rng``)
        self._opening: int | None = None  # the epoch whose opening failed, to retry from the same RNG
        # ``(offset, first)`` while the epoch continues at a permutation position: the rest from global
        # position ``offset`` on, begun at the epoch's step ``first`` (see ``continue_at``).
        self._rest: tuple[int, int] | None = None
        self._epoch_done = False
        # How the current iterator was opened, ("rng", states) or ("loader", state), and how many
        # batches it gave since: the cursor a failed fetch goes back to.
        self._source: tuple[str, Any] | None = None
        self._drawn = 0
        # Only a loader fetching in this process can draw from its RNG (augmentations): the RNG a failed fetch
        # puts back is taken before each fetch, unless the data, or the iterator it handed out (a list's), draws
        # nothing (then it is taken at the failure, or before the data is reopened within a fetch).
        self._pure = type(data) in _DRAW_NOTHING
        self.draws_in_fetch = not getattr(data, "num_workers", 0) and not self._pure
        # Without ``exact`` (``Training(exact_retry=False)``) a fetch that failed is fetched again, at the same
        # cursor, from the RNG as it is: no capture a fetch.
        self._rng_before_fetch = exact and self.draws_in_fetch
        # Whether a fetch (or an epoch's drain) that failed draws what it first drew when fetched again.
        self.refetched_exactly = exact or not self.draws_in_fetch
        # Dealt (``deal``): the dealer, and what says the step's participants at draw time.
        self.dealer: Dealer | None = None
        self._membership: Callable[[], tuple[int, int]] | None = None

    def deal(self, membership: Callable[[], tuple[int, int]]) -> Dealer:
        """Deal the data from now on: each batch is the one the ``Dealer`` draws for ``membership()``'s participants.

        ``membership()`` returns ``(participant, participants)`` (this
        replica's 0-based index among the step's participants, and their
        count) when a batch is drawn. Call it between epochs (before the
        first, or a resume): the epoch begun next is dealt from position 0.

        Returns:
            The dealer (also ``feed.dealer``): ``commit()`` it after a
            committed step, ``discard()`` it after a discarded one.

        Raises:
            TypeError: the data cannot be dealt (see ``Dealer``), or ``membership`` is not callable.
            ValueError: a grouped feed (``accumulate`` above 1), which is not dealt.
        """
        if not callable(membership):
            raise TypeError(
                f"Feed.deal: 'membership' must be a callable returning (participant, participants) (got {membership!r})"
            )
        if self.group != 1:
            raise ValueError(
                f"Feed.deal: a step of {self.group} micro-batches (accumulate={self.group}) is not dealt: train "
                f"with accumulate=1 and a batch size {self.group} times larger"
            )
        self.dealer, self._membership = Dealer(self.data), membership
        return self.dealer

    def _rng(self) -> dict:
        return {
            "torch": torch.get_rng_state(),
            "generator": self.generator.get_state() if self.generator else None,
            "samplers": [generator.get_state() for generator in self._sampler_generators],
        }

    def _set_rng(self, states: dict) -> None:
        torch.set_rng_state(states["torch"])
        if self.generator is not None and states.get("generator") is not None:
            self.generator.set_state(states["generator"])
        saved = states.get("samplers") or ()
        if len(saved) == len(self._sampler_generators):
            for generator, state in zip(self._sampler_generators, saved):
                generator.set_state(state)

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: tell the sampler, remember the RNG, open the iterator (dealt: the dealer's epoch)."""
        self._end_rest()
        sampler = epoch_sampler(self.data)
        if sampler is not None:
            sampler.set_epoch(epoch)
        if self.dealer is not None:
            self._epoch_start, self._epoch_done = self._rng(), False
            self.dealer.start_epoch(epoch)
            return
        # A retry after opening it failed: from the same RNG as the first try, which took it.
        if self._opening == epoch and self._epoch_start is not None:
            self._set_rng(self._epoch_start)
        else:
            self._epoch_start = self._rng()
        self._opening = epoch
        self._epoch_done = False
        self._open(("rng", self._epoch_start))
        self._opening = None

    @property
    def _iterator(self):
        """The iterator the next fetch draws from (``None``: the epoch's is not open)."""
        return self._held[0]

    @_iterator.setter
    def _iterator(self, iterator) -> None:
        self._held[0] = iterator

    def _open(self, source, drawn: int = 0) -> None:
        """Open an iterator from ``source`` (what ``_source`` holds) and skip ``drawn`` batches.

        The iterator replaces the current one only once it is at the cursor.
        """
        kind, value = source
        if kind == "rng":
            self._set_rng(value)
            iterator = iter(self.data)
            if self.stateful:  # its sampler keeps a generator of its own: only its state reopens it alike
                source = ("loader", self.data.state_dict())
        else:
            self.data.load_state_dict(value)
            iterator = self._iter_without_draws()
        for _ in range(drawn):
            next(iterator)
        self._iterator, self._source, self._drawn = iterator, source, drawn

    def reopen_at_cursor(self):
        """The iterator rebuilt at the cursor, the way the one whose fetch raised was opened (``ReopenAtCursor``).

        It takes the place of the one in place only once rebuilt: when this raises, nothing changed.
        """
        self._open(self._source, self._drawn)
        return self._iterator

    def put_back(self, iterator) -> None:
        """Make ``iterator`` (a ``ReopenAtCursor``) the one the next fetch draws from."""
        self._iterator = iterator

    def next_batch(self):
        """The next batch; an epoch longer than the data restarts the data.

        When the fetch raises, the cursor is put back first (see the module
        docstring): calling again returns the batch this call would have.
        Grouped, it is the next ``group`` batches as one ``MicroBatches``.
        Dealt, it is the batch the dealer draws for ``membership()``.
        """
        if self.dealer is not None:
            return self._dealt()
        if self.group == 1:  # a list's iterator draws nothing: its RNG is taken only if the fetch fails
            pure = self._iterator.__class__ in _PURE_ITERATORS
            return self._fetch(torch_rng() if self._rng_before_fetch and not pure else None, None)
        rng = torch_rng() if self._rng_before_fetch else None
        start = (self._source, self._drawn)  # where a failure anywhere in the group puts the cursor back
        return MicroBatches([self._fetch(rng, start) for _ in range(self.group)])

    def _fetch(self, rng, start):
        """One batch; on a failure the cursor goes back to ``start`` (``None``: before this fetch)."""
        try:
            try:
                batch = next(self._iterator)
            except StopIteration:
                if rng is None and self._rng_before_fetch and start is None:
                    rng = torch_rng()  # nothing drawn yet; the data's own iter() may draw
                self._open(("rng", self._rng()))
                batch = next(self._iterator)
        except BaseException:
            # Back to the cursor before this fetch, lazily: the next fetch rebuilds the iterator first.
            # A one-shot iterator has nothing to rebuild from: the batch it was giving may be lost.
            if self._iterator.__class__ is not ReopenAtCursor and not self.one_shot and self._source is not None:
                if rng is None and (self._pure or self._rng_before_fetch and start is None):
                    rng = torch_rng()  # nothing was drawn since the fetch began: the RNG to put back is the current one
                if start is not None:
                    self._source, self._drawn = start
                self._iterator = ReopenAtCursor(self, rng)
            raise
        self._drawn += 1
        return batch

    def _dealt(self):
        """The dealer's batch for ``membership()``; when the fetch raises, the torch RNG is put back as it was."""
        rng = torch_rng() if self._rng_before_fetch else None
        participant, participants = self._membership()
        try:
            return self.dealer.draw(participant, participants)
        except BaseException:
            if rng is not None:
                set_torch_rng(rng)
            raise

    def end_epoch(self) -> None:
        """Close the epoch; a stateful loader is drained so its state says so.

        The drain fetches what a grouped epoch leaves out, which may draw from the RNG (augmentations): as
        for a fetch, a drain that raises is drained again from the RNG of before it.
        """
        if self._drains and self._iterator is not None:
            iterator = self._iterator
            if iterator.__class__ is ReopenAtCursor:
                iterator = iterator.reopen()
            rng = torch_rng() if self._rng_before_fetch else None
            try:
                for _ in iterator:  # empty, or the fewer than ``group`` batches a grouped epoch leaves out
                    pass
            except BaseException:
                self._iterator = ReopenAtCursor(self, rng)  # drained again from the cursor next time
                raise
            self._epoch_done = True
        self._iterator = None
        self._end_rest()

    def _end_rest(self) -> None:
        if self._rest is not None:
            positioning.give_back(self.data)
            self._rest = None

    def continue_at(self, epoch: int, offset: int) -> int:
        """Begin the rest of ``epoch`` from global position ``offset`` of its permutation, split over this run's ranks.

        Returns:
            The step of the epoch it continues at: its steps per epoch less the batches of the rest.
        """
        sampler = epoch_sampler(self.data)
        if sampler is not None:  # a SequentialSampler (a dealt epoch's rest) has no epochs to tell
            sampler.set_epoch(epoch)
        positioning.lend(self.data, epoch, offset)
        first = max(self.iters_per_epoch - len(self.data) // self.group, 0)
        self._rest = (offset, first)
        self._epoch_start = self._rng()
        self._epoch_done = False
        self._open(("rng", self._epoch_start))
        return first

    def state_dict(self) -> dict:
        """The cursor: the loader's own state, and the RNG states replay needs."""
        now = self._rng()
        cursor = {
            "epoch_start": self._epoch_start,
            "generator": now["generator"],
            "samplers": now["samplers"],
            "rest": self._rest,
            "data": describe(self.data),
        }
        if self.stateful:
            cursor.update(loader=self.data.state_dict(), epoch_done=self._epoch_done)
        if self.dealer is not None:
            cursor["dealt"] = self.dealer.state_dict()
        return cursor

    def resume(self, cursor: dict, epoch: int, iter_in_epoch: int) -> None:
        """Continue ``epoch`` after ``iter_in_epoch`` consumed batches.

        Call with the process RNG already restored to the checkpoint's.
        Dealt, the dealer continues at the cursor's ``"dealt"`` position.
        """
        if self.dealer is not None:
            self._resume_dealt(self.dealer, cursor, epoch, iter_in_epoch)
            return
        if cursor.get("generator") is not None or cursor.get("samplers"):
            self._set_rng({**cursor, "torch": torch.get_rng_state()})
        boundary = iter_in_epoch == 0 or iter_in_epoch >= self.iters_per_epoch
        fresh = self._without_stale_loader(cursor, epoch, iter_in_epoch, boundary)
        if boundary:
            if fresh is not cursor:
                return  # the next epoch opens afresh: the warning said so
            if self.stateful and cursor.get("epoch_done"):
                self._load_finished(cursor["loader"])  # its sampler's state for the next epoch
            elif self.stateful and iter_in_epoch:
                warnings.warn(
                    f"epoch {epoch} ended after {self.iters_per_epoch} of the loader's {len(self.data)} batches, so "
                    f"its state does not mark a finished pass and is not restored: later epochs may shuffle "
                    f"differently from the original run. Leave iters_per_epoch at len(loader) for an exact resume",
                    ResumeNotExactWarning,
                    stacklevel=3,
                )
            return
        sampler = epoch_sampler(self.data)
        if sampler is not None:
            sampler.set_epoch(epoch)
        cursor, skip = fresh, iter_in_epoch * self.group  # batches, not steps
        if cursor.get("rest") is not None:  # the epoch was continued at a position: continue it there again
            offset, first = cursor["rest"]
            positioning.lend(self.data, epoch, offset)
            self._rest, skip = (offset, first), (iter_in_epoch - first) * self.group
        if self.stateful and "loader" in cursor:
            self.data.load_state_dict(cursor["loader"])
            self._iterator = self._iter_without_draws()
            self._source, self._drawn = ("loader", cursor["loader"]), 0
        elif not self.one_shot and cursor.get("epoch_start") is not None:
            self._replay(cursor["epoch_start"], skip)
        else:
            warnings.warn(
                f"cannot restore the data position of epoch {epoch} (step {iter_in_epoch} of it): the epoch "
                f"continues from a fresh iterator, so the batches differ from the original run. Use a DataLoader "
                f"or torchdata's StatefulDataLoader",
                ResumeNotExactWarning,
                stacklevel=3,
            )
            self._source, self._drawn = ("rng", self._rng()), 0
            self._iterator = iter(self.data)

    def _resume_dealt(self, dealer: Dealer, cursor: dict, epoch: int, iter_in_epoch: int) -> None:
        """Continue dealing at the cursor's dealt position; a plain checkpoint's mid-epoch one is not carried over."""
        self._end_rest()  # a rest of an epoch a plain resume began (the sampler lent) is not the dealer's
        self._epoch_start, self._epoch_done = cursor.get("epoch_start") or self._rng(), False
        if "dealt" in cursor:
            dealer.load_state_dict(cursor["dealt"])
        elif 0 < iter_in_epoch < self.iters_per_epoch:
            warnings.warn(
                f"the checkpoint was written by a run that did not deal its data: the samples of epoch {epoch} its "
                f"{iter_in_epoch} steps consumed are not known as positions, so the epoch is dealt from its start",
                ResumeNotExactWarning,
                stacklevel=3,
            )
            dealer.start_epoch(epoch)

    def _without_stale_loader(self, cursor: dict, epoch: int, iter_in_epoch: int, boundary: bool) -> dict:
        """``cursor`` without the loader's state when the loader changed since (named in one warning line).

        That state describes the old batch size, workers and dataset: loading
        it fails inside the loader, or continues at a wrong sample.
        """
        changed = changes(cursor.get("data"), describe(self.data))
        if not changed or (boundary and "loader" not in cursor):
            return cursor  # nothing of the old loader is loaded, or positioned by
        then = (
            f"epoch {epoch + (iter_in_epoch > 0)} opens afresh"
            if boundary
            else f"epoch {epoch} is replayed from its start to step {iter_in_epoch}"
        )
        warnings.warn(
            f"the training data changed since the checkpoint ({changed}): the loader's saved state (if any) is "
            f"not loaded; {then}",
            ResumeNotExactWarning,
            stacklevel=4,
        )
        return {k: v for k, v in cursor.items() if k not in ("loader", "epoch_done")}

    def _load_finished(self, loader_state) -> None:
        """Load the state a finished epoch left in the loader, drawing no random numbers.

        A StatefulDataLoader rebuilds the finished iterator from a loaded state
        on its next ``iter()`` (drawing a seed for it) before it opens a fresh
        one: a draw the uninterrupted run never made. Rebuilding it here, with
        the RNG put back, leaves the next epoch's ``iter()`` drawing exactly
        what the uninterrupted run's did.
        """
        with rng_kept():  # a load that raised after a draw leaves the RNG as it found it too
            self.data.load_state_dict(loader_state)
            self.data.state_dict()

    def _iter_without_draws(self):
        """A resumed iterator; the seed it draws was drawn at epoch start originally.

        The RNG is put back even when ``iter()`` raises after the loader drew
        that seed (a wrapper failing as its iterator opens): a retried reopen,
        like the epoch after it, then draws what the uninterrupted run drew.
        """
        with rng_kept():
            return iter(self.data)

    def _replay(self, epoch_start: dict, skip: int) -> None:
        """Reopen the epoch from the RNG it started with and skip ``skip`` batches; the RNG put back, even on a raise."""
        self._epoch_start = epoch_start
        with rng_kept():
            self._open(("rng", epoch_start), skip)
