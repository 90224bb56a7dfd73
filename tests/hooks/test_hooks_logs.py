"""log_every: train logs every n steps, exact epoch averages, evaluation logs."""

import attrs
import pytest

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.hooks import LogState, evaluate_every, log_every
from _hook_helpers import at, deliver, run


def logs(hooks, iters, epochs, outputs, metrics=None):
    final, rec = run(hooks, iters=iters, epochs=epochs, outputs=outputs, metrics=metrics)
    return [effect for _, _, effect, _, _ in rec.seen if isinstance(effect, Log)], final


def test_train_logs_every_n_steps_with_position():
    """AfterStep(k) with k % n == 0 logs the outputs with epoch, iter and iters per epoch."""
    records, _ = logs([log_every(2)], iters=3, epochs=2, outputs=lambda s: {"loss": float(s)})
    train = [r for r in records if r.kind == "train"]
    assert train == [
        Log(2, "train", {"epoch": 0, "iter": 2, "of": 3, "loss": 2.0}),
        Log(4, "train", {"epoch": 1, "iter": 1, "of": 3, "loss": 4.0}),
        Log(6, "train", {"epoch": 1, "iter": 3, "of": 3, "loss": 6.0}),
    ]


def test_epoch_averages_are_exact():
    """The epoch log holds the exact mean of that epoch's outputs, and the slot resets per epoch."""
    outputs = {
        1: {"loss": 1.0, "acc": 0.5},
        2: {"loss": 2.0, "acc": 0.25},
        3: {"loss": 6.0, "acc": 0.0},
        4: {"loss": 0.5, "acc": 1.0},
        5: {"loss": 0.25, "acc": 1.0},
        6: {"loss": 0.25, "acc": 0.25},
    }
    records, final = logs([log_every(100)], iters=3, epochs=2, outputs=outputs.get)
    assert records == [
        Log(3, "epoch", {"epoch": 0, "loss": 3.0, "acc": 0.25}),
        Log(6, "epoch", {"epoch": 1, "loss": 1 / 3, "acc": 0.75}),
    ]
    assert final.slots == (LogState(),)


def test_slot_accumulates_and_resets():
    """Each AfterStep adds outputs to the slot's sums; AfterEpoch logs the means and resets the slot."""
    hook = log_every(10)
    state = at(1, LogState())
    state, effects = deliver(hook, state, ev.AfterStep(1, {"loss": 2.0}))
    assert (state.slot, effects) == (LogState(FrozenMap({"loss": 2.0}), 1), ())
    state, _ = deliver(hook, attrs.evolve(state, progress=at(2).progress), ev.AfterStep(2, {"loss": 4.0}))
    assert state.slot == LogState(FrozenMap({"loss": 6.0}), 2)
    state, effects = hook(state, ev.AfterEpoch(0))
    assert (state.slot, effects) == (LogState(), (Log(2, "epoch", {"epoch": 0, "loss": 3.0}),))


def test_slot_from_before_per_output_counts_averages_over_all_steps():
    """A LogState without counts averages its sums over every counted step."""
    state = at(3, LogState(FrozenMap({"loss": 4.0}), 2))
    state, _ = deliver(log_every(10), state, ev.AfterStep(3, {"loss": 2.0}))
    assert state.slot == LogState(FrozenMap({"loss": 6.0}), 3)


def test_slot_with_a_count_per_output_continues_with_the_same_averages():
    """A slot that kept a count for every output (as checkpoints of earlier versions do) continues exactly."""
    old = LogState(FrozenMap({"loss": 4.0, "aux": 1.0}), 2, FrozenMap({"loss": 2, "aux": 1}))
    state, _ = log_every(10)(at(3, old), ev.AfterStep(3, {"loss": 2.0}))
    assert state.slot == LogState(FrozenMap({"loss": 6.0, "aux": 1.0}), 3, FrozenMap({"aux": 1}))
    state, effects = log_every(10)(state, ev.AfterEpoch(0))
    assert effects == (Log(3, "epoch", {"epoch": 0, "loss": 2.0, "aux": 1.0}),)
    full = LogState(FrozenMap({"loss": 4.0}), 2, FrozenMap({"loss": 2}))
    assert log_every(10)(at(3, full), ev.AfterStep(3, {"loss": 2.0}))[0].slot == LogState(FrozenMap({"loss": 6.0}), 3)


def test_counts_keep_only_outputs_some_steps_left_out():
    """counts holds an entry only for an output that not every step of the epoch reported."""
    hook, state = log_every(10), at(1, LogState())
    for step, outputs in enumerate(
        [{"loss": 1.0}, {"loss": 1.0, "aux": 2.0}, {"aux": 2.0}, {"loss": 1.0, "aux": 2.0}], 1
    ):
        state, _ = hook(attrs.evolve(state, progress=at(step).progress), ev.AfterStep(step, outputs))
    assert state.slot == LogState(FrozenMap({"loss": 3.0, "aux": 6.0}), 4, FrozenMap({"loss": 3, "aux": 3}))
    state, _ = hook(attrs.evolve(state, progress=at(5).progress), ev.AfterStep(5, {}))
    assert state.slot.counts == {"loss": 3, "aux": 3}


def test_epoch_without_outputs_logs_only_the_epoch():
    """An epoch with no counted steps logs {'epoch': e} and no means."""
    state = at(10, LogState(), position="AfterEpoch")
    assert log_every(3)(state, ev.AfterEpoch(0)) == (state, (Log(10, "epoch", {"epoch": 0}),))


def validate(model):
    return None


def test_eval_logs_name_the_source():
    """Each non-empty MetricsPublished logs 'eval/<source>' with its values at the current step."""
    records, _ = logs(
        [evaluate_every(2, validate), log_every(100)],
        iters=4,
        epochs=1,
        outputs=lambda s: {},
        metrics={2: {"miou": 0.5}, 4: {}},
    )
    assert records == [
        Log(2, "eval/validate", {"miou": 0.5}),
        Log(4, "epoch", {"epoch": 0}),
    ]
    state = at(3, LogState())
    assert log_every(1)(state, ev.MetricsPublished({"a": 1.0})) == (state, (Log(3, "eval", {"a": 1.0}),))


@pytest.mark.parametrize(
    "n, message",
    [
        (0, "log_every: 'n' must be an int >= 1 (got 0)"),
        ("5", "log_every: 'n' must be an int >= 1 (got '5')"),
    ],
)
def test_log_every_rejects_bad_arguments(n, message):
    """A bad log_every n raises ValueError naming it."""
    with pytest.raises(ValueError) as info:
        log_every(n)
    assert str(info.value) == message


def test_epoch_average_of_an_output_only_some_steps_report():
    """An output present in only some steps is averaged over the steps that reported it."""
    outputs = {1: {"loss": 1.0}, 2: {"loss": 3.0, "aux": 4.0}, 3: {"loss": 2.0}, 4: {"loss": 2.0, "aux": 2.0}}
    records, _ = logs([log_every(100)], iters=4, epochs=1, outputs=outputs.get)
    assert records == [Log(4, "epoch", {"epoch": 0, "loss": 2.0, "aux": 3.0})]


def test_builtin_skipped_steps_only_accumulate():
    """On a step its cadence skips, a built-in emits nothing and its slot changes only as its accumulate says."""
    from pimm_fn.core.hook import declared
    from pimm_fn.hooks import SaveEveryState, save_every

    outputs = FrozenMap({"loss": 0.5, "lr": 0.1})
    log_slots = [
        LogState(),
        LogState(FrozenMap({"loss": 1.0, "lr": 0.2}), 2, FrozenMap({"loss": 2, "lr": 2})),
        LogState(FrozenMap({"loss": 1.0}), 2, FrozenMap({"loss": 1})),
    ]
    cases = [
        (log_every(4), log_slots),
        (save_every(4), [SaveEveryState(), SaveEveryState(last_saved=4)]),
        (evaluate_every(4, lambda m: 0.0, name="v"), [None]),
        (evaluate_every(0, lambda m: 0.0, name="e"), [None]),
    ]
    for hook, slots in cases:
        accumulate = declared(hook).accumulate or (lambda slot, outputs: slot)
        for slot in slots:
            for step in (1, 2, 3, 5, 10, 12):
                if ev.AfterStep in hook.events and step % hook.every == 0:
                    continue
                state, event = at(step, slot), ev.AfterStep(step, outputs, 8)
                assert deliver(hook, state, event) == (state.with_slot(accumulate(slot, outputs)), ()), (hook, step)
