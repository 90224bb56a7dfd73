"""A dry run of a hook list: which effects would execute, when, without torch.

``plan`` walks the same lifecycle as the real loop and folds the same hooks;
only the executor differs: it records each effect and answers ``Evaluate``
with the metrics you supply. A real run's ``trace`` equals its plan.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import summary
from pimm_fn.core.budget import check_budget, epochs_reaching, fresh_progress
from pimm_fn.core.dealing import steps_left
from pimm_fn.core.effects import Effect, Evaluate, Stop
from pimm_fn.core.fold import Chain, TraceEntry, chain, init_slots
from pimm_fn.core.frozen import freeze
from pimm_fn.core.membership import Membership, check_epoch, walk
from pimm_fn.core.preemption import Boundaries
from pimm_fn.core.processing import Executor, process
from pimm_fn.core.schedule import last_quiet_step, next_event, skip_to, state_at_step
from pimm_fn.core.state import Progress, State
from pimm_fn.core.trace import Trace

__all__ = ["plan", "RecordingExecutor", "initial_state", "run_schedule", "at_boundary"]

MetricSource = Callable[[int, int], Mapping[str, float] | None]  # (step, rank) -> the metrics, or None
OutputSource = Callable[[int], Mapping[str, float] | None]  # step -> the step's scalar outputs


def initial_state(
    hooks: Iterable[Any],
    *,
    iters_per_epoch: int,
    max_epochs: int | None = None,
    max_steps: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    config: Mapping[str, Any] | None = None,
) -> State:
    """The state a fresh run of ``hooks`` starts from, with one budget: ``max_epochs`` or ``max_steps``."""
    progress = fresh_progress(iters_per_epoch, max_epochs=max_epochs, max_steps=max_steps)
    return State(progress, rank=rank, world_size=world_size, config=config or {}, slots=init_slots(hooks))


@attrs.define
class RecordingExecutor:
    """Executes nothing: records each effect and answers evaluations from ``metrics``.

    ``metrics(step, rank)`` returns the mapping an evaluation at ``step``
    produces on ``rank``, or ``None`` when that rank computed nothing. With
    ``broadcast`` the main rank's result is what every rank publishes. A
    ``Stop`` is answered with ``StopRequested``, as the real interpreter
    answers it, so a planned run ends where the real one does.
    """

    metrics: MetricSource
    trace: list[TraceEntry] = attrs.field(factory=list)

    def check(self, state: State, event: ev.Event, emitted: list[tuple[int, Effect]]) -> None:
        pass

    def execute(self, state: State, entry: TraceEntry) -> tuple[ev.Event, ...]:
        effect = entry.effect
        if getattr(effect, "traced", True):  # as the interpreter's trace: the progress bar's moves left out
            self.trace.append(entry)
        if not isinstance(effect, Evaluate):
            return (ev.StopRequested(effect.step, effect.reason),) if isinstance(effect, Stop) else ()
        source_rank = 0 if effect.broadcast else state.rank
        values = self.metrics(effect.step, source_rank) or {}
        return (
            ev.MetricsPublished(
                values, effect.evaluator, effect.step, consistent=effect.broadcast, weights=effect.weights
            ),
        )


def at_boundary(event: ev.Event, following: ev.Event | None) -> bool:
    """Whether the walk stands at a step boundary: a step's events (and its epoch's end) done, the next step ahead.

    Where the runtime delivers ``Elapsed`` and may stop for preemption or
    time (``pimm_fn.runtime.engine.preemption``); the end of training is none.
    """
    cls, after = event.__class__, following.__class__
    return (cls is ev.AfterStep and after is ev.BeforeStep) or (cls is ev.AfterEpoch and after is ev.BeforeEpoch)


def run_schedule(
    hooks: Chain,
    state: State,
    executor: Executor,
    outputs: OutputSource | None = None,
    *,
    stop: Callable[[State], bool] | None = None,
    visit: int | None = None,
    skip_quiet: bool = True,
    clock: Callable[[int], float] | None = None,
    boundary: Callable[[State], bool] | None = None,
) -> State:
    """Walk the lifecycle from ``state`` to the end (or until ``stop(state)``, checked after each event).

    ``outputs(step)`` supplies each ``AfterStep``'s scalar outputs.

    With ``skip_quiet`` (the default) the events no hook is called for are
    not processed one by one. A ``BeforeStep`` no hook subscribes to only
    moves the position (``advance``). A run of quiet steps, on which no hook
    is called at all, is crossed in one jump (``skip_to``): steps are quiet
    when no hook subscribes to ``BeforeStep``; the jump ends just before
    the next step on which an ``AfterStep`` cadence fires, the epoch's last
    step, or ``visit`` (``last_quiet_step``), and those are walked as usual.
    The outputs of the steps jumped over go, in step order, to the hooks
    that accumulate them, as the walk would hand them. The trace and every
    state reached are what the event-by-event walk gives; what is not done
    is ``executor.check`` for the events not processed (which emit
    nothing, on every rank alike).

    A ``stop`` that could turn true on a quiet step needs ``visit``: the one
    step it waits for there (``stop`` is still asked after each jump). With
    ``stop`` and no ``visit``, no step is jumped over.

    At each step boundary (``at_boundary``), ``clock(step)`` (seconds) is
    delivered as ``Elapsed`` when a hook listens to it, then
    ``boundary(state)`` is asked whether the run stops there (a preemption);
    with either, every step is walked.
    """
    before_step_quiet = skip_quiet and not hooks.active(ev.BeforeStep)
    ticking = clock if clock is not None and hooks.active(ev.Elapsed) else None  # when a hook listens to Elapsed
    jumps = before_step_quiet and (stop is None or visit is not None) and ticking is None and boundary is None
    event = next_event(state)
    while event is not None:
        if before_step_quiet and isinstance(event, ev.BeforeStep):
            if jumps:
                last = last_quiet_step(hooks, state.progress, visit)
                if last > state.progress.global_step:
                    state = _jump(hooks, state, last, outputs)
                    if stop is not None and stop(state):
                        return state
                    event = next_event(state)
                    continue  # on from the jump's end as from any state: the step after it is walked
            if isinstance(event, ev.BeforeStep):  # no hook is called for it: the AfterStep after it moves the position
                event = ev.AfterStep(event.step)
        if isinstance(event, ev.AfterStep) and outputs is not None:
            event = ev.AfterStep(event.step, outputs(event.step))
        state = process(hooks, state, event, executor)
        if stop is not None and stop(state):
            return state
        following = next_event(state)
        if (ticking is not None or boundary is not None) and at_boundary(event, following):
            if ticking is not None:
                step = state.progress.global_step
                state = process(hooks, state, ev.Elapsed(step, ticking(step)), executor)
            if boundary is not None and boundary(state):
                return state
            following = next_event(state)
        event = following
    return state


def _jump(hooks: Chain, state: State, last: int, outputs: OutputSource | None) -> State:
    """``skip_to(state, last)``, the steps' outputs handed to the accumulating hooks on the way."""
    if outputs is None or not hooks._accumulators:
        return skip_to(state, last)
    slots = state.slots
    for step in range(state.progress.global_step + 1, last + 1):
        values = freeze(outputs(step))
        if values:
            slots = hooks._accumulate(slots, values)
    return skip_to(state, last, slots=slots)


def _state_at(state: State, start: Progress) -> State:
    """``state`` at the resumed progress ``start``: after its last step, its epoch's end, or its epoch's start."""
    planned = state.progress
    progress = attrs.evolve(
        start, iters_per_epoch=planned.iters_per_epoch, max_epochs=planned.max_epochs, step_limit=planned.step_limit
    )
    if progress.at_epoch_end:
        position = "AfterEpoch"
    else:
        position = "AfterStep" if progress.iter_in_epoch else "BeforeEpoch"
    state = attrs.evolve(state, progress=progress, position=position)
    if progress.step_limit is None:
        return state
    return attrs.evolve(state, progress=attrs.evolve(progress, max_epochs=epochs_reaching(state)))


def _metric_source(metrics: Mapping[int, Mapping[str, float]] | MetricSource | None) -> MetricSource:
    if metrics is None:
        return lambda step, rank: None
    if callable(metrics):
        return metrics
    if isinstance(metrics, Mapping):
        return lambda step, rank: metrics.get(step)
    raise TypeError(f"'metrics' must be a mapping {{step: {{name: value}}}} or a callable (got {metrics!r:.80})")


def _placeholders(outputs: tuple[str, ...]) -> OutputSource | None:
    """``outputs(step)`` giving each named output the placeholder 0.0, or ``None`` for no outputs."""
    if isinstance(outputs, str) or not all(isinstance(name, str) for name in outputs):
        raise TypeError(f"plan: 'outputs' must be a tuple of output names, e.g. ('loss',) (got {outputs!r:.80})")
    if not outputs:
        return None
    values = dict.fromkeys(outputs, 0.0)
    return lambda step: values


def plan(
    hooks: Iterable[Any],
    *,
    iters_per_epoch: int | None = None,
    max_epochs: int | None = None,
    max_steps: int | None = None,
    start_step: int = 0,
    start: Progress | None = None,
    metrics: Mapping[int, Mapping[str, float]] | MetricSource | None = None,
    outputs: tuple[str, ...] = ("loss",),
    clock: Callable[[int], float] | None = None,
    max_time: float | None = None,
    margin: float = 0.0,
    membership: Membership | None = None,
    length: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
) -> Trace:
    """The effects ``hooks`` would execute, in order, as ``TraceEntry`` values.

    Args:
        hooks: a list of hooks, as given to ``loop``.
        iters_per_epoch: the schedule's steps per epoch.
        max_epochs: the schedule's epochs.
        max_steps: instead of ``max_epochs``, train this many global steps,
            as ``loop(max_steps=N)``: the epoch in progress at step ``N``
            ends there (its ``AfterEpoch`` runs, a save on step ``N`` is
            deferred past it) and training ends (``pimm_fn.core.budget``).
        start_step: plan a run resumed from the checkpoint of this global step.
            The hooks start from fresh slots (a dry run cannot know what a
            checkpoint holds), so a hook whose decision reads its slot, such
            as ``save_every``'s final save, may differ from a real resume;
            ``pimm_fn.testing.simulate(resume_at=...)`` resumes from the
            exact states instead.
        start: plan a run resumed at this progress instead: a restored
            ``run.state.progress`` after a resume on another world size or
            batch size, whose ``global_step`` no longer equals
            ``epoch * iters_per_epoch + iter_in_epoch``. Its steps per epoch
            and epochs are the ones given here. Slots start fresh, as above.
        metrics: ``{step: {name: value}}`` an evaluation at ``step`` returns.
        outputs: the names the train step reports (the default step reports
            ``loss``). Each ``AfterStep`` of the dry run carries them with the
            placeholder value ``0.0``, so a hook reading ``outputs["loss"]``
            runs in ``plan`` as in a real run; ``()`` sends empty outputs.
        clock: ``clock(step)``, the seconds since training began at the end
            of global step ``step``: the run's clock as a value, delivered as
            ``Elapsed`` to the hooks that listen (``save_every(minutes=...)``).
        max_time: seconds (with ``clock``): the plan ends at the last
            step boundary whose next step would pass ``max_time - margin``,
            where ``loop(max_time=...)`` saves and stops (that save is the
            runtime's, not a hook's effect, so it is not in the trace).
        margin: seconds, the time left before ``max_time`` for that save.
        membership: plan a fault-tolerant job whose replicas are lost and
            rejoin as this ``Membership`` (``pimm_fn.testing.Membership``) says, with
            its epoch in samples (``length``, ``batch_size``, ``drop_last``)
            instead of ``iters_per_epoch``: the epoch's steps follow the
            count of replicas alive (``pimm_fn.core.dealing``), a step whose
            vote fails is drawn again. The trace is the one every live
            replica folds, its saves the ones participating rank 0 writes,
            where training ends included. With ``max_epochs`` or
            ``max_steps`` (no resume or clock).
        length: the epoch's samples, with ``membership``.
        batch_size: each replica's samples a step, with ``membership``.
        drop_last: with ``membership``, leave out the epoch's tail of fewer
            than a full step's samples.

    Returns:
        A ``Trace`` of ``TraceEntry`` (``.step``, ``.event``, ``.effect``,
        ``.hook``), the type of a real run's ``run.trace``: it shows as a
        table with the hooks by identity and equals a list or tuple of the
        same entries.

    >>> from pimm_fn.hooks import save_every
    >>> [e.step for e in plan([save_every(4)], iters_per_epoch=10, max_epochs=3)]
    [4, 8, 12, 16, 20, 24, 28, 30]
    >>> [(e.step, type(e.event).__name__) for e in plan([save_every(4)], iters_per_epoch=10, max_steps=24)][-2:]
    [(20, 'AfterEpoch'), (24, 'AfterEpoch')]
    >>> lost = Membership(2, lost={1: 3})  # 12 samples, 2 a replica a step: two replicas, then one from step 3
    >>> [e.step for e in plan([save_every(2)], membership=lost, length=12, batch_size=2, max_epochs=1)]
    [2, 4]
    """
    check_budget(max_epochs, max_steps, caller="plan")
    chained = chain(*hooks)
    placeholders = _placeholders(outputs)
    if membership is not None:
        return _plan_replicas(
            chained, membership, length, batch_size, drop_last, max_epochs, max_steps, metrics, placeholders, locals()
        )
    if iters_per_epoch is None:
        raise TypeError(
            "plan: 'iters_per_epoch' is required (or, for a fault-tolerant job, 'membership' with the epoch in "
            "samples: 'length' and 'batch_size')"
        )
    if length is not None or batch_size is not None or drop_last:
        raise TypeError("plan: 'length', 'batch_size' and 'drop_last' go with 'membership'")
    state = initial_state(chained.hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs, max_steps=max_steps)
    executor = RecordingExecutor(_metric_source(metrics))
    if start is not None:
        state = process(chained, _state_at(state, start), ev.BeforeTrain(resumed=True), executor)
    elif start_step:
        # As a resumed run: BeforeTrain(resumed=True), then on from the checkpoint.
        state = process(chained, state_at_step(state, start_step), ev.BeforeTrain(resumed=True), executor)
    if max_time is not None and clock is None:
        raise TypeError("plan: 'max_time' needs a 'clock' (clock(step) -> seconds since training began)")
    # One process under a time budget, no signal: the rules ``simulate`` and the runtime apply.
    boundary = None if max_time is None else Boundaries({}, world_size=1, clock=clock, max_time=max_time, margin=margin)
    run_schedule(chained, state, executor, placeholders, clock=clock, boundary=boundary)
    return Trace(executor.trace, map(summary.hook_label, chained.hooks))


_NOT_WITH_MEMBERSHIP = {
    "iters_per_epoch": None,
    "start_step": 0,
    "start": None,
    "clock": None,
    "max_time": None,
}


def _plan_replicas(
    chained: Chain,
    membership: object,
    length: object,
    batch_size: object,
    drop_last: object,
    max_epochs: int | None,
    max_steps: int | None,
    metrics: Mapping[int, Mapping[str, float]] | MetricSource | None,
    placeholders: OutputSource | None,
    given: Mapping[str, object],
) -> Trace:
    """``plan(membership=...)``: the trace every live replica folds, walked by ``pimm_fn.core.membership.walk``."""
    membership, length, batch_size, drop_last = check_epoch(membership, length, batch_size, drop_last, owner="plan")
    for name, default in _NOT_WITH_MEMBERSHIP.items():
        if given[name] != default:
            hint = " (the epoch's steps follow the replicas alive: give 'length' and 'batch_size')"
            raise TypeError(f"plan: 'membership' takes no '{name}'{hint if name == 'iters_per_epoch' else ''}")
    iters = steps_left(0, length=length, batch_size=batch_size, participants=membership.replicas, drop_last=drop_last)
    state = initial_state(chained.hooks, iters_per_epoch=iters, max_epochs=max_epochs, max_steps=max_steps)
    executor = RecordingExecutor(_metric_source(metrics))
    walk(chained, state, executor, placeholders, membership, length=length, batch_size=batch_size, drop_last=drop_last)
    return Trace(executor.trace, map(summary.hook_label, chained.hooks))
