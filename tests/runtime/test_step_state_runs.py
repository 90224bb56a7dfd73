"""Real runs: hooks handed a StepState on a step's events train, trace, save and resume as hooks handed a State."""

import pathlib
import sys

from _tiny_workload import build, same_weights, standard_hooks, weights

import pimm_fn as pf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _hook_forms import AsState  # noqa: E402


def losses_seen(state, event):
    """Keeps the loss of every step in its slot (a value read, a slot changed, on a step's event)."""
    if isinstance(event, pf.events.AfterStep):
        return state.with_slot((state.slot or ()) + (round(event.outputs["loss"], 6),)), ()
    return state, ()


def steps_as_metric(state, event):
    """Publishes the global step as a metric on every step: a run-wide part changed on a step's event."""
    if isinstance(event, pf.events.AfterStep):
        return state.evolve(metrics=state.metrics.merge({"steps": float(state.progress.global_step)})), ()
    return state, ()


def _hooks():
    return [*standard_hooks(save_every=3, evaluate_every=4), losses_seen, steps_as_metric]


def _as_states():
    """``_hooks`` under the old contract, and an EMA in both (its average is the run's, declared to the loop)."""
    return [*(AsState(h) for h in _hooks()), pf.ema(0.9)]


def _on_step_states():
    return [*_hooks(), pf.ema(0.9)]


def _train(save_dir, hooks, steps):
    model, run = build(save_dir, hooks=hooks, kind="stateful", max_epochs=2)
    run.run(steps=steps)
    return model, run


def test_a_run_on_step_states_ends_as_one_on_states(tmp_path):
    """Seven steps of the standard stack, an EMA and two plain hooks: same weights, state, trace and checkpoint."""
    model, run = _train(tmp_path / "new", _on_step_states(), 7)
    old_model, old = _train(tmp_path / "old", _as_states(), 7)
    assert same_weights(weights(model), weights(old_model))
    assert run.state == old.state and run.state.metrics["steps"] == 7.0 and len(run.state.slots[-3]) == 7
    # Counted apart from any StepState: the same steps with no hook walking them (quiet steps, skip_to).
    _, quiet = _train(tmp_path / "quiet", [pf.save_every(100)], 7)
    assert run.state.progress == quiet.state.progress and run.state.progress.samples_seen == 7 * 8
    assert [(e.step, e.hook, e.effect) for e in run.trace] == [(e.step, e.hook, e.effect) for e in old.trace]
    # The checkpoint of step 6, read back by a resumed run of either form, then 4 steps more (one run at a time:
    # the runs share the process's torch RNG): the same state and weights.
    ends = []
    for name, hooks in (("new", _on_step_states), ("old", _as_states)):
        resumed_model, resumed = build(tmp_path / name, hooks=hooks(), kind="stateful", max_epochs=2, resume="auto")
        at_6 = resumed.state
        resumed.run(steps=4)
        ends.append((at_6, resumed.state, weights(resumed_model)))
    (new_at_6, new_end, new_weights), (old_at_6, old_end, old_weights) = ends
    assert new_at_6.progress.global_step == 6 and new_at_6 == old_at_6
    assert new_end == old_end and same_weights(new_weights, old_weights)
