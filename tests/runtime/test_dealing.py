"""The training data dealt over a changing membership: each sample of an epoch once."""

import collections
import json

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, TensorDataset

from pimm_fn.runtime.data.dealing import Dealer
from pimm_fn.runtime.data.feed import Feed


def _indexed(n: int) -> TensorDataset:
    """``n`` samples ``(x, y)`` whose ``x[0]`` is the sample's index, so a batch says which samples it holds."""
    x = torch.zeros(n, 4)
    x[:, 0] = torch.arange(n, dtype=torch.float32)
    return TensorDataset(x, torch.zeros(n, 1))


def _loader(n: int = 23, batch_size: int = 2, *, shuffled: bool = True, drop_last: bool = False) -> DataLoader:
    data = _indexed(n)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5) if shuffled else None
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last)


def _indices(batch) -> list[int]:
    return batch[0][:, 0].int().tolist()


def test_each_sample_of_the_epoch_is_trained_once_across_a_changing_membership_and_a_discarded_step():
    """Replicas joining and leaving between steps (1, 2, 3 participants), one step discarded and dealt again: every sample once, the tail padded."""
    replicas = [Dealer(_loader()) for _ in range(3)]
    for dealer in replicas:
        dealer.start_epoch(2)
    seen: collections.Counter = collections.Counter()
    memberships = [(0,), (0, 1), (0, 1, 2), (1, 2), (2,), (0, 2), (0, 1, 2)]
    discarded_once, step = False, 0
    while replicas[0].steps_left(3):
        live = memberships[step % len(memberships)]
        batches = [replicas[r].draw(i, len(live)) for i, r in enumerate(live)]
        if step == 3 and not discarded_once:  # the vote failed: nothing counted, the same positions dealt next
            discarded_once = True
            for r in live:
                replicas[r].discard()
            again = [_indices(replicas[r].draw(i, len(live))) for i, r in enumerate(live)]
            assert again == [_indices(b) for b in batches]
        for r in live:
            replicas[r].commit()
        for r in set(range(3)) - set(live):  # a replica out of the step heals from a live one: the cursor too
            replicas[r].load_state_dict(replicas[live[0]].state_dict())
        seen.update(i for b in batches for i in _indices(b))
        step += 1
    assert set(seen) == set(range(23))
    assert sum(seen.values()) - 23 <= 2  # only the tail's padding repeats, at most participants - 1 samples
    order = replicas[0]._order
    assert sorted(order) == list(range(23)) and list(order) != list(range(23))  # the sampler's shuffled epoch


def test_a_batch_is_fetched_as_the_loader_fetches_it():
    """Dealt to one participant, a SequentialSampler epoch's batches are the loader's own."""
    loader = _loader(shuffled=False)
    dealer = Dealer(loader)
    dealer.start_epoch(0)
    for expected in loader:
        got = dealer.draw(0, 1)
        dealer.commit()
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert dealer.steps_left(1) == 0 and dealer.cursor == 23


def test_the_epochs_length_follows_the_participants_from_the_cursor():
    """``steps_left`` is the rest over ``batch_size * participants`` steps, the tail counted unless drop_last."""
    dealer = Dealer(_loader(20, 2))
    dealer.start_epoch(0)
    assert dealer.steps_left(1) == 10 and dealer.steps_left(3) == 4
    dealer.draw(1, 2)
    dealer.commit()
    assert dealer.cursor == 4 and dealer.steps_left(3) == 3 and dealer.steps_left(2) == 4
    dropping = Dealer(_loader(20, 2, drop_last=True))
    dropping.start_epoch(0)
    assert dropping.steps_left(3) == 3
    for _ in range(3):
        dropping.draw(0, 3)
        dropping.commit()
    with pytest.raises(RuntimeError, match="no step left for 3"):
        dropping.draw(0, 3)
    assert dropping.steps_left(1) == 1  # two samples left: one participant's batch


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class _MySampler(DistributedSampler):
    pass


@pytest.mark.parametrize(
    "data, named",
    [
        (DataLoader(_indexed(8), batch_size=2, shuffle=True), "RandomSampler"),
        (DataLoader(_indexed(8), batch_sampler=BatchSampler(range(8), 2, False)), "batch_sampler="),
        (DataLoader(_Stream(), batch_size=2), "IterableDataset"),
        (iter([1, 2, 3]), "one-shot iterator"),
        (DataLoader(_indexed(8), batch_size=2, sampler=_MySampler(_indexed(8), 1, 0)), "_MySampler"),
    ],
)
def test_data_whose_order_other_replicas_cannot_compute_is_refused_saying_what_to_pass(data, named):
    """Another sampler, batch_sampler=, an iterable dataset, a one-shot iterator: a TypeError naming it and the fix."""
    with pytest.raises(TypeError, match="cannot be dealt") as caught:
        Dealer(data)
    assert named in str(caught.value) and "sampler=DistributedSampler(dataset" in str(caught.value)


def test_a_dealer_refuses_draws_and_commits_out_of_turn():
    """A draw before an epoch begun, a commit with nothing drawn, or twice: each a clear error."""
    dealer = Dealer(_loader())
    with pytest.raises(RuntimeError, match="start_epoch"):
        dealer.draw(0, 1)
    dealer.start_epoch(0)
    with pytest.raises(RuntimeError, match="nothing drawn"):
        dealer.commit()
    dealer.draw(0, 1)
    dealer.commit()
    with pytest.raises(RuntimeError, match="nothing drawn"):
        dealer.commit()
    with pytest.raises(ValueError, match="participant 2 of 2"):
        dealer.draw(2, 2)


def test_the_state_round_trips_through_json_and_a_bad_one_is_refused():
    """``state_dict`` is JSON; loaded into a fresh dealer it deals the same positions; a wrong record is refused unchanged."""
    dealer = Dealer(_loader())
    dealer.start_epoch(4)
    dealer.draw(0, 3)
    dealer.commit()
    saved = json.loads(json.dumps(dealer.state_dict()))
    assert saved == {"epoch": 4, "cursor": 6}
    other = Dealer(_loader())
    other.load_state_dict(saved)
    assert _indices(other.draw(1, 2)) == _indices(dealer.draw(1, 2))
    for bad in (
        "x",
        {"epoch": 0},
        {"epoch": -1, "cursor": 0},
        {"epoch": 0, "cursor": 24},
        {"epoch": 0, "cursor": True},
    ):
        with pytest.raises(ValueError, match="cannot continue at"):
            other.load_state_dict(bad)
        assert other.state_dict() == saved


def test_a_dealing_feed_draws_for_the_membership_and_keeps_the_cursor_in_its_state():
    """``Feed.deal``: next_batch is the dealt batch of ``membership()``; the feed's state carries the dealer's and restores it."""
    membership = [(0, 1)]
    feed = Feed(_loader())
    dealer = feed.deal(lambda: membership[0])
    assert feed.dealer is dealer
    feed.start_epoch(1)
    first = _indices(feed.next_batch())
    dealer.commit()
    membership[0] = (1, 2)
    second = _indices(feed.next_batch())
    dealer.commit()
    order = dealer._order
    assert first == [order[0], order[1]] and second == [order[4], order[5]]
    cursor = feed.state_dict()
    assert cursor["dealt"] == {"epoch": 1, "cursor": 6}
    healed = Feed(_loader())
    healed.deal(lambda: (0, 1))
    healed.resume(cursor, 1, 2)
    assert healed.dealer.state_dict() == cursor["dealt"]
    assert "dealt" not in Feed(_loader()).state_dict()  # a plain feed's cursor is as it was


def test_a_grouped_feed_is_not_dealt():
    """accumulate above 1 is refused by ``Feed.deal``, saying what to do instead."""
    with pytest.raises(ValueError, match="accumulate=2"):
        Feed(_loader(), group=2).deal(lambda: (0, 1))
