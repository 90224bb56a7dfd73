"""Swapping a hook (or an evaluator's function) in a live run, and continuing exactly."""

import attrs
import pytest
import torch

import pimm_fn as pf
from pimm_fn.core.effects import Evaluate
from pimm_fn.hooks import LogState

import _tiny_workload as tw
from _process_group import one_rank_group  # noqa: F401 - a fixture

EPOCHS = 3  # 5 steps per epoch: 15 steps


def broken(model):
    """An evaluator with a bug: it raises whenever it is called (first at step 4 with evaluate_every(4))."""
    raise RuntimeError("evaluator bug")


def hooks_with(evaluator, nested: bool) -> list:
    """The standard hooks, the evaluator first; with ``nested``, it sits two chains deep."""
    evaluate = pf.evaluate_every(4, evaluator, name="val")
    if nested:
        return [
            pf.chain(pf.log_every(5), pf.chain(evaluate, name="inner"), name="outer"),
            pf.save_every(3),
            pf.best_on("score"),
        ]
    return [evaluate, pf.save_every(3), pf.best_on("score"), pf.log_every(5)]


def swap(run, form: str) -> None:
    fixed = pf.evaluate_every(4, tw.negative_mse, name="val")
    if form == "hook":
        run.replace(pf.evaluate_every(4, broken, name="val"), fixed)
    elif form == "identity":
        run.replace("evaluate_every(4, broken, name='val')", fixed)
    else:
        run.replace_evaluator("val", tw.negative_mse)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("form", ["hook", "identity", "evaluator"])
def test_a_hook_swapped_between_steps_continues_as_a_run_built_with_it(tmp_path, form, nested):
    """Swapped after step 3, the run ends with the trace, state and weights of a run built with the new hook."""
    model, run = tw.build(tmp_path / "swapped", hooks=hooks_with(broken, nested), max_epochs=EPOCHS)
    run.run(steps=3)
    assert swap(run, form) is None and run.run().progress.global_step == 15
    ref_model, ref = tw.build(tmp_path / "ref", hooks=hooks_with(tw.negative_mse, nested), max_epochs=EPOCHS)
    ref()
    assert run.trace == ref.trace and run.state == ref.state
    assert tw.same_weights(tw.weights(model), tw.weights(ref_model))
    assert repr(run.hooks) == repr(ref.hooks) and run.ctx.evaluators == {"val": tw.negative_mse}


def test_after_an_evaluator_raised_the_replacement_is_the_one_called(tmp_path):
    """The broken evaluator fails the run at step 4; once replaced, run() goes on and calls only the new one."""
    calls = []

    def recording(model):
        calls.append(model.training)
        return tw.negative_mse(model)

    _, run = tw.build(tmp_path, hooks=hooks_with(broken, nested=False), max_epochs=2)
    with pytest.raises(RuntimeError, match="evaluator bug"):
        run.run()
    assert run.replace_evaluator("val", recording) is run
    run.run()
    assert run.finished and len(calls) == 2 and "score" in run.state.metrics
    assert [e.step for e in run.trace if isinstance(e.effect, Evaluate)] == [4, 8]


@pf.register_slot_type
@attrs.frozen
class CountState:
    steps: int = 0


@attrs.frozen
class Counter:
    """A user hook counting steps in its slot; ``version`` is part of its identity."""

    version: int

    def init(self):
        return CountState()

    def __call__(self, state, event):
        if isinstance(event, pf.events.AfterStep):
            return pf.State.with_slot(state, CountState(state.slot.steps + 1)), ()
        return state, ()


@pytest.mark.parametrize("fresh, counted", [(False, 10), (True, 7)])
def test_the_new_version_of_a_hook_takes_over_its_slot_inside_chains(tmp_path, fresh, counted):
    """Counter(1) -> Counter(2) after 3 steps keeps counting from 3 (fresh=True: from 0), at its place in the slots."""
    hooks = [pf.log_every(5), pf.chain(pf.save_every(4), pf.chain(Counter(1), name="counting"), name="group")]
    _, run = tw.build(tmp_path, hooks=hooks, max_epochs=2)
    run.run(steps=3)
    run.replace(Counter(1), Counter(2), fresh=fresh).run()
    assert run.state.slots[1][1][0] == CountState(counted)
    assert "Counter(version=2)" in repr(run.hooks)


def test_a_checkpoint_after_a_swap_keys_the_slot_by_the_new_identity(tmp_path):
    """Saved after the swap, the new hook's slot comes back on a resume with the new hook list."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(2), Counter(1)], max_epochs=2)
    run.run(steps=3)
    run.replace(Counter(1), Counter(2)).run(steps=1)  # step 4 saves
    _, resumed = tw.build(tmp_path, hooks=[pf.save_every(2), Counter(2)], max_epochs=2, resume="auto")
    assert resumed.state.progress.global_step == 4 and resumed.state.slots[1] == CountState(4)


def test_a_log_hook_replaced_by_another_cadence_keeps_its_running_sums(tmp_path):
    """log_every(5) -> log_every(2): the epoch's sums so far carry over to the new cadence."""
    _, run = tw.build(tmp_path, hooks=[pf.log_every(5)], max_epochs=1)
    run.run(steps=3)
    before = run.state.slots[0]
    run.replace("log_every(5)", pf.log_every(2))
    assert isinstance(before, LogState) and run.state.slots[0] is before
    run.run()
    assert run.finished


def idle(state, event):
    return state, ()


idle.events = (pf.events.AfterTrain,)


def losses_seen(state, event):
    """Records, per step, whether the step's outputs carried the loss."""
    if isinstance(event, pf.events.AfterStep):
        return pf.State.with_slot(state, (state.slot or ()) + ("loss" in event.outputs,)), ()
    return state, ()


def test_a_new_subscription_takes_effect_at_once(tmp_path):
    """A hook wanting only AfterTrain replaced by one reading every step's outputs: they reach it from then on."""
    _, run = tw.build(tmp_path, hooks=[idle], max_epochs=1)
    run.run(steps=2)
    run.replace(idle, losses_seen).run()
    assert run.state.slots == ((True, True, True),)


class Attending(tw.TinyNet):
    def on_event(self, state, event):
        if isinstance(event, pf.events.AfterStep):
            return pf.State.with_slot(state, (state.slot or 0) + 1), ()
        return None


def test_a_model_hook_swapped_in_is_bound_to_the_run_model(tmp_path):
    """model_hook() swapped in calls the run's model from the next step."""
    torch.manual_seed(0)
    model = Attending()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        tw.loader(),
        hooks=[idle],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    run.run(steps=1)
    run.replace(idle, pf.model_hook()).run()
    assert run.state.slots == (4,)


# -- refusals ------------------------------------------------------------------------------------
def test_an_unknown_hook_is_refused_listing_the_hooks_there_are(tmp_path):
    """A hook the run does not have is named, with every identity the run has, nested ones by their path."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(3), pf.chain(pf.log_every(5), name="logs")], max_epochs=1)
    with pytest.raises(
        ValueError,
        match=r"no hook 'save_every\(7\)'; its hooks are: 'save_every\(3\)', 'logs', "
        r"'logs / log_every\(5\)'",
    ):
        run.replace(pf.save_every(7), pf.save_every(8))


def test_a_slot_that_does_not_fit_is_refused_and_the_run_is_left_as_it_was(tmp_path):
    """log_every's LogState cannot go to a hook starting from CountState: both hooks and both types are named."""
    _, run = tw.build(tmp_path, hooks=[pf.log_every(5)], max_epochs=1)
    run.run(steps=2)
    hooks, state = run.hooks, run.state
    with pytest.raises(
        TypeError,
        match=r"'log_every\(5\)' cannot be replaced by 'Counter\(version=1\)': the old "
        r"hook's slot is of type pimm_fn\.hooks\.logs\.LogState, the new hook's "
        r"initial slot of type .*CountState.*fresh=True",
    ):
        run.replace("log_every(5)", Counter(1))
    assert run.hooks is hooks and run.state is state
    assert run.run().progress.global_step == 5


def test_a_new_identity_colliding_with_a_neighbour_is_refused(tmp_path):
    """A replacement with the identity of another hook of the same chain would share its checkpointed slot."""
    hooks = [pf.save_every(3), pf.chain(pf.log_every(5), pf.log_every(2), name="logs")]
    _, run = tw.build(tmp_path, hooks=hooks, max_epochs=1)
    with pytest.raises(
        pf.DuplicateHookError,
        match=r"new hook 'log_every\(2\)' replacing 'log_every\(5\)' has "
        r"the identity of another hook beside it \(position 1\)",
    ):
        run.replace("log_every(5)", pf.log_every(2))
    run.replace("log_every(5)", pf.log_every(3))  # the same identity as a hook at another level is fine
    run.replace("logs / log_every(3)", pf.save_every(3), fresh=True)


def test_a_hook_at_several_depths_needs_its_path(tmp_path):
    """An identity found at two levels is refused with both paths; the path picks one."""
    hooks = [pf.log_every(5), pf.chain(pf.log_every(5), name="inner")]
    _, run = tw.build(tmp_path, hooks=hooks, max_epochs=1)
    with pytest.raises(ValueError, match=r"at several places \('log_every\(5\)', 'inner / log_every\(5\)'\)"):
        run.replace("log_every(5)", pf.log_every(2))
    run.replace("inner / log_every(5)", pf.log_every(2))
    assert repr(run.hooks.hooks) == "(log_every(5), chain(log_every(2), name='inner'))"


def test_what_is_not_a_hook_or_evaluator_is_refused(tmp_path):
    """An uncalled factory, an unknown evaluator and an evaluator of another kind of hook are refused with advice."""
    _, run = tw.build(tmp_path, hooks=hooks_with(broken, nested=False), max_epochs=1)
    with pytest.raises(TypeError, match=r"holds the hook factory save_every itself"):
        run.replace("save_every(3)", pf.save_every)
    with pytest.raises(ValueError, match=r"no evaluator named 'test' in this run \(known: \['val'\]\)"):
        run.replace_evaluator("test", tw.negative_mse)


def test_a_swap_with_a_process_group_is_refused(one_rank_group):
    """With a process group every rank would have to swap at once: refused, advising a rebuild and resume."""
    torch.manual_seed(0)
    model = tw.TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        tw.loader(),
        hooks=[pf.log_every(5)],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(
        RuntimeError,
        match=r"cannot swap 'log_every\(5\)' for 'log_every\(2\)' in a run with a "
        r"process group.*resume='auto'",
    ):
        run.replace("log_every(5)", pf.log_every(2))


def test_a_hook_that_cannot_swap_its_evaluator_is_refused_with_the_way_out():
    """An evaluator provided by a hook without with_evaluator must be replaced as a whole hook."""
    from pimm_fn.core.hook import with_evaluator

    class Provides:
        def evaluators(self):
            return {"val": lambda model: 0.0}

        def __call__(self, state, event):
            return state, ()

    with pytest.raises(TypeError, match="cannot swap it \\(no with_evaluator\\).*replace the whole hook"):
        with_evaluator(Provides(), "val", lambda model: 1.0)


def test_a_second_best_tracker_on_a_metric_is_refused_by_replace_as_by_loop(tmp_path):
    """Replacing a hook by a best_on on a metric another best_on tracks is refused, and the run is left as it was."""
    _, run = tw.build(tmp_path, hooks=[pf.best_on("score"), pf.log_every(5)], max_epochs=1)
    hooks, state = run.hooks, run.state
    with pytest.raises(ValueError, match="score"):
        run.replace("log_every(5)", pf.best_on("score", mode="min"), fresh=True)
    assert run.hooks is hooks and run.state is state
