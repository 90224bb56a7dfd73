"""Simulating replica groups under a membership: replicas lost and rejoining at any step, as torchft runs them.

A fault-tolerant job runs as ``replicas`` replica groups (each one process
here: rank 0 of a world of 1). Before each step a quorum decides the
participants, the replicas alive (``Membership``). The epoch is one order of
``length`` positions dealt from a global cursor (``pimm_fn.core.dealing``):
a step of ``n`` participants consumes ``batch_size * n`` positions, so when
the count changes the epoch's length becomes ``iter_in_epoch +
steps_left(cursor, n)`` on every replica. A replica lost during a step fails
that step's commit vote: the step is discarded on every participant (no
``AfterStep``, the state back at the boundary, the cursor unmoved) and drawn
again by the survivors. A replica that rejoins starts as a fresh process,
walks to its first step boundary, and there heals from a live peer: it takes
the peer's whole ``State`` (its own rank and world size kept) and data
cursor, and from then on folds the same events. Collective saves
(``SaveCheckpoint``, ``WriteBest``) are executed by exactly one replica per
step: participating rank 0, the lowest-numbered live replica; every replica
folds them, the others skip the writes.

The quorum of a step is held where it is next: after the step before it,
or, for an epoch's first step, after the epoch's ``BeforeEpoch`` (whose
hooks see the epoch as long as the last quorum's count makes it).
Every step is walked (no quiet stretches: the quorum is held at each
boundary), in lockstep: each event is folded by every live replica, each
from its own state, so any difference between their traces comes from the
hooks. ``simulate_replicas`` returns what each replica folded and executed
(``ReplicasResult``); ``pimm_fn.testing.assertions`` checks it.

>>> from pimm_fn.hooks import save_every
>>> lost = Membership(3, lost={1: 2}, rejoined={1: 4})
>>> result = simulate_replicas([save_every(2)], membership=lost, length=12, batch_size=1, max_epochs=1)
>>> [(s.step, s.participants) for s in result.steps]
[(1, (0, 1, 2)), (2, (0, 2)), (3, (0, 2)), (4, (0, 1, 2)), (5, (0, 1, 2))]
>>> [(s.step, s.replica) for s in result.saves], result.runs[1].absent
([(2, 0), (4, 0), (5, 0)], (2, 3))
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from pimm_fn.core import dealing
from pimm_fn.core import events as ev
from pimm_fn.core.budget import check_budget
from pimm_fn.core.effects import SaveCheckpoint, WriteBest
from pimm_fn.core.fold import Chain, TraceEntry, chain
from pimm_fn.core.membership import Membership, check_epoch, resized
from pimm_fn.core.plan import MetricSource, RecordingExecutor, initial_state
from pimm_fn.core.processing import process
from pimm_fn.core.schedule import next_event
from pimm_fn.core.state import State
from pimm_fn.testing.simulation import SimEntry, hook_list, metric_source

__all__ = ["Membership", "Heal", "Save", "DealtStep", "Moment", "ReplicaRun", "ReplicasResult", "simulate_replicas"]

_SAVES = (SaveCheckpoint, WriteBest)  # what participating rank 0 alone writes


@attrs.frozen
class Heal:
    """A rejoining replica healed from a live peer at a step boundary.

    Attributes:
        replica: the one that rejoined.
        source: the live peer it took its state from (participating rank 0).
        step: the committed step the state is of.
        index: the entries of ``replica``'s trace before the heal (its own
            start as a fresh process, and any earlier life).
        tick: the first moment (``ReplicasResult.moments``) it folds, healed.
        sent: the source's ``State`` at the heal.
        received: the replica's ``State`` just after it (its own rank and
            world size, the rest the source's).
    """

    replica: int
    source: int
    step: int
    index: int
    tick: int
    sent: State
    received: State


@attrs.frozen
class Save:
    """A collective save executed: by one replica, at one moment.

    ``tick`` is the moment (``ReplicasResult.moments``) whose event's effects
    held it; ``step`` and ``during`` as in ``SimEntry``.
    """

    tick: int
    step: int
    during: str | None
    effect: SaveCheckpoint | WriteBest
    replica: int


@attrs.frozen
class DealtStep:
    """A step dealt over its participants: committed, or discarded by a failed vote.

    ``positions[i]`` are the epoch positions participant ``participants[i]``
    trained (``pimm_fn.core.dealing.deal`` from ``cursor``).
    """

    step: int
    epoch: int
    cursor: int
    participants: tuple[int, ...]
    positions: tuple[tuple[int, ...], ...]


@attrs.frozen
class Moment:
    """One event of the run as the live replicas folded it: the global step after it, its name, who was live."""

    step: int
    event: str
    live: tuple[int, ...]


@attrs.frozen
class ReplicaRun:
    """What one replica folded, and where it ended.

    Attributes:
        replica: its number.
        trace: every entry it executed, its processes stitched (a rejoin
            starts a fresh one), saves it skipped included (``saves`` says who wrote).
        ticks: per entry, the moment (``ReplicasResult.moments``) it was
            folded at, or ``None`` for a fresh process's own start before its heal.
        absent: the committed steps it took no part in.
        heals: each time it rejoined.
        state: its final ``State`` (where a replica lost for good died).
    """

    replica: int
    trace: tuple[SimEntry, ...]
    ticks: tuple[int | None, ...]
    absent: tuple[int, ...]
    heals: tuple[Heal, ...]
    state: State


@attrs.frozen
class ReplicasResult:
    """What every replica of a simulated fault-tolerant job folded.

    Attributes:
        hooks: the simulated hooks, as one ``Chain``.
        membership: the membership simulated.
        runs: one ``ReplicaRun`` per replica.
        moments: each event folded, in order (a ``SimEntry``'s tick indexes it).
        steps: the committed steps, in order, as dealt.
        discarded: the steps whose commit vote failed, as dealt.
        saves: each collective save executed, with the replica that executed it.
        length, batch_size, drop_last: the epoch, in samples.
    """

    hooks: Chain
    membership: Membership
    runs: tuple[ReplicaRun, ...]
    moments: tuple[Moment, ...]
    steps: tuple[DealtStep, ...]
    discarded: tuple[DealtStep, ...]
    saves: tuple[Save, ...]
    length: int
    batch_size: int
    drop_last: bool

    @property
    def states(self) -> tuple[State, ...]:
        """Each replica's final ``State``."""
        return tuple(run.state for run in self.runs)


@attrs.define
class _Executor(RecordingExecutor):
    """Records each entry with its moment; writes a save only while this replica is participating rank 0."""

    replica: int = 0
    entries: list[SimEntry] = attrs.field(factory=list)
    ticks: list[int | None] = attrs.field(factory=list)
    saves: list[Save] = attrs.field(factory=list)
    tick: int | None = None
    writes: bool = False

    def execute(self, state: State, entry: TraceEntry) -> tuple[ev.Event, ...]:
        effect = entry.effect
        self.entries.append(SimEntry(entry.step, entry.event, effect, entry.hook, 0, state.position))
        self.ticks.append(self.tick)
        if self.writes and self.tick is not None and isinstance(effect, _SAVES):
            self.saves.append(Save(self.tick, entry.step, state.position, effect, self.replica))
        return super().execute(state, entry)


@attrs.define
class _Replica:
    state: State
    executor: _Executor
    cursor: int = 0
    heals: list[Heal] = attrs.field(factory=list)


def _at_quorum(state: State) -> bool:
    """Whether the walk stands where the quorum of the next step is held: a step of this epoch is next."""
    return next_event(state).__class__ is ev.BeforeStep


@attrs.define
class _Job:
    """The lockstep walk of every replica: the quorum at each boundary, the events, the bookkeeping."""

    hooks: Chain
    membership: Membership
    length: int
    batch_size: int
    drop_last: bool
    max_epochs: int | None
    max_steps: int | None
    source: MetricSource
    local: Callable[[int, int], Mapping[str, Any] | None] | None
    replicas: dict[int, _Replica] = attrs.field(factory=dict)
    live: list[int] = attrs.field(factory=list)
    moments: list[Moment] = attrs.field(factory=list)
    steps: list[DealtStep] = attrs.field(factory=list)
    discarded: list[DealtStep] = attrs.field(factory=list)

    def fresh(self, replica: int, executor: _Executor | None = None) -> _Replica:
        """A replica's process as it starts: a fresh state, every replica counted as a participant."""
        iters = dealing.steps_left(
            0,
            length=self.length,
            batch_size=self.batch_size,
            participants=self.membership.replicas,
            drop_last=self.drop_last,
        )
        state = initial_state(
            self.hooks.hooks, iters_per_epoch=iters, max_epochs=self.max_epochs, max_steps=self.max_steps
        )
        return _Replica(state, executor or _Executor(self.source, replica=replica))

    def run(self) -> None:
        self.live = list(range(self.membership.replicas))
        self.replicas = {r: self.fresh(r) for r in self.live}
        while True:
            lead = self.replicas[self.live[0]].state
            if _at_quorum(lead):
                self.quorum(lead.progress.global_step + 1)
            event = self.next_event()
            if event is None:
                return
            self.fold(event, self.live)

    def next_event(self) -> ev.Event | None:
        events = {r: next_event(self.replicas[r].state) for r in self.live}
        if len(set(events.values())) > 1:
            raise AssertionError(f"simulate_replicas: the live replicas' walks part: {events}")
        return events[self.live[0]]

    def fold(self, event: ev.Event, members: list[int]) -> None:
        """Every one of ``members`` folds ``event``, a moment of the run; a committed step moves the cursor."""
        tick = len(self.moments)
        cursor = self.replicas[members[0]].cursor
        if isinstance(event, ev.AfterStep):
            self.steps.append(self.dealt(event.step, members))
        for r in members:
            replica = self.replicas[r]
            replica.executor.tick, replica.executor.writes = tick, r == members[0]
            given = event
            if isinstance(event, ev.AfterStep):
                outputs = self.local(event.step, r) if self.local is not None else None
                shared = len(self.steps[-1].positions[members.index(r)])
                given = ev.AfterStep(event.step, outputs or {}, shared)
                replica.cursor = dealing.advanced(
                    cursor, length=self.length, batch_size=self.batch_size, participants=len(members)
                )
            elif isinstance(event, ev.BeforeEpoch):  # a new order from its start, its length for the count
                replica.cursor = 0
                replica.state = self.resized(replica, len(members), done=0)
            replica.state = process(self.hooks, replica.state, given, replica.executor)
        step = self.replicas[members[0]].state.progress.global_step
        self.moments.append(Moment(step, type(event).__name__, tuple(members)))

    def dealt(self, step: int, members: list[int]) -> DealtStep:
        lead = self.replicas[members[0]]
        cursor, n = lead.cursor, len(members)
        positions = tuple(
            dealing.deal(cursor, length=self.length, batch_size=self.batch_size, participant=i, participants=n)
            for i in range(n)
        )
        return DealtStep(step, lead.state.progress.epoch, cursor, tuple(members), positions)

    def resized(self, replica: _Replica, participants: int, done: int | None = None) -> State:
        return resized(
            replica.state,
            replica.cursor,
            participants,
            length=self.length,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            done=done,
        )

    def resize(self, members: list[int]) -> None:
        """The epoch's length on every one of ``members`` for their count: the steps done plus the steps left."""
        for r in members:
            self.replicas[r].state = self.resized(self.replicas[r], len(members))

    def quorum(self, step: int) -> None:
        """The quorum before ``step``: rejoining replicas heal, lost ones leave (failing a vote), the epoch resized."""
        wanted = self.membership.live(step)
        attempt = self.membership.attempt(step, self.live)
        for r in wanted:
            if r not in self.live:
                self.heal(r, step - 1)
        if attempt is not None:
            self.attempt(step, list(attempt))
        self.live = list(wanted)
        self.resize(self.live)

    def heal(self, replica: int, step: int) -> None:
        """``replica`` starts as a fresh process, walks to its first boundary, and takes a live peer's state there."""
        old = self.replicas.get(replica)
        fresh = self.fresh(replica, old.executor if old is not None else None)
        if old is not None:
            fresh.heals = old.heals
        fresh.executor.tick, fresh.executor.writes = None, False
        while not _at_quorum(fresh.state):
            event = next_event(fresh.state)
            if event is None:
                break
            fresh.state = process(self.hooks, fresh.state, event, fresh.executor)
        source = self.replicas[self.live[0]]
        # Its whole State and data cursor; its own rank and world size (a process group of its own).
        received = attrs.evolve(source.state, rank=fresh.state.rank, world_size=fresh.state.world_size)
        index = len(fresh.executor.entries)
        fresh.heals.append(Heal(replica, self.live[0], step, index, len(self.moments), source.state, received))
        fresh.state, fresh.cursor = received, source.cursor
        self.replicas[replica] = fresh

    def attempt(self, step: int, members: list[int]) -> None:
        """Step ``step`` drawn by ``members``, one of which dies in it: the vote fails, the step is discarded.

        Every one of them is then back at the boundary, as the quorum found it:
        no ``AfterStep``, the cursor unmoved, the epoch's length its own again.
        """
        boundary = {r: (self.replicas[r].state, self.replicas[r].cursor) for r in members}
        self.resize(members)
        # Unless the epoch has no step left for that many: then the loss is seen at the quorum alone.
        if next_event(self.replicas[members[0]].state) == ev.BeforeStep(step):
            self.discarded.append(self.dealt(step, members))
            self.fold(ev.BeforeStep(step), members)
        for r, (state, cursor) in boundary.items():
            self.replicas[r].state, self.replicas[r].cursor = state, cursor

    def result(self) -> ReplicasResult:
        runs = []
        for r in range(self.membership.replicas):
            replica = self.replicas[r]
            executor = replica.executor
            absent = tuple(s.step for s in self.steps if r not in s.participants)
            runs.append(
                ReplicaRun(
                    r, tuple(executor.entries), tuple(executor.ticks), absent, tuple(replica.heals), replica.state
                )
            )
        saves = sorted((s for replica in self.replicas.values() for s in replica.executor.saves), key=lambda s: s.tick)
        return ReplicasResult(
            self.hooks,
            self.membership,
            tuple(runs),
            tuple(self.moments),
            tuple(self.steps),
            tuple(self.discarded),
            tuple(saves),
            self.length,
            self.batch_size,
            self.drop_last,
        )


def simulate_replicas(
    hooks: Iterable[Any] | Chain,
    *,
    membership: Membership,
    length: int,
    batch_size: int,
    max_epochs: int | None = None,
    max_steps: int | None = None,
    drop_last: bool = False,
    metrics: Mapping[int, Mapping[str, float]] | MetricSource | None = None,
    local: Callable[[int, int], Mapping[str, Any] | None] | None = None,
) -> ReplicasResult:
    """Run ``hooks`` on every replica of a fault-tolerant job under ``membership``; see the module.

    Args:
        hooks: the hook list, as given to ``loop`` (or one ``Chain``).
        membership: the replicas, and which are lost and rejoin when.
        length: the epoch's samples (positions of its order).
        batch_size: each participant's samples a step.
        max_epochs: the epochs to train; or
        max_steps: the global steps to train, as ``loop(max_steps=N)``: the
            epoch in progress at step ``N`` ends there (``pimm_fn.core.budget``).
        drop_last: leave out the epoch's tail of fewer than a full step's
            samples (else each participant trains an equal share of it).
        metrics: what an evaluation at ``step`` returns, as for ``simulate``
            (``metrics(step, 0)``: each replica is rank 0 of its group).
        local: ``local(step, replica)``, that replica's step outputs.

    Returns:
        A ``ReplicasResult``.

    Raises:
        ValueError, TypeError: an invalid argument, naming it.
    """
    check_epoch(membership, length, batch_size, drop_last, owner="simulate_replicas")
    chained = hooks if isinstance(hooks, Chain) else chain(*hook_list(hooks))
    check_budget(max_epochs, max_steps, caller="simulate_replicas", min_epochs=1)
    if local is not None and not callable(local):
        raise TypeError(f"simulate_replicas: 'local' must be a callable local(step, replica) (got {local!r:.80})")
    job = _Job(chained, membership, length, batch_size, drop_last, max_epochs, max_steps, metric_source(metrics), local)
    job.run()
    return job.result()
