"""An epoch of the training data dealt over the replicas alive: each replica's batch drawn from one shared cursor.

Under fault tolerance the replicas that take part in a step change from one
step to the next, so no rank can keep a sampler of its own share. A
``Dealer`` reads the epoch as one order every replica computes alike (a
``SequentialSampler``'s, or a ``DistributedSampler``'s whole permutation
for the epoch, as ``pimm_fn.runtime.data.positioning.epoch_order`` reads
it) and keeps one number, the **cursor**: the positions of that order
consumed by committed steps. ``draw(participant, participants)`` fetches
the positions ``pimm_fn.core.dealing.deal`` gives that participant (the
arithmetic lives there), through the loader's own dataset and
``collate_fn``; ``commit()`` moves the cursor past the whole step's
positions, ``discard()`` leaves it, so the same positions are dealt again.
The loader's ``batch_size`` and ``drop_last`` say how the epoch is cut; its
sampler's ``num_replicas`` and ``rank`` are not used (the participants of
each step take their place), and the batches are fetched in this process
(the loader's ``num_workers`` are not started).

The cursor is ``state_dict()``'s (JSON: the epoch and the cursor), which the
feed keeps in its own (``Feed.deal``), so checkpoints and heals carry it; a
plain run resumed from such a checkpoint continues the epoch after the
cursor (``pimm_fn.runtime.data.positioning.dealt_rest``).
"""

from collections.abc import Sequence
from typing import Any, TypeGuard

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, SequentialSampler

from pimm_fn.core import dealing
from pimm_fn.runtime.data.positioning import epoch_order

__all__ = ["Dealer"]

_INSTEAD = (
    "pass a torch DataLoader over a map-style dataset with a batch_size and either shuffle=False "
    "(a SequentialSampler) or sampler=DistributedSampler(dataset, shuffle=..., seed=...), whose epoch order "
    "every replica computes alike"
)


def _why_not(data) -> str | None:
    """Why ``data``'s epochs cannot be dealt, or ``None`` when they can."""
    if not isinstance(data, DataLoader):
        return f"it is a {type(data).__name__}, not a torch DataLoader (a one-shot iterator cannot be dealt)"
    if isinstance(data.dataset, IterableDataset):
        return f"its dataset is an IterableDataset ({type(data.dataset).__name__}): it has no positions to deal"
    if not isinstance(data.batch_size, int):
        return "it batches with its own batch_sampler= (or batch_size=None): the dealer needs the batch size"
    sampler = data.sampler
    if type(sampler) not in (SequentialSampler, DistributedSampler):  # a subclass may order its samples otherwise
        return f"its sampler is a {type(sampler).__name__}, whose epoch order other replicas cannot compute"
    if getattr(data.batch_sampler, "sampler", None) is not sampler:
        return "its batch sampler does not batch its sampler"
    return None


class Dealer:
    """The training data's epochs dealt over the participants of each step, from one cursor.

    Args:
        data: a ``DataLoader`` over a map-style dataset, batching a
            ``SequentialSampler`` or a ``DistributedSampler`` with a ``batch_size``.

    Raises:
        TypeError: any other data (another sampler, ``batch_sampler=``, an
            iterable dataset, a one-shot iterator), saying what to pass instead.
    """

    def __init__(self, data: Any):
        why = _why_not(data)
        if why is not None:
            raise TypeError(f"the training data cannot be dealt over replicas: {why}; {_INSTEAD}")
        self.data = data
        self.batch_size: int = data.batch_size
        self.drop_last: bool = bool(data.drop_last)
        self.length: int = len(data.dataset)
        self.epoch: int | None = None
        self.cursor = 0
        self._order: Sequence[int] = ()
        self._drawn: int | None = None  # the participants of the last draw, until it is committed or discarded

    def __repr__(self) -> str:
        return f"Dealer(epoch={self.epoch}, cursor={self.cursor} of {self.length}, batch_size={self.batch_size})"

    def _at(self, epoch: int, cursor: int) -> None:
        sampler = self.data.sampler
        self._order = epoch_order(sampler, epoch) if type(sampler) is DistributedSampler else range(self.length)
        self.epoch, self.cursor, self._drawn = epoch, cursor, None

    def start_epoch(self, epoch: int) -> None:
        """Begin ``epoch``: its order, the cursor at 0."""
        self._at(epoch, 0)

    def positions(self, participant: int, participants: int) -> tuple[int, ...]:
        """The epoch positions ``participant`` of ``participants`` trains in the step from the cursor."""
        if self.epoch is None:
            raise RuntimeError("Dealer: no epoch begun: call start_epoch(epoch) before drawing")
        if not self.steps_left(participants):
            raise RuntimeError(
                f"Dealer: epoch {self.epoch} has no step left for {participants} participant(s) (cursor "
                f"{self.cursor} of {self.length}, batch size {self.batch_size}, drop_last={self.drop_last})"
            )
        return dealing.deal(
            self.cursor,
            length=self.length,
            batch_size=self.batch_size,
            participant=participant,
            participants=participants,
        )

    def draw(self, participant: int, participants: int) -> Any:
        """The batch of ``participant`` (0-based) of ``participants`` for the step from the cursor, fetched as the loader would.

        Drawing again before ``commit()`` or ``discard()`` deals from the same cursor.
        """
        indices = [self._order[p] for p in self.positions(participant, participants)]
        dataset = self.data.dataset
        if getattr(dataset, "__getitems__", None):  # as torch's own fetcher reads a batch
            samples = dataset.__getitems__(indices)
        else:
            samples = [dataset[i] for i in indices]
        batch = self.data.collate_fn(samples)
        self._drawn = participants
        return batch

    def commit(self) -> None:
        """The drawn step committed: the cursor moves past the positions of all its participants."""
        if self._drawn is None:
            raise RuntimeError("Dealer: nothing drawn to commit (commit() follows a draw, once)")
        self.cursor = dealing.advanced(
            self.cursor, length=self.length, batch_size=self.batch_size, participants=self._drawn
        )
        self._drawn = None

    def discard(self) -> None:
        """The drawn step was discarded (its vote failed): the cursor stays, the same positions are dealt next."""
        self._drawn = None

    def steps_left(self, participants: int) -> int:
        """The steps left in the epoch from the cursor for ``participants`` (its tail included unless ``drop_last``)."""
        return dealing.steps_left(
            self.cursor,
            length=self.length,
            batch_size=self.batch_size,
            participants=participants,
            drop_last=self.drop_last,
        )

    def state_dict(self) -> dict:
        """The position, JSON-safe: ``{"epoch": ..., "cursor": ...}`` (``None`` for the epoch before one began)."""
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: Any) -> None:
        """Continue at ``state`` (a ``state_dict()``): that epoch's order, that cursor.

        Raises:
            ValueError: ``state`` is no such record, or its cursor is past this data's epoch.
        """
        record = isinstance(state, dict) and set(state) == {"epoch", "cursor"}
        epoch, cursor = (state["epoch"], state["cursor"]) if record else (None, None)
        if record and epoch is None and _count(cursor) and cursor == 0:
            self.epoch, self.cursor, self._order, self._drawn = None, 0, (), None
        elif record and _count(epoch) and _count(cursor) and cursor <= self.length:
            self._at(epoch, cursor)
        else:
            raise ValueError(
                f"Dealer: cannot continue at {state!r}: a dealer's state is {{'epoch': int >= 0, 'cursor': int "
                f"from 0 to the dataset's {self.length} samples}} (as state_dict() gives it)"
            )


def _count(value: object) -> TypeGuard[int]:
    """``value`` is an int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
