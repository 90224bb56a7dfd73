"""save_every: exact cadence, deferral to the epoch's end, final save, ordering with evaluation."""

import math

import attrs
import pytest

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, SaveCheckpoint, WriteBest
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.hooks import SaveEveryState, best_on, evaluate_every, save_every
from _hook_helpers import at, deliver, run


def evaluate(model):
    return {"acc": 0.0}


def test_saves_on_the_step_cadence_mid_epoch():
    """AfterStep(k) with k % n == 0 mid-epoch emits SaveCheckpoint(k) and records last_saved."""
    state = at(8, SaveEveryState())
    assert save_every(4)(state, ev.AfterStep(8)) == (
        attrs.evolve(state, slot=SaveEveryState(last_saved=8)),
        (SaveCheckpoint(8),),
    )


def test_off_cadence_step_does_nothing():
    """AfterStep(k) with k % n != 0 leaves the state unchanged and emits nothing."""
    state = at(7, SaveEveryState(last_saved=4))
    assert deliver(save_every(4), state, ev.AfterStep(7)) == (state, ())


def test_epoch_ending_save_is_deferred_to_after_epoch():
    """A save on an epoch's last step is recorded as deferred and emitted at AfterEpoch."""
    state = at(20, SaveEveryState(last_saved=16))
    deferred, effects = save_every(4)(state, ev.AfterStep(20))
    assert effects == ()
    assert deferred == attrs.evolve(state, slot=SaveEveryState(last_saved=16, deferred=20))
    after_epoch = attrs.evolve(deferred, position="AfterEpoch")
    assert save_every(4)(after_epoch, ev.AfterEpoch(1)) == (
        attrs.evolve(after_epoch, slot=SaveEveryState(last_saved=20)),
        (SaveCheckpoint(20, deferred=True),),
    )


def test_after_epoch_without_deferred_save_does_nothing():
    """AfterEpoch with no deferred save emits nothing."""
    state = at(10, SaveEveryState(last_saved=8), position="AfterEpoch")
    assert save_every(4)(state, ev.AfterEpoch(0)) == (state, ())


def test_final_save_after_training_unless_already_saved():
    """AfterTrain saves the final step with final=True, unless the last save holds it."""
    state = at(30, SaveEveryState(last_saved=28), position="AfterTrain")
    assert save_every(4)(state, ev.AfterTrain()) == (
        attrs.evolve(state, slot=SaveEveryState(last_saved=30)),
        (SaveCheckpoint(30, final=True),),
    )
    done = at(30, SaveEveryState(last_saved=30), position="AfterTrain")
    assert save_every(5)(done, ev.AfterTrain()) == (done, ())


def test_no_final_save_when_nothing_trained():
    """A run of zero steps requests no final save."""
    state = at(0, SaveEveryState(), position="AfterTrain")
    assert save_every(4)(state, ev.AfterTrain()) == (state, ())


def test_cadence_continues_from_resumed_progress():
    """After a resume at step 13 the next save is at 16, from the global step, not from the resume."""
    state = at(14, SaveEveryState(last_saved=12))
    assert deliver(save_every(4), state, ev.AfterStep(14)) == (state, ())
    assert save_every(4)(at(16, SaveEveryState(last_saved=12)), ev.AfterStep(16))[1] == (SaveCheckpoint(16),)


def test_snapshots_flag_reaches_every_save():
    """snapshots=True marks each SaveCheckpoint, the final one too."""
    assert save_every(4, snapshots=True)(at(4, SaveEveryState()), ev.AfterStep(4))[1] == (
        SaveCheckpoint(4, snapshot=True),
    )
    final = at(30, SaveEveryState(), position="AfterTrain")
    assert save_every(4, snapshots=True)(final, ev.AfterTrain())[1] == (SaveCheckpoint(30, snapshot=True, final=True),)


def test_ignores_other_events():
    """Events other than AfterStep, AfterEpoch and AfterTrain are ignored (and not declared)."""
    state = at(4, SaveEveryState())
    # Elapsed too, called directly: a step cadence alone has no clock to compare it with.
    for event in (ev.BeforeStep(5), ev.BeforeEpoch(0), ev.MetricsPublished({"a": 1}), ev.Elapsed(4, 30.0)):
        assert save_every(4)(state, event) == (state, ())
    assert save_every(4).events == (ev.AfterStep, ev.AfterEpoch, ev.AfterTrain)


def test_deferred_save_runs_after_epoch_evaluation_and_best_write():
    """With evaluate_every(0, f) and best_on before the saver, Evaluate, then WriteBest, then the save; the save sees the new best."""
    hooks = [evaluate_every(0, evaluate), best_on("acc"), save_every(10)]
    final, rec = run(hooks, iters=10, epochs=2, metrics={10: {"acc": 0.5}, 20: {"acc": 0.25}})
    assert [(step, event, effect) for step, event, effect, _, _ in rec.seen] == [
        (10, ev.AfterEpoch(0), Evaluate("evaluate", 10)),
        (10, ev.MetricsPublished({"acc": 0.5}, "evaluate", 10), WriteBest("acc", 0.5, 10)),
        (10, ev.AfterEpoch(0), SaveCheckpoint(10, deferred=True)),
        (20, ev.AfterEpoch(1), Evaluate("evaluate", 20)),
        (20, ev.AfterEpoch(1), SaveCheckpoint(20, deferred=True)),
    ]
    (_, _, _, best_at_save, metrics_at_save) = rec.seen[2]
    assert best_at_save == FrozenMap({"acc": 0.5}) and metrics_at_save == FrozenMap({"acc": 0.5})
    assert rec.seen[4][3] == {"acc": 0.5} and rec.seen[4][4] == {"acc": 0.25}
    assert final.best == {"acc": 0.5}
    assert final.slots[2] == SaveEveryState(last_saved=20)


def test_mid_epoch_save_at_an_evaluation_step_records_the_evaluation():
    """A step-cadence save at an evaluation step executes after the evaluation and sees its metrics."""
    hooks = [evaluate_every(5, evaluate), best_on("acc"), save_every(5)]
    _, rec = run(hooks, iters=10, epochs=1, metrics={5: {"acc": 0.75}, 10: {"acc": math.nan}})
    assert [effect for _, _, effect, _, _ in rec.seen] == [
        Evaluate("evaluate", 5),
        WriteBest("acc", 0.75, 5),
        SaveCheckpoint(5),
        Evaluate("evaluate", 10),
        SaveCheckpoint(10, deferred=True),
    ]
    assert rec.seen[2][3] == {"acc": 0.75}
    assert rec.seen[4][3] == {"acc": 0.75} and math.isnan(rec.seen[4][4]["acc"])


def test_saver_before_evaluator_still_saves_after_the_evaluation_at_a_mid_epoch_step():
    """A save closes its event: a saver listed before the evaluator executes after the evaluation and its best."""
    hooks = [save_every(5), evaluate_every(5, evaluate), best_on("acc")]
    _, rec = run(hooks, iters=10, epochs=1, metrics={5: {"acc": 0.5}, 10: {"acc": 0.75}})
    assert [effect for _, _, effect, _, _ in rec.seen] == [
        Evaluate("evaluate", 5),
        WriteBest("acc", 0.5, 5),
        SaveCheckpoint(5),
        Evaluate("evaluate", 10),
        WriteBest("acc", 0.75, 10),
        SaveCheckpoint(10, deferred=True),
    ]
    assert rec.seen[2][3] == {"acc": 0.5}


def test_deferred_save_follows_the_epochs_evaluation_whatever_the_order():
    """An epoch-end save runs after the epoch's other effects, even when the saver is listed first."""
    hooks = [save_every(10), evaluate_every(0, evaluate), best_on("acc")]
    _, rec = run(hooks, iters=10, epochs=1, metrics={10: {"acc": 0.5}})
    assert [effect for _, _, effect, _, _ in rec.seen] == [
        Evaluate("evaluate", 10),
        WriteBest("acc", 0.5, 10),
        SaveCheckpoint(10, deferred=True),
    ]
    assert rec.seen[2][3] == {"acc": 0.5}


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        ({"n": 0}, ValueError, "save_every: 'n' must be an int >= 1 (got 0)"),
        ({"n": -3}, ValueError, "save_every: 'n' must be an int >= 1 (got -3)"),
        ({"n": 2.0}, ValueError, "save_every: 'n' must be an int >= 1 (got 2.0)"),
        ({"n": True}, ValueError, "save_every: 'n' must be an int >= 1 (got True)"),
        ({"n": 4, "snapshots": 1}, TypeError, "save_every: 'snapshots' must be a bool (got 1)"),
    ],
)
def test_save_every_rejects_bad_arguments(kwargs, exc, message):
    """Bad save_every arguments raise at construction, naming the argument and value."""
    with pytest.raises(exc) as info:
        save_every(kwargs.pop("n"), **kwargs)
    assert str(info.value).startswith(message)
