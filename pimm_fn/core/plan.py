"""A dry run of a hook list: which effects would execute, when, without torch.

``plan`` walks the same lifecycle as the real loop and folds the same hooks;
only the executor differs: it records each effect and answers ``Evaluate``
with the metrics you supply. A real run's ``trace`` equals its plan.
"""

from collections.abc import Callable, Mapping

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.fold import Chain, TraceEntry, chain, init_slots, process
from pimm_fn.core.schedule import next_event, state_at_step
from pimm_fn.core.state import Progress, State

__all__ = ["plan", "RecordingExecutor", "initial_state", "run_schedule"]

MetricSource = Callable[[int, int], Mapping | None]


def initial_state(hooks, *, iters_per_epoch, max_epochs, rank=0, world_size=1, config=None) -> State:
    """The state a fresh run of ``hooks`` starts from."""
    progress = Progress(iters_per_epoch=iters_per_epoch, max_epochs=max_epochs)
    return State(progress, rank=rank, world_size=world_size, config=config or {}, slots=init_slots(hooks))


@attrs.define
class RecordingExecutor:
    """Executes nothing: records each effect and answers evaluations from ``metrics``.

    ``metrics(step, rank)`` returns the mapping an evaluation at ``step``
    produces on ``rank``, or ``None`` when that rank computed nothing. With
    ``broadcast`` the main rank's result is what every rank publishes.
    """

    metrics: MetricSource
    trace: list = attrs.field(factory=list)

    def check(self, state, event, emitted) -> None:
        pass

    def execute(self, state: State, entry: TraceEntry) -> tuple:
        self.trace.append(entry)
        effect = entry.effect
        if not isinstance(effect, Evaluate):
            return ()
        source_rank = 0 if effect.broadcast else state.rank
        values = self.metrics(effect.step, source_rank) or {}
        return (ev.MetricsPublished(values, effect.evaluator, effect.step, consistent=effect.broadcast),)


def run_schedule(hooks: Chain, state: State, executor, outputs=None, *, stop=None) -> State:
    """Walk the lifecycle from ``state`` to the end (or until ``stop(state)``).

    ``outputs(step)`` supplies each ``AfterStep``'s scalar outputs.
    """
    event = next_event(state)
    while event is not None:
        if isinstance(event, ev.AfterStep) and outputs is not None:
            event = ev.AfterStep(event.step, outputs(event.step))
        state = process(hooks, state, event, executor)
        if stop is not None and stop(state):
            return state
        event = next_event(state)
    return state


def _metric_source(metrics) -> MetricSource:
    if metrics is None:
        return lambda step, rank: None
    if callable(metrics):
        return metrics
    if isinstance(metrics, Mapping):
        return lambda step, rank: metrics.get(step)
    raise TypeError(f"'metrics' must be a mapping {{step: {{name: value}}}} or a callable (got {metrics!r:.80})")


def plan(hooks, *, iters_per_epoch: int, max_epochs: int, start_step: int = 0, metrics=None) -> tuple:
    """The effects ``hooks`` would execute, in order, as ``TraceEntry`` values.

    Args:
        hooks: a list of hooks, as given to ``loop``.
        iters_per_epoch, max_epochs: the schedule.
        start_step: plan a run resumed from the checkpoint of this global step.
            The hooks start from fresh slots (a dry run cannot know what a
            checkpoint holds), so a hook whose decision reads its slot, such
            as ``save_every``'s final save, may differ from a real resume;
            ``pimm_fn.testing.simulate(resume_at=...)`` resumes from the
            exact states instead.
        metrics: ``{step: {name: value}}`` an evaluation at ``step`` returns.

    Returns:
        A tuple of entries with ``.step``, ``.event`` and ``.effect``.

    >>> from pimm_fn.hooks import save_every
    >>> [e.step for e in plan([save_every(4)], iters_per_epoch=10, max_epochs=3)]
    [4, 8, 12, 16, 20, 24, 28, 30]
    """
    hooks = chain(*hooks)
    state = initial_state(hooks.hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs)
    executor = RecordingExecutor(_metric_source(metrics))
    if start_step:
        # As a resumed run: BeforeTrain(resumed=True), then on from the checkpoint.
        state = process(hooks, state_at_step(state, start_step), ev.BeforeTrain(resumed=True), executor)
    run_schedule(hooks, state, executor)
    return tuple(executor.trace)
