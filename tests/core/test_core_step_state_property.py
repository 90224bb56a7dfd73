"""Property: every form of a hook folds alike, and a step's ``StepState`` as the ``State`` it stands for.

The forms: a hook as it is (``update(slot, state, event)`` for the
built-ins that declare it), its plain call ``hook(state, event)``
(``Plain``), and that call handed a ``State`` on every event (``AsState``,
the contract before ``StepState``). Any mix of them, flat or nested, gives
the same trace, the same states at every save, and the same final state.
"""

import pathlib
import sys

from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import RecordingExecutor, initial_state, run_schedule
from pimm_fn.hooks import best_on, early_stop, ema, evaluate_every, log_every, save_every, step_scheduler
from pimm_fn.hooks.progress import progress_bar

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _hook_forms import AsState, Count, Plain  # noqa: E402


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
        step_scheduler(on="m"),
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


FORMS = (lambda hook: hook, Plain, AsState)


@given(
    picks=st.lists(st.integers(0, 13), min_size=1, max_size=7, unique=True),
    forms=st.lists(st.integers(0, 2), min_size=7, max_size=7),
    split=st.integers(0, 7),
    iters=st.integers(1, 4),
    epochs=st.integers(1, 3),
)
def test_every_form_of_a_stack_folds_alike(picks, forms, split, iters, epochs):
    """Any stack, each hook as it is, plain, or handed States, flat or nested: the same trace, saves and state."""
    pool = _pool()
    hooks = [pool[i] for i in picks]
    expected = _run(chain(*hooks), iters, epochs)
    for form in FORMS[1:]:
        assert _run(chain(*[form(h) for h in hooks]), iters, epochs) == expected
    mixed = [FORMS[f](h) for h, f in zip(hooks, forms)]
    assert _run(chain(*mixed), iters, epochs) == expected
    split = min(split, len(hooks))
    trace, saved, final = _run(chain(*mixed[:split], chain(*mixed[split:], name="inner")), iters, epochs)
    assert [(s, e, f) for s, e, _, f in trace] == [(s, e, f) for s, e, _, f in expected[0]]  # positions renumbered
    assert [s.progress for s in saved] == [s.progress for s in expected[1]]
    assert final.progress == expected[2].progress
