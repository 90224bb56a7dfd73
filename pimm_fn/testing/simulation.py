"""Simulating a hook list over many ranks and schedules: its inputs, the run, and its result.

``simulate`` runs the same pure core the real loop runs (``next_event``,
``process``, the hooks), once per rank, feeding each rank its own step
outputs (``local``) and evaluation results (``metrics``). What differs from
a real run is only the executor: it records effects instead of performing
them, exactly as the interpreter records what it executed (``MAIN`` effects
appear on rank 0 only), and answers ``Evaluate`` like ``plan`` does.

``resume_at`` kills the run at a checkpoint and restarts every rank from the
state that checkpoint holds, as ``loop(resume=...)`` would.

Runs of steps on which no hook is called are crossed in one jump
(``skip_quiet``, see ``pimm_fn.core.plan.run_schedule``), so a long run with
sparse cadences costs about what its busy steps cost; the result is the
same as walking every event.

``simulate``'s arguments, checked and made into what each simulated rank is fed.

Metrics (``metric_source``), step outputs (``outputs_of``), the steps to
resume at (``resume_step``, ``resume_points``; one a stopped run never reaches: ``past_the_end``)
and each process's preemption boundaries (``stops_of``): every one refused
with an error naming the argument.

What ``simulate`` returns: each rank's executed effects (``SimEntry``) and where each rank ended.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.budget import check_budget
from pimm_fn.core.effects import Effect, SaveCheckpoint, Scope
from pimm_fn.core.events import Event
from pimm_fn.core.fold import Chain, TraceEntry, chain
from pimm_fn.core.plan import MetricSource, RecordingExecutor, initial_state, run_schedule
from pimm_fn.core.preemption import Boundaries
from pimm_fn.core.processing import process
from pimm_fn.core.state import State
from pimm_fn.core.validate import int_at_least, is_bool

__all__ = [
    "check_count",
    "metric_source",
    "outputs_of",
    "resume_step",
    "resume_points",
    "past_the_end",
    "stops_of",
    "hook_list",
    "SimEntry",
    "SimulationResult",
    "simulate",
]


def check_count(name, value, minimum):
    """``value`` is an int >= ``minimum``, else an error naming ``simulate``'s argument ``name``."""
    int_at_least(minimum).check(value, name, owner="simulate")


def metric_source(metrics) -> Callable:
    """``metrics`` as ``source(step, rank) -> values or None``, what the executor answers ``Evaluate`` with."""
    if metrics is None:
        return lambda step, rank: None
    if isinstance(metrics, Mapping):
        for step, values in metrics.items():
            if not isinstance(step, int) or not isinstance(values, Mapping):
                raise TypeError(
                    f"simulate: 'metrics' as a mapping must be {{step: {{name: value}}}} (got {step!r}: {values!r:.80})"
                )
        return lambda step, rank: metrics.get(step)
    if callable(metrics):

        def checked(step, rank):
            values = metrics(step, rank)
            if values is not None and not isinstance(values, Mapping):
                raise TypeError(
                    f"simulate: metrics({step}, {rank}) must return a mapping of metric names to numbers "
                    f"or None (got {values!r:.80})"
                )
            return values

        return checked
    raise TypeError(
        f"simulate: 'metrics' must be None, a mapping {{step: {{name: value}}}} or a callable "
        f"metrics(step, rank) (got {metrics!r:.80})"
    )


def outputs_of(local, rank) -> Callable | None:
    """``rank``'s step outputs, ``outputs(step) -> mapping``, from ``local(step, rank)``; ``None`` without ``local``."""
    if local is None:
        return None
    if not callable(local):
        raise TypeError(f"simulate: 'local' must be a callable local(step, rank) -> mapping (got {local!r:.80})")

    def outputs(step):
        values = local(step, rank)
        if values.__class__ is dict:  # the common case, checked first: this runs every step
            return values
        if values is None:
            return {}
        if not isinstance(values, Mapping):
            raise TypeError(
                f"simulate: local({step}, {rank}) must return a mapping of step outputs or None (got {values!r:.80})"
            )
        return values

    return outputs


def resume_step(k: object, max_steps: int, resume_at: object) -> int:
    """``k``, one step of ``resume_at``, when it is an int in ``[1, max_steps]``; else an error showing ``resume_at``."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= max_steps:
        raise ValueError(
            f"simulate: 'resume_at' must hold steps in [1, {max_steps}] (the run's steps; got {resume_at!r})"
        )
    return k


def resume_points(resume_at, max_steps: int) -> tuple[int, ...]:
    """``resume_at`` (None, an int, or increasing ints) as a validated tuple."""
    if resume_at is None:
        return ()
    points = (resume_at,) if isinstance(resume_at, int) and not isinstance(resume_at, bool) else tuple(resume_at)
    steps = tuple(resume_step(k, max_steps, resume_at) for k in points)
    if any(a >= b for a, b in zip(steps, steps[1:])):
        raise ValueError(f"simulate: 'resume_at' must be strictly increasing (got {resume_at!r})")
    return steps


def past_the_end(k: int, ended) -> str:
    """What to say of ``resume_at=k`` in a run that a hook stopped at an earlier step, ending in state ``ended``."""
    step = ended.progress.global_step
    return (
        f"simulate: resume_at holds step {k}, but the run ended at step {step} before reaching it: a hook stopped "
        f"it ({ended.stop}). Resume at steps up to {step} (assert_resume_continuity leaves out the steps after "
        f"the run's end itself)"
    )


def stops_of(preempt, world_size, every, clock, max_time, margin, points):
    """A maker of each process's ``Boundaries`` (the first process gets the signals), or ``None`` without any."""
    if every is not None:
        check_count("check_every", every, 1)
    elif clock is None:
        raise TypeError("simulate: check_every=None (rank 0 picks the cadence from its clock) needs a 'clock'")
    if max_time is not None and clock is None:
        raise TypeError("simulate: 'max_time' needs a 'clock' (clock(step) -> rank 0's seconds since training began)")
    requests = dict(preempt or {})
    for rank, step in requests.items():
        if not (isinstance(rank, int) and 0 <= rank < world_size and isinstance(step, int) and step >= 1):
            raise ValueError(
                f"simulate: 'preempt' must map ranks in [0, {world_size}) to steps >= 1 (got {rank!r}: {step!r})"
            )
    if not requests and max_time is None and clock is None:
        return None
    if points:
        raise ValueError("simulate: pass either 'resume_at' or 'preempt'/'clock'/'max_time', not both")

    def stops(first: bool) -> Boundaries:
        """The first process of a rank gets the signals; a resumed one only its clock and budget."""
        return Boundaries(
            requests if first else {}, world_size=world_size, every=every, max_time=max_time, margin=margin
        )

    return stops


def hook_list(hooks) -> list:
    """``hooks`` as a list, refused when it is a single hook or not a list."""
    if callable(hooks) or not isinstance(hooks, Iterable):
        raise TypeError(f"simulate: 'hooks' must be a list of hooks (got {hooks!r:.80}); wrap a single hook: [hook]")
    return list(hooks)


@attrs.frozen
class SimEntry:
    """One effect a rank executed.

    Attributes:
        step: the global step when it executed.
        event: the event whose hooks emitted it (rank-local ``AfterStep``
            outputs included).
        effect: what was requested.
        hook: the emitting hook's index in the hook list.
        rank: the rank that executed it.
        during: the lifecycle event (by name) being processed, which is the
            entry's own event or the one whose follow-up (``MetricsPublished``)
            emitted it. ``(step, during)`` names the same moment on every rank.
    """

    step: int
    event: Event
    effect: Effect
    hook: int
    rank: int
    during: str | None = None

    def to_trace_entry(self) -> TraceEntry:
        """This entry as ``plan`` reports it."""
        return TraceEntry(self.step, self.event, self.effect, self.hook)


@attrs.frozen
class SimulationResult:
    """What every rank executed, and where it ended.

    Attributes:
        hooks: the simulated hooks, as one ``Chain``.
        traces: one tuple of ``SimEntry`` per rank, in execution order.
        states: each rank's final ``State``.
        resume_at: the steps at which the run was killed and resumed.
        resume_index: per rank, the trace length at each resume: entries
            before it come from the run that was killed.
        preempted: per rank, the ``(step, reason)`` of each preemption or
            time-budget stop (``preempt``, ``max_time``), where that rank
            saved, stopped and was resumed.
    """

    hooks: Chain
    traces: tuple
    states: tuple
    resume_at: tuple = ()
    resume_index: tuple = ()
    preempted: tuple = ()

    @property
    def world_size(self) -> int:
        return len(self.traces)

    def collective(self, rank: int) -> tuple:
        """The ``COLLECTIVE`` entries of ``rank``'s trace (identical on every rank when all is well)."""
        return tuple(e for e in self.traces[rank] if e.effect.scope is Scope.COLLECTIVE)

    def effects(self, rank: int = 0, kind: type = Effect) -> tuple:
        """The effects of type ``kind`` that ``rank`` executed, in order."""
        return tuple(e.effect for e in self.traces[rank] if isinstance(e.effect, kind))


_RESUMED = ev.BeforeTrain(resumed=True)


@attrs.define
class _SimExecutor(RecordingExecutor):
    """Records like the interpreter and captures the state a checkpoint would hold."""

    rank: int = 0
    entries: list = attrs.field(factory=list)
    target: int | None = None  # the step whose checkpoint ends this segment
    captured: State | None = None

    def execute(self, state: State, entry: TraceEntry) -> tuple:
        effect = entry.effect
        if effect.scope is Scope.MAIN and self.rank != 0:
            return ()  # the interpreter runs MAIN effects on rank 0 only
        self.entries.append(SimEntry(entry.step, entry.event, effect, entry.hook, self.rank, state.position))
        if self.target is not None and self.captured is None and isinstance(effect, SaveCheckpoint):
            if effect.step == self.target:
                self.captured = state  # what the save handler writes
        return super().execute(state, entry)

    def at_checkpoint(self, state: State) -> bool:
        """After each lifecycle event: has this segment reached the checkpoint of ``target``?"""
        if self.captured is not None:
            return True
        p = state.progress
        if p.global_step != self.target:
            return False
        # A save at step k is written after AfterStep(k), or after AfterEpoch when k ends an epoch.
        if state.position == "AfterEpoch" or (state.position == "AfterStep" and not p.at_epoch_end):
            self.captured = state
            return True
        return False


def _run_rank(hooks: Chain, state: State, executor: _SimExecutor, outputs, points, index: list, skip_quiet) -> State:
    for k in points:
        executor.target, executor.captured = k, None
        # visit=k: a jump over quiet steps ends before step k, whose checkpoint point ends the segment.
        ended = run_schedule(
            hooks, state, executor, outputs, stop=executor.at_checkpoint, visit=k, skip_quiet=skip_quiet
        )
        if executor.captured is None:
            raise ValueError(past_the_end(k, ended))
        index.append(len(executor.entries))
        # A real resume: restore the checkpoint's state, dispatch BeforeTrain(resumed=True), go on.
        state = process(hooks, executor.captured, _RESUMED, executor)
    executor.target = None
    return run_schedule(hooks, state, executor, outputs, skip_quiet=skip_quiet)


def _run_preempted(hooks, state, executor, outputs, skip_quiet, stops, clock, index: list) -> tuple:
    """Run to the end, stopping where ``stops()`` (a fresh ``Boundaries`` per process) says; each stop resumes.

    Returns the final state and the ``(step, reason)`` of each stop.
    """
    stopped: list[tuple[int, str]] = []
    start = 0.0
    while True:
        decider = stops(first=not stopped)
        shifted = (lambda s, c=start: clock(s) - c) if clock is not None else None
        decider.clock = shifted
        state = run_schedule(hooks, state, executor, outputs, skip_quiet=skip_quiet, clock=shifted, boundary=decider)
        if decider.stopped is None:
            return state, tuple(stopped)
        stopped.append(decider.stopped)
        index.append(len(executor.entries))
        start = clock(decider.stopped[0]) if clock is not None else 0.0
        # The preemption save holds this state; the requeued process resumes from it.
        state = process(hooks, state, _RESUMED, executor)


def simulate(
    hooks: Iterable[Any] | Chain,
    *,
    world_size: int,
    iters_per_epoch: int,
    max_epochs: int | None = None,
    max_steps: int | None = None,
    metrics: Mapping[int, Mapping[str, float]] | MetricSource | None = None,
    local: Callable[[int, int], Mapping[str, Any] | None] | None = None,
    resume_at: int | Iterable[int] | None = None,
    skip_quiet: bool = True,
    preempt: Mapping[int, int] | None = None,
    clock: Callable[[int], float] | None = None,
    max_time: float | None = None,
    margin: float = 0.0,
    check_every: int | None = 1,
) -> SimulationResult:
    """Run ``hooks`` on every rank of a simulated job and return each rank's trace.

    Each rank walks the real lifecycle through the real fold. Nothing is
    shared between ranks but the inputs you give, so any difference between
    their traces comes from the hooks.

    Args:
        hooks: the hook list, as given to ``loop`` (or one ``Chain``).
        world_size: number of ranks (>= 1).
        iters_per_epoch: the schedule's steps per epoch.
        max_epochs: the schedule's epochs.
        max_steps: instead of ``max_epochs``, train this many global steps,
            as ``loop(max_steps=N)`` does (``pimm_fn.core.budget``).
        metrics: what an evaluation at ``step`` returns: ``{step: {name:
            value}}`` (the same on every rank), or ``metrics(step, rank)``
            returning a mapping or ``None`` (that rank computed nothing). As
            in a real run, a broadcasting evaluator publishes rank 0's result
            on every rank.
        local: ``local(step, rank)`` returning the rank-local outputs of
            ``step`` (losses), delivered in ``AfterStep``; default none.
        resume_at: a step, or strictly increasing steps, at which the run is
            killed just after that step's checkpoint point and resumed from
            the state the checkpoint holds: the state a ``SaveCheckpoint``
            of that step was written with, or, when no hook saved it, the
            state after ``AfterStep(k)`` (after ``AfterEpoch`` when ``k`` ends
            an epoch). Each trace is then the stitched run: up to the
            checkpoint, ``BeforeTrain(resumed=True)``, and on. A step after
            the one a hook stopped the run at (``early_stop``) is refused.
        skip_quiet: cross runs of steps on which no hook is called in one
            jump (see ``pimm_fn.core.plan.run_schedule``); the traces and
            states are the same either way, ``False`` walks every event
            (and calls ``local`` for every step).
        preempt: ``{rank: step}``: a preemption signal reaches ``rank``
            during ``step`` (any subset of ranks, any steps). Every rank
            stops at the boundary ``loop(preemption=...)`` agrees on
            (``pimm_fn.core.preemption``), its state is what the save there
            holds, and the run resumes from it, as a requeued job with
            ``resume="auto"``; ``preempted`` says where.
        clock: ``clock(step)``, rank 0's seconds since training began at the
            end of ``step``: delivered as ``Elapsed`` to the hooks that listen
            (``save_every(minutes=...)``), and read by ``max_time``. A resumed
            process's clock starts again at its first step.
        max_time: with ``clock``: stop (save, resume) at the last
            boundary whose next step would pass ``max_time - margin``, as
            ``loop(max_time=..., preemption=Preemption(margin=...))``.
        margin: seconds, the time left before ``max_time`` (``Preemption(margin=...)``).
        check_every: ``Preemption(check_every=...)``: with several ranks,
            the steps between the ranks' comparisons, or ``None`` (the
            runtime's default; needs ``clock``): rank 0 picks them, about
            one a second (``pimm_fn.core.preemption.next_cadence``).

    Returns:
        A ``SimulationResult`` with ``traces`` and ``states``, one per rank.

    Raises:
        ValueError, TypeError: on an invalid argument, naming it; a
            ``resume_at`` step the run never reaches (a hook stopped it
            first), naming the step it ended at.

    >>> from pimm_fn.hooks import save_every
    >>> result = simulate([save_every(4)], world_size=2, iters_per_epoch=10, max_epochs=3)
    >>> [e.step for e in result.traces[1]]
    [4, 8, 12, 16, 20, 24, 28, 30]
    >>> [e.during for e in result.traces[1]][4:]
    ['AfterEpoch', 'AfterStep', 'AfterStep', 'AfterTrain']
    """
    hooks = hooks if isinstance(hooks, Chain) else chain(*hook_list(hooks))
    check_count("world_size", world_size, 1)
    check_count("iters_per_epoch", iters_per_epoch, 1)
    check_budget(max_epochs, max_steps, caller="simulate")
    is_bool.check(skip_quiet, "skip_quiet", owner="simulate")
    source = metric_source(metrics)
    # Without max_steps, max_epochs is given: check_budget saw to that.
    points = resume_points(resume_at, max_steps or iters_per_epoch * cast(int, max_epochs))
    stops = stops_of(preempt, world_size, check_every, clock, max_time, margin, points)
    traces, states, indices, preempted = [], [], [], []
    for rank in range(world_size):
        state = initial_state(
            hooks.hooks,
            iters_per_epoch=iters_per_epoch,
            max_epochs=max_epochs,
            max_steps=max_steps,
            rank=rank,
            world_size=world_size,
        )
        executor = _SimExecutor(source, rank=rank)
        index: list = []
        if stops is None:
            states.append(_run_rank(hooks, state, executor, outputs_of(local, rank), points, index, skip_quiet))
        else:
            final, stopped = _run_preempted(
                hooks, state, executor, outputs_of(local, rank), skip_quiet, stops, clock, index
            )
            states.append(final)
            preempted.append(stopped)
        traces.append(tuple(executor.entries))
        indices.append(tuple(index))
    return SimulationResult(hooks, tuple(traces), tuple(states), points, tuple(indices), tuple(preempted))
