"""Dealing an epoch over a changing number of participants: each position once, lengths that agree."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core.dealing import advanced, deal, step_positions, steps_left


def _epoch(length, batch_size, memberships, drop_last):
    """Every committed step's positions, dealt to the participants of each step in turn (the last count repeats)."""
    cursor, steps, i = 0, [], 0
    while steps_left(cursor, length=length, batch_size=batch_size, participants=memberships[i], drop_last=drop_last):
        n = memberships[i]
        steps.append(
            [deal(cursor, length=length, batch_size=batch_size, participant=p, participants=n) for p in range(n)]
        )
        cursor = advanced(cursor, length=length, batch_size=batch_size, participants=n)
        i = min(i + 1, len(memberships) - 1)
    return steps


@given(
    length=st.integers(1, 60),
    batch_size=st.integers(1, 5),
    memberships=st.lists(st.integers(1, 4), min_size=1, max_size=30),
)
def test_each_position_is_trained_once_whatever_the_membership_and_the_tail_pads_at_most_n_minus_1(
    length, batch_size, memberships
):
    steps = _epoch(length, batch_size, memberships, drop_last=False)
    seen = [p for step in steps for share in step for p in share]
    assert set(seen) == set(range(length))
    last = steps[-1]
    assert len(seen) - length <= len(last) - 1  # only the tail's padding repeats
    for step in steps:
        assert len({len(share) for share in step}) == 1  # every participant trains a batch of the same size
        assert all(share for share in step)


@given(
    length=st.integers(1, 60),
    batch_size=st.integers(1, 5),
    memberships=st.lists(st.integers(1, 4), min_size=1, max_size=30),
)
def test_with_drop_last_every_step_is_full_and_no_position_repeats(length, batch_size, memberships):
    steps = _epoch(length, batch_size, memberships, drop_last=True)
    seen = [p for step in steps for share in step for p in share]
    assert len(seen) == len(set(seen))
    assert all(len(share) == batch_size for step in steps for share in step)
    assert set(seen) == set(range(len(seen)))  # a prefix of the epoch: only the tail is left out


@given(length=st.integers(1, 60), batch_size=st.integers(1, 5), n=st.integers(1, 4), drop_last=st.booleans())
def test_steps_left_counts_the_steps_a_constant_membership_deals(length, batch_size, n, drop_last):
    assert len(_epoch(length, batch_size, [n], drop_last)) == steps_left(
        0, length=length, batch_size=batch_size, participants=n, drop_last=drop_last
    )


def test_a_discarded_step_deals_the_same_positions_again():
    first = deal(4, length=20, batch_size=2, participant=1, participants=3)
    assert first == (6, 7)
    assert deal(4, length=20, batch_size=2, participant=1, participants=3) == first  # the cursor did not move
    assert deal(4, length=20, batch_size=2, participant=1, participants=2) == (6, 7)  # nor with fewer participants


def test_the_tail_wraps_to_the_rests_first_positions():
    assert [deal(9, length=10, batch_size=4, participant=p, participants=3) for p in range(3)] == [(9,), (9,), (9,)]
    assert step_positions(9, length=10, batch_size=4, participants=3) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(cursor=10, participant=0, participants=2), "all consumed"),
        (dict(cursor=0, participant=2, participants=2), "participant 2 of 2"),
        (dict(cursor=11, participant=0, participants=2), "past the epoch"),
        (dict(cursor=0, participant=0, participants=0), "'participants' must be an int >= 1"),
    ],
)
def test_a_bad_deal_is_refused_naming_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        deal(length=10, batch_size=2, **kwargs)
