"""Dealing an epoch over the replicas that are alive: which samples each trains, and how long the epoch still is.

Under fault tolerance the replicas that take part in a step change from one
step to the next. The epoch is one order of ``length`` positions, the same
in every replica, and one number says how far it went: the **cursor**, the
positions consumed by committed steps. A step of ``n`` participants, each
drawing ``batch_size`` samples, takes the ``batch_size * n`` positions from
the cursor on, participant ``i`` the ``i``-th block of them; a committed step
moves the cursor past them all, a discarded one (its vote failed) leaves it,
and the same positions are dealt again. So whatever the membership, each
position is trained once in its epoch, as a world-size change on resume
continues an epoch (``pimm_fn.runtime.data.positioning``).

The epoch's tail, fewer than ``batch_size * n`` positions, is dealt as a
``DistributedSampler`` deals it: with ``drop_last`` it is left out; else
each participant takes an equal share of ``ceil(rest / n)`` positions, the
last shares completed from the rest's first positions (at most ``n - 1``
of them seen twice, as ``positioning.share`` pads), so every participant has
a batch to train.

Pure arithmetic, the same in the runtime's dealer and in the simulator.

>>> deal(4, length=10, batch_size=2, participant=1, participants=2)
(6, 7)
>>> steps_left(4, length=10, batch_size=2, participants=2, drop_last=False)
2
>>> deal(8, length=10, batch_size=2, participant=2, participants=3)
(8,)
"""

from pimm_fn.core.validate import int_at_least, is_bool

__all__ = ["deal", "step_positions", "steps_left", "advanced"]

_COUNT = int_at_least(1)
_INDEX = int_at_least(0)


def _check(cursor: int, length: int, batch_size: int, participants: int) -> None:
    _INDEX.check(cursor, "cursor", owner="dealing")
    _COUNT.check(length, "length", owner="dealing")
    _COUNT.check(batch_size, "batch_size", owner="dealing")
    _COUNT.check(participants, "participants", owner="dealing")
    if cursor > length:
        raise ValueError(f"dealing: 'cursor' {cursor} is past the epoch's {length} positions")


def step_positions(cursor: int, *, length: int, batch_size: int, participants: int) -> int:
    """How many positions of the epoch a step of ``participants`` consumes from ``cursor`` (0 at its end)."""
    _check(cursor, length, batch_size, participants)
    return min(batch_size * participants, length - cursor)


def deal(cursor: int, *, length: int, batch_size: int, participant: int, participants: int) -> tuple[int, ...]:
    """The epoch positions ``participant`` (0-based, of ``participants``) trains in the step from ``cursor``.

    A full step gives each participant ``batch_size`` of them, in blocks; the
    tail gives each ``ceil(rest / participants)``, wrapping round to the
    rest's start for the last shares (see the module docstring).

    Raises:
        ValueError: a count below 1, ``participant`` not below ``participants``,
            or ``cursor`` at or past the epoch's end (no step is left to deal).
    """
    _check(cursor, length, batch_size, participants)
    _INDEX.check(participant, "participant", owner="dealing")
    if participant >= participants:
        raise ValueError(f"dealing: participant {participant} of {participants}: it must be below the count")
    rest = length - cursor
    if rest <= 0:
        raise ValueError(f"dealing: the epoch's {length} positions are all consumed (cursor {cursor}): nothing to deal")
    share = batch_size if rest >= batch_size * participants else -(-rest // participants)
    start = cursor + participant * share
    return tuple(cursor + (p - cursor) % rest for p in range(start, start + share))


def steps_left(cursor: int, *, length: int, batch_size: int, participants: int, drop_last: bool) -> int:
    """The steps left in the epoch from ``cursor`` for ``participants`` (the tail one included unless ``drop_last``)."""
    _check(cursor, length, batch_size, participants)
    is_bool.check(drop_last, "drop_last", owner="dealing")
    rest, per_step = length - cursor, batch_size * participants
    return rest // per_step if drop_last else -(-rest // per_step)


def advanced(cursor: int, *, length: int, batch_size: int, participants: int) -> int:
    """The cursor after a committed step of ``participants`` from ``cursor``."""
    return cursor + step_positions(cursor, length=length, batch_size=batch_size, participants=participants)
