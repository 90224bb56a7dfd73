"""What the feed reads off the training data, and where an interrupted epoch continues when the world size or the steps per epoch changed.

``describe`` records the loader's batch size, ``num_workers`` and dataset
length in the cursor; ``changes`` names what differs on resume, when the
loader's saved state no longer fits it.

Where an interrupted epoch continues when the world size or the steps per epoch changed.

On a different world size the per-rank RNG states cannot carry over, but
the position in the epoch does, as samples consumed: ``i`` steps of ``b``
samples on ``W`` ranks consumed the first ``i * b * W`` positions of the
epoch's ``DistributedSampler`` permutation, and the epoch continues after
them, split over the new ranks (``pimm_fn.runtime.data.positioning``): no sample
repeated or skipped. The epoch's step is then its new steps per epoch less
the batches left, ``global_step`` and ``samples_seen`` are kept (cadences
go on by ``global_step``), and every later epoch has the new length: the
run ends after ``max_epochs`` epochs, at the step ``plan`` predicts from the
restored progress (``plan(..., start=run.state.progress)``). At an epoch
boundary only the length changes. Where the data cannot be positioned so
(another sampler, a one-shot iterator, an ``iters_per_epoch`` other than
``len(loader)``, another dataset length, a checkpoint without the record),
the interrupted epoch restarts from its first batch with a
``ResumeNotExactWarning`` saying why (``resume`` refuses it under ``strict``).

Steps per epoch that changed since the checkpoint (another batch size,
other data, another ``iters_per_epoch``) follow one rule, said in a
``ResumeNotExactWarning`` naming both lengths and the samples consumed:
the interrupted epoch continues *by samples consumed*. A torch
``DistributedSampler`` epoch continues at its permutation position, as on
another world size (the batch size the cursor records gives the samples
consumed). Otherwise, when the samples the epoch consumed can be told from
the progress (every batch before the interruption full), are a multiple of
the new batch size, and the data can be replayed to that point (a
``DataLoader`` over a sampler, not a one-shot iterator), the epoch continues
at the batch starting with the first unconsumed sample: no sample is
repeated or skipped. Otherwise the interrupted epoch restarts from its first
batch, and the warning says why. Either way ``global_step`` and
``samples_seen`` are kept, and the epoch is the new length from then on (so
``global_step`` no longer equals ``epoch * steps_per_epoch + step_in_epoch``;
step-cadence hooks follow ``global_step``). At an epoch boundary only the
length changes.

The rest of an interrupted ``DistributedSampler`` epoch, shared over another number of ranks.

A ``DistributedSampler`` epoch is one permutation of the dataset (from its
``seed`` and the epoch), dealt round-robin to the ranks: on ``W`` ranks,
rank ``r`` takes positions ``r, r + W, r + 2W, ...``. After ``i`` steps of
``b`` samples on every rank, the epoch has consumed exactly the first
``i * b * W`` positions of that permutation, whatever ``r``. A run resumed
on ``W'`` ranks continues the epoch with the positions from there on, dealt
the same way over its own ranks: no sample is repeated or skipped.

The stock sampler always starts at position 0, so for the rest of that one
epoch the loader's batch sampler is lent a ``Remainder`` (the rank's share
of the rest) in place of its sampler; the feed gives the sampler back when
the epoch ends. Like ``DistributedSampler``, the share is padded to a
multiple of ``W'`` by repeating the rest's first samples (at most ``W' - 1``
of them are then seen twice in that epoch), or cut to a multiple of ``W'``
under ``drop_last=True``.

A checkpoint written by a feed that dealt its data over replicas
(``pimm_fn.runtime.data.dealing``) records the dealer's cursor, the
positions of the epoch's order its committed steps consumed: a plain run
resumed from it (any world size) continues the epoch after them by the same
rule (``dealt_rest`` on the same world size, ``new_world`` on another), the
cursor taking the place of ``i * b * W``. A ``SequentialSampler``'s epoch
continues so too (its order is the dataset's, read whole by every rank).

>>> order = list(range(10))
>>> share(order, 4, num_replicas=2, rank=1, drop_last=False)
[5, 7, 9]
"""

import copy
import warnings

import attrs
import torch
from torch.utils.data import DistributedSampler, SequentialSampler

from pimm_fn import dist
from pimm_fn.core.state import State
from pimm_fn.runtime.errors import ResumeNotExactWarning

__all__ = [
    "epoch_sampler",
    "sampler_generators",
    "steps_per_epoch",
    "describe",
    "changes",
    "Remainder",
    "why_not",
    "dealt",
    "epoch_order",
    "share",
    "lend",
    "give_back",
    "mid_epoch",
    "world_message",
    "main_cursor",
    "world_offset",
    "new_world",
    "new_epoch_length",
    "dealt_rest",
]


def epoch_sampler(data):
    """The sampler of ``data`` told each epoch (one with ``set_epoch``), or ``None``."""
    for candidate in (getattr(data, "sampler", None), getattr(getattr(data, "batch_sampler", None), "sampler", None)):
        if hasattr(candidate, "set_epoch"):
            return candidate
    return None


def sampler_generators(data, own) -> tuple:
    """Generators the loader's samplers keep across epochs (torchdata's RandomSampler), besides ``own``."""
    found: list[torch.Generator] = []
    for holder in (
        getattr(data, "sampler", None),
        getattr(data, "batch_sampler", None),
        getattr(getattr(data, "batch_sampler", None), "sampler", None),
    ):
        generator = getattr(holder, "generator", None)
        if isinstance(generator, torch.Generator) and generator is not own and all(generator is not g for g in found):
            found.append(generator)
    return tuple(found)


def describe(data) -> dict:
    """What of ``data`` a loader's saved state depends on: batch size, ``num_workers``, dataset length."""
    try:
        samples = len(data.dataset)
    except (AttributeError, TypeError):
        samples = None
    return {
        "batch_size": getattr(data, "batch_size", None),
        "num_workers": getattr(data, "num_workers", 0),
        "samples": samples,
    }


def changes(saved: dict | None, now: dict) -> str:
    """The differences between two ``describe`` records, as ``"num_workers 0 -> 2"``; ``""`` when none (or unknown)."""
    if not saved:
        return ""
    names = {"batch_size": "batch size", "num_workers": "num_workers", "samples": "dataset length"}
    return ", ".join(
        f"{label} {saved.get(key)} -> {now.get(key)}" for key, label in names.items() if saved.get(key) != now.get(key)
    )


def _length(data) -> int:
    try:
        length = len(data)
    except TypeError:
        raise TypeError(
            f"the training data ({type(data).__name__}) has no len(): pass "
            "loop(training=pimm_fn.Training(iters_per_epoch=N))"
        ) from None
    if length < 1:
        raise ValueError(f"the training data is empty (len {length}): give the loop at least one batch")
    return length


def steps_per_epoch(data, group: int) -> int:
    """Steps per epoch of ``group`` batches each: ``len(data) // group``."""
    length = _length(data)
    if length < group:
        raise ValueError(
            f"the training data has {length} batches, fewer than the {group} micro-batches of one step "
            f"(accumulate={group}): use more data, smaller batches or a smaller accumulate"
        )
    return length // group


class Remainder:
    """One rank's share of an epoch's rest: the sampler a loader is lent for that epoch."""

    def __init__(self, indices, sampler):
        self.indices = list(indices)
        self.sampler = sampler  # the loader's own, given back when the epoch ends

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return f"Remainder({len(self.indices)} samples, lent in place of {type(self.sampler).__name__})"


def why_not(data, *, sequential: bool = False) -> str | None:
    """Why ``data``'s epoch cannot be continued at a permutation position, or ``None`` when it can.

    ``sequential``: a ``SequentialSampler`` can be too (a dealt epoch's position, the same on every rank).
    """
    sampler = getattr(data, "sampler", None)
    if sequential and type(sampler) is SequentialSampler:
        pass
    elif type(sampler) is not DistributedSampler:  # a subclass may deal its samples otherwise
        return f"its sampler is a {type(sampler).__name__}, not a torch DistributedSampler"
    batches = getattr(data, "batch_sampler", None)
    if getattr(batches, "sampler", None) is not sampler or not isinstance(getattr(data, "batch_size", None), int):
        return "its loader does not batch its DistributedSampler with a batch_size"
    return None


def epoch_order(sampler: DistributedSampler, epoch: int) -> list[int]:
    """The whole permutation ``sampler`` deals out in ``epoch``: its own code, on one rank, unpadded."""
    whole = copy.copy(sampler)
    whole.num_replicas, whole.rank, whole.drop_last = 1, 0, False
    # torch types the dataset a Dataset, which need not be Sized; a DistributedSampler takes its len() too.
    whole.num_samples = whole.total_size = len(sampler.dataset)  # type: ignore[arg-type]
    whole.set_epoch(epoch)
    return list(whole)


def share(order, offset: int, *, num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """Rank ``rank``'s positions of ``order`` from ``offset`` on, dealt as ``DistributedSampler`` deals."""
    rest = list(order[offset:])
    if drop_last:
        rest = rest[: len(rest) - len(rest) % num_replicas]
    else:
        padding = -len(rest) % num_replicas
        rest += (rest * (padding // max(len(rest), 1) + 1))[:padding]
    return rest[rank::num_replicas]


def lend(data, epoch: int, offset: int) -> Remainder:
    """Lend ``data``'s batch sampler this rank's share of ``epoch`` from global position ``offset``."""
    sampler = data.sampler
    if type(sampler) is DistributedSampler:
        order, replicas, rank, drop_last = (
            epoch_order(sampler, epoch),
            sampler.num_replicas,
            sampler.rank,
            sampler.drop_last,
        )
    else:  # a SequentialSampler (a dealt epoch's rest): every rank reads the whole rest, as the sampler reads it all
        order, replicas, rank, drop_last = list(range(len(sampler))), 1, 0, False
    indices = share(order, offset, num_replicas=replicas, rank=rank, drop_last=drop_last)
    remainder = Remainder(indices, sampler)
    data.batch_sampler.sampler = remainder
    return remainder


def dealt(cursor) -> dict | None:
    """The dealer's position (``{"epoch", "cursor"}``) a dealing feed recorded in its ``cursor``, or ``None``."""
    found = (cursor or {}).get("dealt")
    return found if isinstance(found, dict) else None


def give_back(data) -> None:
    """Put ``data``'s own sampler back in its batch sampler, if a ``Remainder`` was lent."""
    batches = getattr(data, "batch_sampler", None)
    lent = getattr(batches, "sampler", None)
    if batches is not None and isinstance(lent, Remainder):  # a Remainder was lent: there is a batch sampler
        batches.sampler = lent.sampler


def mid_epoch(state: State) -> bool:
    """The checkpoint was written inside an epoch (not at its end, not between epochs)."""
    return state.position in ("BeforeEpoch", "BeforeStep", "AfterStep") and not state.progress.at_epoch_end


def world_message(info, ctx) -> str:
    return (
        f"checkpoint of step {info.step} was written by {info.world_size} rank(s), this run has "
        f"{ctx.world_size}: per-rank RNG states cannot carry over"
    )


def main_cursor(held):
    """Rank 0's data cursor on every rank: its batch size and position are the same on all ranks (collective)."""
    return dist.broadcast_object(held.local.cursor if dist.rank() == 0 and held.local is not None else None)


def world_offset(p, ctx, info, cursor) -> tuple[int | None, str]:
    """Where in its permutation the interrupted epoch continues on this world size, or ``None`` and why not."""
    offset, why = _consumed(p, cursor, info.world_size, ctx.feed.group)
    if offset is None:
        return None, why
    unpositioned = _positioning(ctx, cursor)
    if unpositioned is not None:
        return None, unpositioned
    samples = len(ctx.feed.data.dataset)  # a dealt cursor at the end: the epoch's rest is empty
    if offset > samples or offset == samples and not dealt(cursor):
        return None, f"its {offset} consumed samples reach past the dataset"
    return offset, ""


def new_world(state, ctx, info, offset, why, cursor) -> State:
    """``state`` on this run's world size, by the rule of this module's docstring; the data positioned.

    ``offset, why``: ``world_offset``'s answer.
    """
    p, new = state.progress, ctx.feed.iters_per_epoch
    if not mid_epoch(state):
        ctx.say(
            f"resumed on {ctx.world_size} rank(s) at an epoch boundary (written by {info.world_size}): "
            f"epochs now have {new} steps, global_step stays {p.global_step}"
        )
        return _at_boundary(state, new)
    if offset is None:
        message = world_message(info, ctx) + f"; {why}, so epoch {p.epoch} restarts from its first batch"
        return _restart(state, ctx.feed, message)
    saved = (cursor or {}).get("data") or {}
    return _continue_at(state, ctx.feed, offset, world_message(info, ctx), changes_since=saved)


def dealt_rest(state, ctx, info, cursor) -> State:
    """``state`` resumed by a plain feed on the same world size from a dealing feed's checkpoint; the data positioned.

    The interrupted epoch continues after the dealer's cursor (this
    module's docstring), or restarts from its first batch where the data
    cannot be positioned (a warning says why either way); at an epoch
    boundary only the length changes.
    """
    p, feed = state.progress, ctx.feed
    head = (
        f"the checkpoint of step {p.global_step} ({info.path}) was written by a run that dealt its data over "
        f"replicas; this run does not"
    )
    if not mid_epoch(state) or p.iter_in_epoch == 0:
        feed.resume(cursor, p.epoch, p.iter_in_epoch)
        return _at_boundary(state, feed.iters_per_epoch)
    offset, why = world_offset(p, ctx, info, cursor)
    if offset is None:
        return _restart(state, feed, f"{head}; {why}, so epoch {p.epoch} restarts from its first batch")
    return _continue_at(state, feed, offset, head)


def new_epoch_length(state, ctx, info, cursor) -> State:
    """``state`` on the new steps per epoch, by the rule of this module's docstring; the data positioned."""
    p, feed = state.progress, ctx.feed
    old, new = p.iters_per_epoch, feed.iters_per_epoch
    # A loader's own state describes batches of the old length: positions come from replay instead.
    # (The feed is handed the cursor without its loader record, "data": the warning below says the change.)
    cursor = {k: v for k, v in cursor.items() if k not in ("loader", "epoch_done")}
    head = (
        f"steps per epoch changed since the checkpoint of step {p.global_step} ({info.path}): {old} then, "
        f"{new} now (another batch size, other data or iters_per_epoch); {p.samples_seen} samples consumed in all"
    )
    if not mid_epoch(state) or p.iter_in_epoch == 0:
        feed.resume({**cursor, "data": None}, p.epoch, 0)  # between epochs: nothing of an epoch to position
        ctx.say(f"{head}; resuming at an epoch boundary, global_step stays {p.global_step}")
        return _at_boundary(state, new)
    offset, why = world_offset(p, ctx, info, cursor)  # a DistributedSampler epoch continues by positions
    if offset is not None:
        return _continue_at(state, feed, offset, head)
    index, why = _position(p, feed.data, feed, cursor)
    if index is None:
        return _restart(
            state,
            feed,
            f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {old} "
            f"steps, and {why}: epoch {p.epoch} restarts from its first batch; global_step "
            f"stays {p.global_step}",
        )
    index = min(index, new)  # the samples consumed reach past the new epoch: it has ended
    warnings.warn(
        f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {old} steps ({why}): it continues "
        f"at batch index {index} of {new}, with no sample repeated or skipped; global_step stays {p.global_step}",
        ResumeNotExactWarning,
        stacklevel=4,
    )
    feed.resume({**cursor, "data": None}, p.epoch, index)
    return _with_length(state, new, index)


def _with_length(state, new: int, iter_in_epoch: int) -> State:
    return attrs.evolve(state, progress=attrs.evolve(state.progress, iters_per_epoch=new, iter_in_epoch=iter_in_epoch))


def _at_boundary(state, new: int) -> State:
    """Between two epochs only the length changes (an epoch that had ended stays ended)."""
    p = state.progress
    return _with_length(state, new, new if p.at_epoch_end else p.iter_in_epoch)


def _continue_at(state, feed, offset: int, head: str, *, changes_since: dict | None = None) -> State:
    """The interrupted epoch continued after the ``offset`` positions of its permutation it consumed, said.

    ``changes_since``: the saved ``describe`` record, whose differences from the data now the warning names.
    """
    p, new = state.progress, feed.iters_per_epoch
    first = feed.continue_at(p.epoch, offset)
    changed = changes(changes_since, describe(feed.data)) if changes_since is not None else ""
    note = f" ({changed})" if changed else ""
    warnings.warn(
        f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {p.iters_per_epoch} steps, {offset} "
        f"samples consumed on all ranks{note}: it continues after them at step {first} of {new}, with no sample "
        f"repeated or skipped; global_step stays {p.global_step}",
        ResumeNotExactWarning,
        stacklevel=5,
    )
    return _with_length(state, new, first)


def _restart(state, feed, message: str) -> State:
    """The interrupted epoch restarted from its first batch, ``message`` saying why."""
    warnings.warn(message, ResumeNotExactWarning, stacklevel=5)
    feed.start_epoch(state.progress.epoch)
    return attrs.evolve(
        state,
        progress=attrs.evolve(state.progress, iter_in_epoch=0, iters_per_epoch=feed.iters_per_epoch),
        position="BeforeEpoch",
    )


def _consumed(p, cursor, world: int, group: int) -> tuple[int | None, str]:
    """The positions of its permutation the interrupted epoch consumed on all ``world`` ranks, or ``None`` and why not.

    A step takes ``group`` batches (``TrainStep(accumulate=group)``, unchanged since the checkpoint).
    """
    position = dealt(cursor)
    if position is not None:  # a dealing feed's: the positions its committed steps consumed
        if position.get("epoch") != p.epoch or type(position.get("cursor")) is not int or position["cursor"] < 0:
            return None, f"its dealt position {position} is not one of epoch {p.epoch}"
        return position["cursor"], ""
    data = (cursor or {}).get("data")
    if not data or not isinstance(data.get("batch_size"), int):
        return None, "the checkpoint does not record its loader's batch size"
    offset, first = cursor.get("rest") or (0, 0)
    return offset + (p.iter_in_epoch - first) * group * data["batch_size"] * world, ""


def _positioning(ctx, cursor) -> str | None:
    """Why this run's data cannot continue an epoch at a position of its permutation, or ``None``."""
    feed = ctx.feed
    if feed.one_shot:
        return "the training data is a one-shot iterator"
    why = why_not(feed.data, sequential=dealt(cursor) is not None)
    if why is not None:
        return f"the training data cannot be positioned ({why})"
    if feed.iters_per_epoch != len(feed.data) // feed.group:
        return f"iters_per_epoch={feed.iters_per_epoch} differs from len(loader)={len(feed.data)} // {feed.group}"
    saved, now = ((cursor or {}).get("data") or {}).get("samples"), describe(feed.data)["samples"]
    if saved != now:
        return f"the dataset length changed ({saved} -> {now}): its permutation is another one"
    return None


def _samples_in_epoch(p, data) -> int | None:
    """The samples the interrupted epoch consumed, when the progress pins them down; else ``None``.

    Every batch before the interruption is full (only an epoch's last batch
    may be short), so the epoch consumed ``iter_in_epoch * b`` samples for
    the old batch size ``b``, which the checkpoint does not record. It is
    found two ways, each checked against the old steps per epoch: every
    earlier epoch a full pass over the sampler's ``n`` samples (``b`` from
    ``samples_seen - epoch * n``), or every step so far one full batch
    (``b = samples_seen / global_step``, epochs capped by ``iters_per_epoch``).
    """
    try:
        n = len(data.sampler)
    except (AttributeError, TypeError):
        return None
    i, old = p.iter_in_epoch, p.iters_per_epoch
    within = p.samples_seen - p.epoch * n
    if 0 < within < n and within % i == 0:
        b = within // i
        if old in (-(-n // b), n // b):
            return within
    if p.global_step and p.samples_seen % p.global_step == 0:
        b = p.samples_seen // p.global_step
        if 0 < b and b * old <= n:
            return i * b
    return None


def _position(p, data, feed, cursor) -> tuple[int | None, str]:
    """The batch index of the new epoch length that continues the interrupted epoch, or ``None`` and why not."""
    within = _samples_in_epoch(p, data)
    if within is None:
        return None, "the samples it consumed cannot be told from the checkpoint"
    size = getattr(data, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        return None, f"{within} samples of it were consumed, but the data has no batch_size to position by"
    if within % size:
        return None, f"its {within} consumed samples are not a multiple of the new batch size {size}"
    if feed.one_shot or cursor.get("epoch_start") is None:
        return None, f"its {within} consumed samples were known, but the data cannot be replayed to that point"
    return within // size, f"{within} samples consumed / batch size {size}"
