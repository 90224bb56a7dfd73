"""The lifecycle as a pure function: next_event, advance, resume_from, state_at_step."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.schedule import advance, next_event, resume_from, state_at_step
from pimm_fn.core.state import Progress, State


def walk(state):
    """Every lifecycle event from ``state`` to the end, and the final state."""
    seen = []
    event = next_event(state)
    while event is not None:
        seen.append(event)
        state = advance(state, event)
        event = next_event(state)
    return seen, state


def test_next_event_walks_the_lifecycle_in_order():
    """ModifyConfig, BeforeTrain, per epoch BeforeEpoch, BeforeStep/AfterStep pairs, AfterEpoch, then AfterTrain."""
    events, final = walk(State(Progress(iters_per_epoch=2, max_epochs=2)))
    assert events == [
        ev.ModifyConfig(),
        ev.BeforeTrain(),
        ev.BeforeEpoch(0),
        ev.BeforeStep(1),
        ev.AfterStep(1),
        ev.BeforeStep(2),
        ev.AfterStep(2),
        ev.AfterEpoch(0),
        ev.BeforeEpoch(1),
        ev.BeforeStep(3),
        ev.AfterStep(3),
        ev.BeforeStep(4),
        ev.AfterStep(4),
        ev.AfterEpoch(1),
        ev.AfterTrain(),
    ]
    assert final.finished and next_event(final) is None
    assert final.progress == Progress(2, 2, epoch=1, iter_in_epoch=2, global_step=4)


def test_zero_epochs_goes_straight_to_after_train():
    """With max_epochs=0 the lifecycle is ModifyConfig, BeforeTrain, AfterTrain."""
    events, _ = walk(State(Progress(iters_per_epoch=3, max_epochs=0)))
    assert events == [ev.ModifyConfig(), ev.BeforeTrain(), ev.AfterTrain()]


def test_advance_counts_steps_and_samples():
    """AfterStep moves global_step, iter_in_epoch and samples_seen by the step's batch size."""
    s = advance(State(Progress(3, 1), position="BeforeStep"), ev.AfterStep(1, {"loss": 1.0}, batch_size=8))
    assert s.progress == Progress(3, 1, iter_in_epoch=1, global_step=1, samples_seen=8)
    assert s.position == "AfterStep"


def test_advance_rejects_out_of_order_after_step():
    """An AfterStep whose step is not global_step + 1 raises ValueError naming both."""
    s = State(Progress(3, 1, global_step=2, iter_in_epoch=2), position="BeforeStep")
    with pytest.raises(ValueError, match=r"AfterStep\(step=4\) out of order: global_step is 2"):
        advance(s, ev.AfterStep(4))
    with pytest.raises(ValueError, match=r"AfterStep\(step=2\) out of order"):
        advance(s, ev.AfterStep(2))


def test_advance_merges_published_metrics_without_moving_position():
    """MetricsPublished merges its values into metrics and leaves the position alone."""
    s = State(Progress(3, 1), metrics={"a": 1.0, "b": 2.0}, position="AfterStep")
    s2 = advance(s, ev.MetricsPublished({"b": 3.0}))
    assert s2.metrics == {"a": 1.0, "b": 3.0} and s2.position == "AfterStep"


def test_resumed_before_train_keeps_position():
    """BeforeTrain(resumed=True) leaves the restored position, so the run continues where it stopped."""
    s = State(Progress(3, 2, global_step=2, iter_in_epoch=2), position="AfterStep")
    assert advance(s, ev.BeforeTrain(resumed=True)) == s
    assert next_event(s) == ev.BeforeStep(3)


def test_next_event_rejects_unknown_position():
    """A position that is not a lifecycle name raises ValueError (it cannot be built through State)."""
    s = State(Progress(3, 1))
    object.__setattr__(s, "position", "Nope")
    with pytest.raises(ValueError, match="'Nope' is not a lifecycle event name"):
        next_event(s)


def _finished(iters=2, epochs=2):
    return walk(State(Progress(iters, epochs)))[1]


def test_resume_from_larger_max_epochs_continues_a_finished_run():
    """A finished 2-epoch run resumed with max_epochs=3 runs exactly epoch 2, then AfterTrain."""
    s = resume_from(_finished(), max_epochs=3)
    assert s.position == "AfterEpoch" and s.progress.max_epochs == 3
    events, final = walk(s)
    assert events == [
        ev.BeforeEpoch(2),
        ev.BeforeStep(5),
        ev.AfterStep(5),
        ev.BeforeStep(6),
        ev.AfterStep(6),
        ev.AfterEpoch(2),
        ev.AfterTrain(),
    ]
    assert final.progress.global_step == 6


def test_resume_from_same_or_none_is_identity():
    """resume_from with no or the same max_epochs returns the state unchanged."""
    s = _finished()
    assert resume_from(s) is s and resume_from(s, max_epochs=2) is s


def test_resume_from_fewer_epochs_than_trained_raises():
    """max_epochs below the epochs already trained raises ValueError saying how many."""
    with pytest.raises(ValueError, match=r"max_epochs=1 is below the 2 epoch\(s\) .* pass max_epochs >= 2"):
        resume_from(_finished(), max_epochs=1)


def test_resume_from_mid_epoch_needs_that_epoch():
    """A checkpoint in the middle of epoch 1 cannot be resumed with max_epochs=1 (it would train past it)."""
    s = state_at_step(State(Progress(10, 3)), 15)
    with pytest.raises(ValueError, match=r"max_epochs=1 is below the 2 epoch\(s\)"):
        resume_from(s, max_epochs=1)
    events, final = walk(resume_from(s, max_epochs=2))
    assert events[-2:] == [ev.AfterEpoch(1), ev.AfterTrain()] and final.progress.global_step == 20


def test_resume_from_fewer_epochs_ending_exactly_where_trained():
    """A checkpoint at the end of epoch 1 with max_epochs=2 goes straight to AfterTrain."""
    s = state_at_step(State(Progress(10, 5)), 20)
    assert walk(resume_from(s, max_epochs=2))[0] == [ev.AfterTrain()]


def test_state_at_step_mid_epoch_and_epoch_end():
    """Mid-epoch steps land after AfterStep; epoch-ending steps land after AfterEpoch."""
    base = State(Progress(10, 3))
    mid = state_at_step(base, 14)
    assert mid.position == "AfterStep"
    assert mid.progress == Progress(10, 3, epoch=1, iter_in_epoch=4, global_step=14)
    end = state_at_step(base, 20)
    assert end.position == "AfterEpoch"
    assert end.progress == Progress(10, 3, epoch=1, iter_in_epoch=10, global_step=20)
    assert state_at_step(base, 0) is base
    assert next_event(end) == ev.BeforeEpoch(2) and next_event(mid) == ev.BeforeStep(15)


@pytest.mark.parametrize("step", [-1, 31])
def test_state_at_step_out_of_range_raises(step):
    """A start step outside [0, max_steps] raises ValueError with the range and the value."""
    with pytest.raises(ValueError, match=rf"start step must be in \[0, 30\] \(got {step}\)"):
        state_at_step(State(Progress(10, 3)), step)


@given(iters=st.integers(1, 6), epochs=st.integers(0, 4), step=st.integers(0, 24))
def test_state_at_step_agrees_with_walking(iters, epochs, step):
    """Walking from state_at_step(k) gives the same remaining events as the full walk after step k's point."""
    base = State(Progress(iters, epochs))
    step = min(step, iters * epochs)
    full, final = walk(base)
    rest, final2 = walk(state_at_step(base, step))
    assert final2.progress == final.progress
    assert full[len(full) - len(rest) :] == rest
    assert sum(isinstance(e, ev.AfterStep) for e in rest) == iters * epochs - step


# -- a stop requested (State.stop) ---------------------------------------------------------------


def walk_stopping(state, after, reason="plateau"):
    """``walk``, with a stop requested right after the event ``after`` (as a Stop effect's follow-up would)."""
    seen = []
    event = next_event(state)
    while event is not None:
        seen.append(event)
        state = advance(state, event)
        if event == after:
            state = advance(state, ev.StopRequested(state.progress.global_step, reason))
        event = next_event(state)
    return seen, state


def test_stop_mid_epoch_closes_the_epoch_early_then_ends_training():
    """A stop after AfterStep(3) of a 4-step epoch: AfterEpoch(0) follows at once, then AfterTrain."""
    events, final = walk_stopping(State(Progress(4, 3)), ev.AfterStep(3))
    assert events[-3:] == [ev.AfterStep(3), ev.AfterEpoch(0), ev.AfterTrain()]
    assert final.finished and final.stop == "plateau"
    assert final.progress == Progress(4, 3, epoch=0, iter_in_epoch=3, global_step=3)


def test_stop_at_before_epoch_closes_that_epoch_without_a_step():
    """A stop at BeforeEpoch(1): AfterEpoch(1), AfterTrain; no step of epoch 1 trains."""
    events, final = walk_stopping(State(Progress(2, 3)), ev.BeforeEpoch(1))
    assert events[-3:] == [ev.BeforeEpoch(1), ev.AfterEpoch(1), ev.AfterTrain()]
    assert final.progress.global_step == 2


def test_stop_at_an_epochs_end_or_before_training_ends_training():
    """A stop at AfterEpoch (epochs left) or at BeforeTrain goes straight to AfterTrain."""
    events, _ = walk_stopping(State(Progress(2, 3)), ev.AfterEpoch(0))
    assert events[-2:] == [ev.AfterEpoch(0), ev.AfterTrain()]
    events, final = walk_stopping(State(Progress(2, 3)), ev.BeforeTrain())
    assert events == [ev.ModifyConfig(), ev.BeforeTrain(), ev.AfterTrain()] and final.progress.global_step == 0


def test_stop_at_before_step_still_trains_that_step():
    """A step whose BeforeStep ran trains: AfterStep comes before the epoch closes."""
    events, _ = walk_stopping(State(Progress(4, 1)), ev.BeforeStep(2))
    assert events[-4:] == [ev.BeforeStep(2), ev.AfterStep(2), ev.AfterEpoch(0), ev.AfterTrain()]


def test_stop_requested_keeps_the_first_reason_and_the_position():
    """StopRequested records its reason once (a later one changes nothing) and leaves the position alone."""
    s = State(Progress(4, 1, iter_in_epoch=1, global_step=1), position="AfterStep")
    s1 = advance(s, ev.StopRequested(1, "first"))
    assert (s1.stop, s1.position) == ("first", "AfterStep")
    assert advance(s1, ev.StopRequested(1, "second")) is s1
    assert advance(s, ev.StopRequested(1, "")).stop == "stop requested"


def test_a_stopped_run_resumed_with_more_epochs_stays_stopped():
    """resume_from(max_epochs=more) of a run that stopped early ends at once, training nothing."""
    _, final = walk_stopping(State(Progress(2, 2)), ev.AfterStep(1))
    assert walk(resume_from(final, max_epochs=5))[0] == [ev.AfterTrain()]


def test_a_state_checkpointed_before_stop_existed_decodes_as_not_stopped():
    """Encoded State data without the 'stop' field (an older checkpoint) decodes with stop=None."""
    from pimm_fn.core import codec

    data = codec.encode(State(Progress(4, 2), position="AfterStep"))
    del data["fields"]["stop"]
    restored = codec.decode(data)
    assert restored.stop is None and restored == State(Progress(4, 2), position="AfterStep")


def test_state_stop_must_be_a_str_or_none():
    """State(stop=...) refuses anything but None or a str, naming the field."""
    with pytest.raises(TypeError, match=r"'stop' must be None or a str \(got 1\)"):
        State(Progress(4, 2), stop=1)


@given(iters=st.integers(1, 5), epochs=st.integers(1, 4), at=st.integers(1, 20))
def test_a_stop_after_any_step_ends_training_at_that_step(iters, epochs, at):
    """Whatever the step it follows, a stop ends the walk with that global step, its epoch closed once."""
    at = min(at, iters * epochs)
    events, final = walk_stopping(State(Progress(iters, epochs)), ev.AfterStep(at))
    assert final.finished and final.progress.global_step == at
    assert events[-2:] == [ev.AfterEpoch((at - 1) // iters), ev.AfterTrain()]
    assert sum(isinstance(e, ev.AfterEpoch) for e in events) == (at - 1) // iters + 1
