"""What the hooks imply: derived once as one frozen value, read by the loop, the guard and the handlers, and
derived again by ``Loop.replace``."""

import types

import attrs
import pytest

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.hook import key
from pimm_fn.runtime.engine.implied import Implied

import _tiny_workload as tw
from _process_group import one_rank_group  # noqa: F401 - a fixture


def watch(state, event):
    """A hook of the user's own (not rank-consistent), called every third step."""
    return state, ()


watch.events, watch.every = (ev.AfterStep,), 3


@attrs.define(eq=False)
class CountingEvaluators:
    """A hook of the user's own that counts how often its evaluators are asked for."""

    asked: list = attrs.Factory(list)
    events = (ev.AfterEpoch,)
    rank_consistent = True
    hook_key = "counting"

    def evaluators(self) -> dict:
        self.asked.append(1)
        return {}

    def __call__(self, state, event):
        return state, ()


def test_each_fact_is_read_from_the_hook_protocol():
    """Evaluators, best files, background saves, the scheduler's stepper, readers and the guard's parts, at once."""
    hooks = pf.chain(
        pf.evaluate_every(2, tw.negative_mse, name="val"),
        pf.step_scheduler("step"),
        pf.save_every(4, async_save=True),
        pf.best_on("score"),
        pf.best_on("loss", mode="min"),
        watch,
    )
    implied = Implied.of(hooks, guarded=True)
    assert dict(implied.evaluators) == {"val": tw.negative_mse}
    assert implied.best_metrics == ("score", "loss") and implied.best_per_metric
    assert implied.saves_in_background and implied.steps_scheduler
    assert dict(implied.readers_of) == {"score": ("best_on('score')",), "loss": ("best_on('loss', mode='min')",)}
    assert implied.watched == {5} and implied.watched_cadences == (3,)
    assert [s.key for s in implied.setups] == [key(h) for h in hooks.hooks]
    assert implied.processed[ev.ModifyConfig] and implied.processed[ev.BeforeTrain]  # the guard's setup events
    assert implied.processed[ev.AfterStep] and not implied.processed[ev.BeforeStep]
    quiet = Implied.of(pf.chain(pf.save_every(2)))
    assert not quiet.guarded and not quiet.processed[ev.ModifyConfig] and not quiet.best_per_metric
    assert not quiet.saves_in_background and not quiet.steps_scheduler


def test_a_run_holds_one_frozen_value_the_loop_and_handlers_read(tmp_path):
    """The run's value is what Implied.of gives for its hooks; it cannot be changed, nor its parts on the context."""
    _, run = tw.build(tmp_path, hooks=tw.standard_hooks(), max_epochs=1)
    implied = run.ctx.implied
    assert implied == Implied.of(run.hooks) and implied.hooks is run.hooks
    assert run._processed == dict(implied.processed)
    assert run.ctx.evaluators == {"val": tw.negative_mse} and run.ctx.hooks == run.hooks.hooks
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        implied.best_metrics = ("other",)
    with pytest.raises(TypeError):
        implied.evaluators["other"] = tw.negative_mse
    for name in ("hooks", "evaluators", "best_per_metric"):  # read from the value, never set apart from it
        with pytest.raises(AttributeError):
            setattr(run.ctx, name, None)
    assert isinstance(implied.processed, types.MappingProxyType)


def test_nothing_is_derived_again_while_training(tmp_path):
    """The hooks' evaluators are asked for while the run is built, never per step or per epoch."""
    counting = CountingEvaluators()
    _, run = tw.build(tmp_path, hooks=[counting, pf.log_every(2)], max_epochs=3)
    asked = len(counting.asked)
    run()
    assert run.state.finished and len(counting.asked) == asked


def _loss(model):
    """A second evaluator: the metric a replaced best_on comes to read."""
    return {"loss": 0.5}


def test_replace_derives_the_value_again_from_the_new_hooks(tmp_path):
    """After a swap the run's value is the new hook list's, as a run built with it has, and training goes on."""
    bests = [pf.chain(pf.best_on("score"), name="bests")]
    hooks = [
        pf.evaluate_every(4, tw.negative_mse, name="val"),
        pf.evaluate_every(4, _loss, name="loss"),
        pf.save_every(3),
        *bests,
    ]
    _, run = tw.build(tmp_path, hooks=hooks, max_epochs=3)
    run.run(steps=3)
    before = run.ctx.implied
    run.replace(pf.save_every(3), pf.save_every(3, async_save=True))
    run.replace("bests", pf.chain(pf.best_on("score"), pf.best_on("loss", mode="min"), name="bests"))
    run()
    after = run.ctx.implied
    assert after is not before and after == Implied.of(run.hooks)
    assert after.saves_in_background and not before.saves_in_background
    assert after.best_per_metric and run.ctx.best_per_metric and not before.best_per_metric
    assert run._processed == dict(after.processed)
    assert run.state.finished


def test_the_guard_reads_the_runs_value(one_rank_group, tmp_path):  # noqa: F811 - the fixture
    """In a guarded run the guard compares what the run's value says: the same object the loop reads."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(2), watch], max_epochs=1)
    guard = run._interpreter.guard
    assert run.ctx.implied.guarded and guard.implied is run.ctx.implied
    assert guard.watched == {1} and run._processed[ev.BeforeTrain]
    run()
    assert guard.comparisons == 1  # AfterStep 3 of 5 steps
