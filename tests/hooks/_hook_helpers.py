"""Shared helpers for hook tests: states at a given step, and a recording executor."""

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import initial_state, run_schedule
from pimm_fn.core.schedule import state_at_step
from pimm_fn.core.state import Progress, State


def at(step, slot=None, *, iters=10, epochs=3, **fields):
    """The state a hook sees right after ``AfterStep(step)`` (or AfterEpoch when it ends an epoch)."""
    state = state_at_step(State(Progress(iters, epochs)), step)
    if step and step % iters == 0:
        state = attrs.evolve(state, position="AfterStep")
    return attrs.evolve(state, slot=slot, **fields)


@attrs.define
class Recorder:
    """Executes nothing: records (effect, best, metrics, slots) and answers Evaluate from ``metrics``."""

    metrics: dict = attrs.field(factory=dict)
    seen: list = attrs.field(factory=list)

    def check(self, state, event, emitted):
        pass

    def execute(self, state, entry):
        self.seen.append((entry.step, entry.event, entry.effect, state.best, state.metrics))
        if isinstance(entry.effect, Evaluate):
            values = self.metrics.get(entry.effect.step, {})
            return (ev.MetricsPublished(values, entry.effect.evaluator, entry.effect.step),)
        return ()


def run(hooks, *, iters, epochs, metrics=None, outputs=None):
    """Run ``hooks`` over a whole schedule; returns (final state, recorder)."""
    hooks = chain(*hooks)
    recorder = Recorder(metrics or {})
    state = initial_state(hooks.hooks, iters_per_epoch=iters, max_epochs=epochs)
    return run_schedule(hooks, state, recorder, outputs), recorder


def deliver(hook, state, event):
    """What the fold makes of ``event`` for ``hook`` alone: ``(state, effects)``, its subscription enforced."""
    out, effects = chain(hook)(attrs.evolve(state, slot=(state.slot,)), event)
    return attrs.evolve(out, slot=out.slot[0]), effects
