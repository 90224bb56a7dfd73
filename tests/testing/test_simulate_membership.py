"""simulate_replicas: replicas lost and rejoining at any step, every live replica folding the same trace.

The properties over generated hook stacks and memberships, exact traces of a
hand-written membership, and the refusals.
"""

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn.core import dealing
from pimm_fn.core.plan import plan
from pimm_fn.core.effects import Evaluate, SaveCheckpoint, WriteBest
from pimm_fn.hooks import best_on, early_stop, evaluate_every, log_every, save_every
from pimm_fn.testing.assertions import (
    assert_epochs_dealt_once,
    assert_fault_tolerant,
    assert_heals_exact,
    assert_replicas_agree,
    assert_saves_once,
)
from pimm_fn.testing.replicas import DealtStep, Membership, simulate_replicas
from pimm_fn.testing.strategies import MetricStream, hook_stacks, memberships, metric_streams

from _kit_hooks import miou


@st.composite
def epochs(draw):
    """An epoch in samples: length, batch size, drop_last (with a full step of every replica when dropping)."""
    batch = draw(st.integers(1, 3))
    drop_last = draw(st.booleans())
    return draw(st.integers(batch * 4 if drop_last else 1, 24)), batch, drop_last


@st.composite
def jobs(draw):
    """A membership, a standard stack, and the rest of simulate_replicas' keywords (the epoch, a budget, metrics)."""
    length, batch, drop_last = draw(epochs())
    budget = draw(st.sampled_from(["max_epochs", "max_steps"]))
    schedule = {
        "length": length,
        "batch_size": batch,
        "drop_last": drop_last,
        budget: draw(st.integers(1, 2) if budget == "max_epochs" else st.integers(1, 16)),
        "metrics": draw(metric_streams(ranks=("all",))),
    }
    return draw(memberships(max_step=10)), draw(hook_stacks(max_every=4)), schedule


@settings(max_examples=60)
@given(job=jobs())
def test_any_membership_keeps_the_replicas_agreed_the_saves_single_and_the_epochs_whole(job):
    """Lost and rejoining replicas at any steps: agreement, exact heals, saves once, steps rising, each position once."""
    membership, stack, schedule = job
    result = simulate_replicas(stack, membership=membership, **schedule)
    assert_fault_tolerant(result)
    # The epoch's length followed the count of each step: one step per dealt batch, none beyond the order.
    for dealt in result.steps:
        assert dealt.participants == membership.live(dealt.step)


@settings(max_examples=30)
@given(membership=memberships(max_step=8), stack=hook_stacks(max_every=3, broadcast=True))
def test_early_stop_under_any_membership_stops_every_live_replica_at_one_step(membership, stack):
    """A collective stop from a broadcast metric: every live replica stops at the same step, the checks hold."""
    hooks = [*stack, early_stop("mIoU", patience=1)]
    metrics = MetricStream("mIoU", (0.5, 0.25, 0.25))
    result = simulate_replicas(hooks, membership=membership, length=12, batch_size=1, max_epochs=2, metrics=metrics)
    assert_fault_tolerant(result)
    live = result.moments[-1].live
    assert len({result.runs[r].state.progress.global_step for r in live}) == 1


HOOKS = [evaluate_every(2, miou), save_every(3), best_on("mIoU")]
SCORES = {2: {"mIoU": 0.5}, 4: {"mIoU": 0.75}, 6: {"mIoU": 0.25}}


def test_a_replica_lost_at_step_2_and_back_at_step_4_folds_the_survivors_trace_from_its_heal():
    """3 replicas, 10 samples of 1: replica 1 dies in step 2 (its vote fails), heals at 3, trains 4 on."""
    membership = Membership(3, lost={1: 2}, rejoined={1: 4})
    result = simulate_replicas(HOOKS, membership=membership, length=10, batch_size=1, max_epochs=1, metrics=SCORES)
    # Step 2 drawn by all three, discarded; drawn again by 0 and 2 from the same cursor.
    assert result.discarded == (DealtStep(2, 0, 3, (0, 1, 2), ((3,), (4,), (5,))),)
    assert [(s.step, s.cursor, s.participants) for s in result.steps] == [
        (1, 0, (0, 1, 2)),
        (2, 3, (0, 2)),
        (3, 5, (0, 2)),
        (4, 7, (0, 1, 2)),
    ]
    assert result.steps[-1].positions == ((7,), (8,), (9,))
    survivor = [(e.step, e.during, e.effect) for e in result.runs[0].trace]
    assert survivor == [
        (2, "AfterStep", Evaluate("miou", 2)),
        (2, "AfterStep", WriteBest("mIoU", 0.5, 2)),
        (3, "AfterStep", SaveCheckpoint(3)),
        (4, "AfterStep", Evaluate("miou", 4)),
        (4, "AfterStep", WriteBest("mIoU", 0.75, 4)),
        (4, "AfterTrain", SaveCheckpoint(4, final=True)),
    ]
    assert [(e.step, e.during, e.effect) for e in result.runs[2].trace] == survivor
    # Replica 1: step 2's evaluation before it died... no: it died in step 2, before its AfterStep.
    assert [(e.step, e.during, e.effect) for e in result.runs[1].trace] == survivor[3:]
    assert result.runs[1].absent == (2, 3) and result.runs[0].absent == ()
    (heal,) = result.runs[1].heals
    assert (heal.source, heal.step, heal.index) == (0, 3, 0)
    assert heal.received == heal.sent
    # Each save written once, by replica 0.
    assert [(s.step, s.effect, s.replica) for s in result.saves] == [
        (2, WriteBest("mIoU", 0.5, 2), 0),
        (3, SaveCheckpoint(3), 0),
        (4, WriteBest("mIoU", 0.75, 4), 0),
        (4, SaveCheckpoint(4, final=True), 0),
    ]
    assert all(s == result.states[0] for s in result.states)
    assert result.states[0].best["mIoU"] == 0.75
    assert_fault_tolerant(result)


def test_losing_replica_0_hands_the_saves_to_the_lowest_live_replica():
    """Participating rank 0 moves: replica 0 lost at step 3 for good, replica 1 writes from then on."""
    membership = Membership(2, lost={0: 3}, failed_votes=False)
    result = simulate_replicas([save_every(2)], membership=membership, length=6, batch_size=1, max_epochs=1)
    # 2 + ceil(2/1): the epoch's length after the loss is the two steps done and the four positions left.
    assert [(s.step, s.participants) for s in result.steps] == [(1, (0, 1)), (2, (0, 1)), (3, (1,)), (4, (1,))]
    assert [(s.step, s.replica) for s in result.saves] == [(2, 0), (4, 1)]
    assert result.discarded == ()
    assert result.states[0].progress.global_step == 2 and result.states[1].finished
    assert_fault_tolerant(result)


def test_a_rejoin_shortens_the_epoch_and_drop_last_leaves_its_tail():
    """One replica of two at first; the second joins at step 2: the epoch's rest dealt over two, its tail dropped."""
    membership = Membership(2, lost={1: 1}, rejoined={1: 2}, failed_votes=False)
    result = simulate_replicas(
        [save_every(1)], membership=membership, length=9, batch_size=2, drop_last=True, max_epochs=2
    )
    epoch_0 = [(s.cursor, s.participants) for s in result.steps if s.epoch == 0]
    assert epoch_0 == [(0, (0,)), (2, (0, 1))]  # then 3 positions left: less than a step of two
    assert [s.participants for s in result.steps if s.epoch == 1] == [(0, 1), (0, 1)]  # 9 // 4
    assert [(h.source, h.step) for h in result.runs[1].heals] == [(0, 1)]
    # Step 2 ends the first epoch: its save deferred past AfterEpoch, as step 4's, which is also the last.
    assert [(e.step, e.during) for e in result.runs[1].trace] == [
        (2, "AfterEpoch"),
        (3, "AfterStep"),
        (4, "AfterEpoch"),
    ]
    assert [(e.step, e.during) for e in result.runs[0].trace] == [(1, "AfterStep")] + [
        (e.step, e.during) for e in result.runs[1].trace
    ]
    assert_fault_tolerant(result)


def test_a_replica_healed_at_the_boundary_where_its_rejoin_ends_the_epoch_ends_at_the_heal():
    """Replica 0 dies in step 1 and is back for step 4: with two replicas the dropped tail leaves no step 4."""
    membership = Membership(2, lost={0: 1}, rejoined={0: 4})
    result = simulate_replicas(
        [save_every(1)], membership=membership, length=4, batch_size=1, drop_last=True, max_epochs=1
    )
    assert [(s.step, s.participants) for s in result.steps] == [(1, (1,)), (2, (1,)), (3, (1,))]
    assert [(h.step, h.source) for h in result.runs[0].heals] == [(3, 1)]
    assert result.states[0] == result.states[1] and result.states[0].progress.global_step == 3
    assert result.runs[0].absent == (1, 2, 3)
    assert_fault_tolerant(result)


def test_per_replica_outputs_in_a_trace_are_reported_naming_the_moment():
    """A hook logging each replica's own loss makes the traces differ: the agreement check says where."""
    result = simulate_replicas(
        [log_every(1)],
        membership=Membership(2),
        length=4,
        batch_size=1,
        max_epochs=1,
        local=lambda step, replica: {"loss": float(replica)},
    )
    with pytest.raises(AssertionError, match="live replicas fold different traces at global step 1, during AfterStep"):
        assert_replicas_agree(result)


def test_a_save_executed_twice_or_by_the_wrong_replica_is_reported():
    """The saves check reads what the replicas executed: a second writer fails it."""
    result = simulate_replicas([save_every(2)], membership=Membership(2), length=4, batch_size=1, max_epochs=1)
    assert_saves_once(result)
    doubled = attrs.evolve(result, saves=(*result.saves, attrs.evolve(result.saves[0], replica=1)))
    with pytest.raises(AssertionError, match="each must be executed once, by replica 0"):
        assert_saves_once(doubled)


def test_a_position_dealt_twice_is_reported():
    result = simulate_replicas([], membership=Membership(2), length=4, batch_size=1, max_epochs=1)
    bad = attrs.evolve(result.steps[1], positions=((0,), (1,)))
    with pytest.raises(AssertionError, match="epoch 0, step 2"):
        assert_epochs_dealt_once(attrs.evolve(result, steps=(result.steps[0], bad)))


def test_the_epochs_length_follows_dealing():
    """Every step count is the one pimm_fn.core.dealing gives for the participants."""
    membership = Membership(3, lost={2: 2})
    result = simulate_replicas([], membership=membership, length=11, batch_size=2, max_epochs=1)
    left = dealing.steps_left(6, length=11, batch_size=2, participants=2, drop_last=False)
    assert len(result.steps) == 1 + left
    assert result.states[0].progress.iters_per_epoch == 1 + left


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(replicas=0), ValueError, "'replicas'"),
        (dict(replicas=2, lost={2: 1}), ValueError, r"'lost' must map replicas in \[0, 2\) to steps >= 1"),
        (dict(replicas=2, lost={0: 0}), ValueError, "'lost' must map replicas"),
        (dict(replicas=2, lost=[(0, 1), (0, 2)]), ValueError, "'lost' names replica 0 twice"),
        (dict(replicas=2, lost={0: 3}, rejoined={0: 3}), ValueError, "'rejoined' brings replica 0 back at step 3"),
        (dict(replicas=2, rejoined={1: 3}), ValueError, "'rejoined' names replica 1, which 'lost' does not lose"),
        (dict(replicas=2, lost={0: 3, 1: 2}), ValueError, "no replica is alive at step 3"),
        (dict(replicas=2, lost=5), TypeError, "expected a mapping"),
        (dict(replicas=2, failed_votes=1), TypeError, "'failed_votes'"),
    ],
)
def test_membership_refuses_naming_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        Membership(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(membership=3), TypeError, "'membership' must be a Membership"),
        (dict(length=0), ValueError, "simulate_replicas.*'length'"),
        (dict(batch_size=0), ValueError, "'batch_size'"),
        (dict(max_epochs=0), ValueError, "'max_epochs'"),
        (dict(max_steps=4), TypeError, "exactly one of max_epochs= .* and max_steps="),
        (dict(drop_last=1), TypeError, "'drop_last'"),
        (dict(drop_last=True, length=1), ValueError, "with drop_last, 'length' \\(1\\) must hold a full step"),
        (dict(local=5), TypeError, "'local' must be a callable"),
    ],
)
def test_simulate_replicas_refuses_naming_the_argument(kwargs, error, match):
    arguments = dict(membership=Membership(2), length=8, batch_size=1, max_epochs=1) | kwargs
    with pytest.raises(error, match=match):
        simulate_replicas([save_every(1)], **arguments)


def test_the_assertions_take_only_a_replicas_result():
    with pytest.raises(TypeError, match="assert_replicas_agree takes what simulate_replicas"):
        assert_replicas_agree([])


def _job_trace(result) -> list:
    """The trace the job folded: at each moment, what its lowest-numbered live replica folded."""
    owners = {tick: moment.live[0] for tick, moment in enumerate(result.moments)}
    owned = [
        (tick, entry)
        for run in result.runs
        for entry, tick in zip(run.trace, run.ticks)
        if tick is not None and owners[tick] == run.replica
    ]
    return [entry.to_trace_entry() for _, entry in sorted(owned, key=lambda pair: pair[0])]  # stable: in order


@settings(max_examples=60)
@given(job=jobs())
def test_plan_under_a_membership_is_the_trace_every_live_replica_folds(job):
    """plan(membership=...) predicts the job: its trace, its saves, where it ends."""
    membership, stack, schedule = job
    result = simulate_replicas(stack, membership=membership, **schedule)
    planned = plan(stack, membership=membership, outputs=(), **schedule)
    assert list(planned) == _job_trace(result)
    saves = [e.effect for e in planned if isinstance(e.effect, (SaveCheckpoint, WriteBest))]
    assert saves == [s.effect for s in result.saves]


def test_a_heal_that_does_not_hand_over_the_state_or_comes_from_a_lost_replica_is_reported():
    result = simulate_replicas(
        [save_every(2)], membership=Membership(2, lost={1: 2}, rejoined={1: 3}), length=8, batch_size=1, max_epochs=1
    )
    assert_heals_exact(result)
    (heal,) = result.runs[1].heals
    behind = attrs.evolve(heal, received=attrs.evolve(heal.received, slots=((),)))
    with pytest.raises(AssertionError, match="replica 1 healed from replica 0 at step 2 holds another state: slots"):
        assert_heals_exact(attrs.evolve(result, runs=(result.runs[0], attrs.evolve(result.runs[1], heals=(behind,)))))
    lost_source = attrs.evolve(heal, source=1)
    with pytest.raises(AssertionError, match="the source must be live before the heal"):
        assert_heals_exact(
            attrs.evolve(result, runs=(result.runs[0], attrs.evolve(result.runs[1], heals=(lost_source,))))
        )


@settings(max_examples=30)
@given(job=jobs())
def test_a_discarded_step_leaves_nothing_the_standard_hooks_see(job):
    """The same losses between steps or failing their steps' votes: the same committed steps, traces and states.

    The standard hooks act on no BeforeStep, so a failed vote's attempt folds nothing they see.
    """
    membership, stack, schedule = job
    failing = simulate_replicas(stack, membership=attrs.evolve(membership, failed_votes=True), **schedule)
    between = simulate_replicas(stack, membership=attrs.evolve(membership, failed_votes=False), **schedule)
    assert failing.steps == between.steps
    assert [s.effect for s in failing.saves] == [s.effect for s in between.saves]
    assert [run.trace for run in failing.runs] == [run.trace for run in between.runs]
    assert failing.states == between.states
    assert between.discarded == ()
