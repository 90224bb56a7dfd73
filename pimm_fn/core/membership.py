"""Which replica groups take part in each step of a fault-tolerant job, and the epoch's length for them.

A ``Membership`` says which replicas are lost at which step and which rejoin
at a later one. Before each step a quorum decides the participants
(``Membership.live``); a replica lost during a step first fails that step's
commit vote (``Membership.attempt``: the participants of the attempt that
is discarded). The epoch is one order dealt from a global cursor
(``pimm_fn.core.dealing``), so when the count changes the epoch's length
becomes the steps done plus the steps left for the new count (``resized``).

Pure: ``plan(membership=...)`` walks the job's one trace by these rules
(``walk``), ``pimm_fn.testing.simulate_replicas`` every replica's in
lockstep; the runtime's switch keeps the same ones.

>>> m = Membership(3, lost={1: 2}, rejoined={1: 4})
>>> m.live(1), m.attempt(2, m.live(1)), m.live(2), m.live(4)
((0, 1, 2), (0, 1, 2), (0, 2), (0, 1, 2))
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import attrs

from pimm_fn.core import dealing
from pimm_fn.core import events as ev
from pimm_fn.core.fold import Chain
from pimm_fn.core.processing import Executor, process
from pimm_fn.core.schedule import next_event
from pimm_fn.core.state import State
from pimm_fn.core.validate import int_at_least, is_bool

__all__ = ["Membership", "resized", "check_epoch", "walk"]

_COUNT = int_at_least(1)


def _pairs(value: object) -> tuple[tuple[int, int], ...]:
    """``{replica: step}`` or ``((replica, step), ...)`` as a tuple of pairs sorted by replica."""
    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, Iterable):
        raise TypeError(f"Membership: expected a mapping {{replica: step}} (got {value!r:.80})")
    pairs = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError(f"Membership: expected a mapping {{replica: step}} (got {value!r:.80})")
        pairs.append(item)
    try:
        return tuple(sorted(pairs))
    except TypeError:  # not replicas and steps: the validator says so
        return tuple(pairs)


def _replica_steps(membership: "Membership", name: str, pairs: tuple[tuple[int, int], ...]) -> None:
    seen = set()
    for replica, step in pairs:
        ok = isinstance(replica, int) and not isinstance(replica, bool) and 0 <= replica < membership.replicas
        if not (ok and isinstance(step, int) and not isinstance(step, bool) and step >= 1):
            raise ValueError(
                f"Membership: '{name}' must map replicas in [0, {membership.replicas}) to steps >= 1 "
                f"(got {replica!r}: {step!r})"
            )
        if replica in seen:
            raise ValueError(f"Membership: '{name}' names replica {replica} twice")
        seen.add(replica)


@attrs.frozen
class Membership:
    """Which replicas are alive at each step: ``replicas`` groups, some lost at a step, some rejoining later.

    Attributes:
        replicas: the replica groups the job runs (>= 1).
        lost: ``{replica: step}``: the replica dies during ``step`` and
            takes part in no step from it on (until it rejoins).
        rejoined: ``{replica: step}``: a lost replica comes back before
            ``step`` (after its loss): it heals from a live peer at the
            boundary and takes part in ``step`` and the steps after.
        failed_votes: a replica lost during a step fails that step's commit
            vote (the default): the step is discarded and drawn again
            without it. ``False``: it is lost between steps, and the quorum
            before ``step`` leaves it out.

    A loss or rejoin after the run's last step never happens.

    Raises:
        ValueError, TypeError: a replica or step out of range, a rejoin that
            is not after its loss or has no loss, or a step at which no
            replica is alive; the error names the argument.

    >>> m = Membership(3, lost={2: 5, 1: 3}, rejoined={1: 6})
    >>> m, m.live(4), m.live(6)
    (Membership(replicas=3, lost=((1, 3), (2, 5)), rejoined=((1, 6),), failed_votes=True), (0, 2), (0, 1))
    """

    replicas: int
    lost: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_pairs)
    rejoined: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_pairs)
    failed_votes: bool = True

    def __attrs_post_init__(self) -> None:
        _COUNT.check(self.replicas, "replicas", owner="Membership")
        _replica_steps(self, "lost", self.lost)
        _replica_steps(self, "rejoined", self.rejoined)
        is_bool.check(self.failed_votes, "failed_votes", owner="Membership")
        lost = dict(self.lost)
        for replica, step in self.rejoined:
            if replica not in lost:
                raise ValueError(f"Membership: 'rejoined' names replica {replica}, which 'lost' does not lose")
            if step <= lost[replica]:
                raise ValueError(
                    f"Membership: 'rejoined' brings replica {replica} back at step {step}: it must be after its "
                    f"loss at step {lost[replica]}"
                )
        for _, step in self.lost:  # the alive set is smallest at a loss
            if not self.live(step):
                raise ValueError(
                    f"Membership: no replica is alive at step {step} ('lost' {dict(self.lost)}, 'rejoined' "
                    f"{dict(self.rejoined)}): a job needs one"
                )

    def live(self, step: int) -> tuple[int, ...]:
        """The replicas alive at ``step`` (lowest first), which take part in it."""
        lost, back = dict(self.lost), dict(self.rejoined)
        return tuple(r for r in range(self.replicas) if not lost.get(r, step + 1) <= step < back.get(r, step + 1))

    def attempt(self, step: int, live: Iterable[int]) -> tuple[int, ...] | None:
        """The participants of ``step``'s first attempt, whose vote fails, or ``None`` when it commits.

        ``live`` are the replicas that took part in the step before. With
        ``failed_votes``, a replica of them lost at ``step`` was counted in its
        quorum and dies in it: the attempt (``live`` and the replicas
        rejoining at ``step``) is discarded and drawn again by ``live(step)``.
        """
        wanted = self.live(step)
        before = set(live)
        if not self.failed_votes or before <= set(wanted):
            return None
        return tuple(sorted(before | set(wanted)))


def resized(
    state: State,
    cursor: int,
    participants: int,
    *,
    length: int,
    batch_size: int,
    drop_last: bool,
    done: int | None = None,
) -> State:
    """``state`` with its epoch as long as the steps done and the steps ``participants`` have left from ``cursor``.

    ``done``: the epoch's steps done, ``iter_in_epoch`` unless given (``0``
    for an epoch about to begin, whose ``BeforeEpoch`` resets the count).

    >>> from pimm_fn.core.state import Progress
    >>> s = State(Progress(5, 1, iter_in_epoch=1, global_step=1))
    >>> resized(s, 3, 1, length=10, batch_size=1, drop_last=False).progress.iters_per_epoch  # 1 done, 7 left
    8
    """
    p = state.progress
    left = dealing.steps_left(
        cursor, length=length, batch_size=batch_size, participants=participants, drop_last=drop_last
    )
    iters = (p.iter_in_epoch if done is None else done) + left
    return state if iters == p.iters_per_epoch else attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=iters))


def check_epoch(
    membership: object, length: object, batch_size: object, drop_last: object, *, owner: str
) -> tuple[Membership, int, int, bool]:
    """The job's membership and its epoch in samples, checked for ``owner`` (``plan``, ``simulate_replicas``).

    With ``drop_last`` the epoch must hold a full step of every replica, so
    that every epoch has a step whoever is alive. Returns the four, typed.
    """
    if not isinstance(membership, Membership):
        raise TypeError(
            f"{owner}: 'membership' must be a Membership, e.g. Membership(3, lost={{1: 4}}) (got {membership!r:.80})"
        )
    _COUNT.check(length, "length", owner=owner)
    _COUNT.check(batch_size, "batch_size", owner=owner)
    is_bool.check(drop_last, "drop_last", owner=owner)
    samples, batch, dropping = cast(int, length), cast(int, batch_size), cast(bool, drop_last)  # checked just above
    if dropping and samples < batch * membership.replicas:
        raise ValueError(
            f"{owner}: with drop_last, 'length' ({samples}) must hold a full step of every replica: "
            f"batch_size * replicas = {batch * membership.replicas}"
        )
    return membership, samples, batch, dropping


def walk(
    hooks: Chain,
    state: State,
    executor: Executor,
    outputs: Callable[[int], Mapping[str, Any] | None] | None,
    membership: Membership,
    *,
    length: int,
    batch_size: int,
    drop_last: bool,
) -> State:
    """Walk ``state`` to the end as every live replica of the job folds it, under ``membership``.

    At each quorum (a step of the epoch next) the participants are
    ``membership.live(step)`` and the epoch is ``resized`` for them; an
    attempt whose vote fails folds its ``BeforeStep`` and is discarded (the
    state back at the boundary); each epoch's order starts at cursor 0 and
    each committed step moves the cursor (``pimm_fn.core.dealing``). Each
    ``AfterStep`` carries ``outputs(step)`` and the share of the epoch a
    participant trained. Every step is walked.
    """

    def sized(state: State, cursor: int, participants: int, done: int | None = None) -> State:
        return resized(
            state, cursor, participants, length=length, batch_size=batch_size, drop_last=drop_last, done=done
        )

    live, cursor = tuple(range(membership.replicas)), 0
    event = next_event(state)
    while event is not None:
        if event.__class__ is ev.BeforeStep:
            attempt = membership.attempt(event.step, live)
            live = membership.live(event.step)
            if attempt is not None:
                tried = sized(state, cursor, len(attempt))
                if next_event(tried) == event:
                    process(hooks, tried, event, executor)  # its vote fails: back at the boundary
            state = sized(state, cursor, len(live))
            if next_event(state) != event:  # no step left for that many in this epoch
                event = next_event(state)
                continue
        elif event.__class__ is ev.BeforeEpoch:
            cursor = 0
            state = sized(state, 0, len(live), done=0)
        elif event.__class__ is ev.AfterStep:
            share = dealing.deal(cursor, length=length, batch_size=batch_size, participant=0, participants=len(live))
            values = outputs(event.step) if outputs is not None else None
            event = ev.AfterStep(event.step, values or {}, len(share))
            cursor = dealing.advanced(cursor, length=length, batch_size=batch_size, participants=len(live))
        state = process(hooks, state, event, executor)
        event = next_event(state)
    return state
