"""save_every_epoch: pimm's CheckpointSaver cadence as a pure hook."""

import pickle

import pytest
from hypothesis import given, strategies as st

import pimm_fn as pf
from pimm_fn.compat import EpochSaveState, save_every_epoch
from pimm_fn.core.effects import SaveCheckpoint


def _saves(hooks, **schedule):
    return [(e.step, type(e.event).__name__, e.effect) for e in pf.plan(hooks, **schedule)]


def test_saves_at_each_epoch_end_with_snapshots_every_n_epochs():
    """Every epoch ends with a save; every snapshot_every-th keeps a snapshot; no final save repeats the last."""
    assert _saves([save_every_epoch(1, snapshot_every=2)], iters_per_epoch=3, max_epochs=4) == [
        (3, "AfterEpoch", SaveCheckpoint(3, deferred=True)),
        (6, "AfterEpoch", SaveCheckpoint(6, snapshot=True, deferred=True)),
        (9, "AfterEpoch", SaveCheckpoint(9, deferred=True)),
        (12, "AfterEpoch", SaveCheckpoint(12, snapshot=True, deferred=True)),
    ]


def test_final_save_after_training_when_the_last_epoch_was_not_saved():
    """With every=2 and 3 epochs, the end of training adds one final save of the last step."""
    assert _saves([save_every_epoch(2)], iters_per_epoch=5, max_epochs=3) == [
        (10, "AfterEpoch", SaveCheckpoint(10, deferred=True)),
        (15, "AfterTrain", SaveCheckpoint(15, final=True)),
    ]


@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 6))
def test_plans_like_save_every_of_the_epoch_length(every, iters_per_epoch, max_epochs):
    """Without snapshots, save_every_epoch(k) executes exactly what save_every(k * iters_per_epoch) does."""
    schedule = dict(iters_per_epoch=iters_per_epoch, max_epochs=max_epochs)
    assert _saves([save_every_epoch(every)], **schedule) == _saves([pf.save_every(every * iters_per_epoch)], **schedule)


def test_a_resumed_plan_continues_the_epoch_cadence():
    """Planned from the checkpoint of step 6, the run saves what the uninterrupted one saves after step 6."""
    hooks = [save_every_epoch(1, snapshot_every=2)]
    full = pf.plan(hooks, iters_per_epoch=3, max_epochs=4)
    resumed = pf.plan(hooks, iters_per_epoch=3, max_epochs=4, start_step=6)
    assert [e.effect for e in resumed] == [e.effect for e in full if e.step > 6]


def test_validates_arguments_at_construction():
    """A bad cadence fails at once with the argument named."""
    with pytest.raises(ValueError, match=r"^save_every_epoch: 'every' must be an int >= 1 \(got 0\)$"):
        save_every_epoch(0)
    with pytest.raises(ValueError, match=r"^save_every_epoch: 'snapshot_every' must be an int >= 1 \(got 0\)$"):
        save_every_epoch(1, snapshot_every=0)
    with pytest.raises(ValueError, match=r"multiple of 'every'=2 \(got 3\)$"):
        save_every_epoch(2, snapshot_every=3)


def test_is_a_value_repr_equality_pickle():
    """The hook compares by value, pickles, and its repr is the factory call."""
    hook = save_every_epoch(2, snapshot_every=4)
    assert repr(hook) == "save_every_epoch(2, snapshot_every=4)"
    assert pickle.loads(pickle.dumps(hook)) == hook == save_every_epoch(2, snapshot_every=4)
    assert hook.init() == EpochSaveState()


def test_slot_state_round_trips_through_the_checkpoint_codec():
    """EpochSaveState is registered, so a checkpoint can store and restore it."""
    from pimm_fn.core import codec

    assert codec.loads(codec.dumps(EpochSaveState(12))) == EpochSaveState(12)
