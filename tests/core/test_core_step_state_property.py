"""Property: handing a step's hooks a ``StepState`` gives the same traces, slots and saved states as a ``State``."""

import attrs
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Log, SaveCheckpoint
from pimm_fn.core.fold import called_plainly, chain
from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule
from pimm_fn.core.step_state import built
from pimm_fn.hooks import best_on, early_stop, ema, evaluate_every, log_every, save_every, step_scheduler
from pimm_fn.hooks.progress import progress_bar


class AsState:
    """``hook`` under the contract before ``StepState``: handed a ``State`` on every event, a step's built first."""

    def __init__(self, hook):
        d = protocol.declared(hook)
        self.hook, self.events, self.every, self.accumulate = hook, d.events, d.every, d.accumulate
        self.reads_outputs, self.rank_consistent, self.emits = d.reads_outputs, d.rank_consistent, d.emits
        self.hook_key, self.reads_metrics = d.key, d.reads_metrics

    def init(self):
        return protocol.init_slot(self.hook)

    def __call__(self, state, event):
        return self.hook(built(state), event)


@attrs.frozen
class Count:
    """Counts the events it sees in its slot (the update form); every ``n``-th marks the config and logs."""

    name: str
    n: int = 2

    def init(self):
        return 0

    def update(self, slot, state, event):
        slot += 1
        if slot % self.n:
            return slot, state, ()
        state = state.evolve(config=state.config.set(self.name, slot))
        return slot, state, (Log(state.progress.global_step, self.name, {"seen": slot}),)

    __call__ = called_plainly


def losses_seen(state, event):
    """A plain hook keeping the steps' losses it read in its slot."""
    if event.__class__ is ev.AfterStep:
        return state.with_slot((state.slot or ()) + (event.outputs["loss"],)), ()
    return state, ()


def step_metric(state, event):
    """A plain hook publishing a metric of its own on every step: a run-wide part changed on a step's event."""
    if event.__class__ is ev.AfterStep:
        return state.evolve(metrics=state.metrics.merge({"steps": float(state.progress.global_step)})), ()
    return state, ()


def reader(state, event):
    """A plain hook that reads and returns the state unchanged: what most hooks do."""
    assert state.progress.global_step >= 0 and state.rank == 0
    return state, ()


def _val(model):
    return {"m": 0.0}


def _pool():
    return [
        Count("a"),
        Count("b", 3),
        losses_seen,
        step_metric,
        reader,
        log_every(2),
        early_stop("m", patience=2),
        step_scheduler("epoch"),
        ema(0.9, every=2),
        progress_bar(2),
        save_every(3),
        evaluate_every(2, _val, name="v"),
        best_on("m"),
    ]


class SavedStates(RecordingExecutor):
    """Records, as well, the state every checkpoint save would write."""

    def __init__(self, metrics):
        super().__init__(metrics)
        self.saved = []

    def execute(self, state, entry):
        if entry.effect.__class__ is SaveCheckpoint:
            self.saved.append(state)
        return super().execute(state, entry)


def _run(hooks, iters, epochs):
    state = initial_state(hooks.hooks, iters_per_epoch=iters, max_epochs=epochs)
    executor = SavedStates(lambda step, rank: {"m": float(step % 4)})
    final = run_schedule(hooks, state, executor, outputs=lambda step: {"loss": step / 4})
    return [(t.step, t.event, t.hook, t.effect) for t in executor.trace], executor.saved, final


@given(
    picks=st.lists(st.integers(0, 12), min_size=1, max_size=7, unique=True),
    old=st.lists(st.booleans(), min_size=7, max_size=7),
    split=st.integers(0, 7),
    iters=st.integers(1, 4),
    epochs=st.integers(1, 3),
)
def test_step_states_fold_as_states_did(picks, old, split, iters, epochs):
    """Any stack, each hook handed a StepState or a State, flat or nested: the same trace, saves and final state."""
    pool = _pool()
    hooks = [pool[i] for i in picks]
    new = _run(chain(*hooks), iters, epochs)
    assert _run(chain(*[AsState(h) for h in hooks]), iters, epochs) == new
    mixed = [AsState(h) if o else h for h, o in zip(hooks, old)]
    assert _run(chain(*mixed), iters, epochs) == new
    split = min(split, len(hooks))
    trace, saved, final = _run(chain(*mixed[:split], chain(*mixed[split:], name="inner")), iters, epochs)
    assert [(s, e, f) for s, e, _, f in trace] == [(s, e, f) for s, e, _, f in new[0]]  # positions renumbered
    assert [s.progress for s in saved] == [s.progress for s in new[1]] and final.progress == new[2].progress
