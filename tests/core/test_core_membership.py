"""core.membership: who takes part in each step, the epoch resized for them, and plan(membership=...)."""

import pytest

from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.membership import Membership, resized
from pimm_fn.core.plan import plan
from pimm_fn.core.state import Progress, State
from pimm_fn.hooks import save_every


def test_a_loss_fails_its_steps_vote_unless_it_falls_between_steps():
    m = Membership(3, lost={1: 2, 2: 4}, rejoined={1: 3})
    assert [m.live(step) for step in (1, 2, 3, 4)] == [(0, 1, 2), (0, 2), (0, 1, 2), (0, 1)]
    assert m.attempt(2, (0, 1, 2)) == (0, 1, 2)
    assert m.attempt(3, (0, 2)) is None  # a rejoin alone fails no vote
    assert m.attempt(4, (0, 1, 2)) == (0, 1, 2)
    assert Membership(3, lost={1: 2}, failed_votes=False).attempt(2, (0, 1, 2)) is None


def test_resized_keeps_the_steps_done_and_counts_the_ones_left_for_the_participants():
    state = State(Progress(4, 2, iter_in_epoch=2, global_step=2))
    assert resized(state, 6, 3, length=12, batch_size=1, drop_last=False) is state  # 2 done, 6 left: 2 steps of 3
    assert resized(state, 6, 1, length=12, batch_size=1, drop_last=False).progress.iters_per_epoch == 8
    assert resized(state, 6, 4, length=12, batch_size=1, drop_last=True).progress.iters_per_epoch == 3
    assert resized(state, 0, 4, length=12, batch_size=1, drop_last=False, done=0).progress.iters_per_epoch == 3


def test_plan_under_a_membership_lengthens_the_epoch_a_loss_leaves_to_fewer():
    """24 samples, 2 a replica a step: 3 steps of four replicas; losing two at step 2 makes it 1 + 8 // 4 = 5."""
    trace = plan([save_every(1)], membership=Membership(4, lost={0: 2, 1: 2}), length=24, batch_size=2, max_epochs=1)
    assert [e.step for e in trace] == [1, 2, 3, 4, 5]
    assert trace[-1].effect == SaveCheckpoint(5, deferred=True)


def test_plan_under_a_membership_ends_the_epoch_in_progress_at_max_steps():
    """12 samples, 2 a replica a step: 2 steps of two, then 2 of one, an epoch of 4; the next cut at step 6."""
    trace = plan([save_every(4)], membership=Membership(2, lost={1: 3}), length=12, batch_size=2, max_steps=6)
    assert [(e.step, type(e.event).__name__, e.effect) for e in trace] == [
        (4, "AfterEpoch", SaveCheckpoint(4, deferred=True)),
        (6, "AfterTrain", SaveCheckpoint(6, final=True)),
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(), TypeError, "plan: 'iters_per_epoch' is required"),
        (dict(iters_per_epoch=4, length=8), TypeError, "'length', 'batch_size' and 'drop_last' go with 'membership'"),
        (dict(membership=2, length=8, batch_size=1), TypeError, "plan: 'membership' must be a Membership"),
        (dict(membership=Membership(2), batch_size=1), ValueError, "plan.*'length'"),
        (dict(membership=Membership(2), length=8, batch_size=1, iters_per_epoch=4), TypeError, "takes no 'iters"),
        (dict(membership=Membership(2), length=8, batch_size=1, start_step=2), TypeError, "takes no 'start_step'"),
        (dict(membership=Membership(2), length=1, batch_size=1, drop_last=True), ValueError, "with drop_last"),
    ],
)
def test_plan_refuses_a_membership_without_its_epoch_in_samples_or_with_what_it_does_not_model(kwargs, error, match):
    arguments = {"max_epochs": 1} | kwargs
    with pytest.raises(error, match=match):
        plan([save_every(1)], **arguments)
