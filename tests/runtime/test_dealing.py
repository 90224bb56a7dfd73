"""The training data dealt over a changing membership: each sample of an epoch once, and a plain resume goes on after it."""

import collections
import json
import types
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, TensorDataset

import pimm_fn as pf
from pimm_fn.runtime.data import positioning
from pimm_fn.runtime.data.dealing import Dealer
from pimm_fn.runtime.data.feed import Feed
from pimm_fn.runtime.errors import ResumeNotExactWarning


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


class _FailsOnce(torch.utils.data.Dataset):
    """Draws a random number per sample (an augmentation), and raises once, on its third sample."""

    def __init__(self):
        self.calls = 0

    def __len__(self):
        return 10

    def __getitem__(self, i):
        self.calls += 1
        noise = torch.rand(())
        if self.calls == 3:
            raise OSError("a read that failed")
        return torch.tensor(float(i)) + 0 * noise


def test_a_dealt_fetch_that_raises_is_drawn_again_from_the_same_rng():
    """A fetch that raises moves no cursor and puts the torch RNG back: the next call returns the batch it would have."""
    feed = Feed(DataLoader(_FailsOnce(), batch_size=4))
    feed.deal(lambda: (1, 2))
    feed.start_epoch(0)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(OSError, match="a read that failed"):
        feed.next_batch()
    assert torch.equal(torch.get_rng_state(), before)
    assert feed.next_batch().tolist() == [4.0, 5.0, 6.0, 7.0]
    assert feed.dealer.cursor == 0


def test_a_plain_checkpoint_resumed_mid_epoch_by_a_dealing_feed_is_dealt_from_the_epochs_start_saying_so():
    """A plain cursor holds no dealt position: the epoch is dealt from position 0, with a warning saying so."""
    plain = Feed(_loader())
    plain.start_epoch(1)
    plain.next_batch()
    feed = Feed(_loader())
    feed.deal(lambda: (0, 1))
    with pytest.warns(ResumeNotExactWarning, match="dealt from its start"):
        feed.resume(plain.state_dict(), 1, 1)
    assert feed.dealer.state_dict() == {"epoch": 1, "cursor": 0}


def test_a_grouped_feed_is_not_dealt():
    """accumulate above 1 is refused by ``Feed.deal``, saying what to do instead."""
    with pytest.raises(ValueError, match="accumulate=2"):
        Feed(_loader(), group=2).deal(lambda: (0, 1))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.layer(x) - y) ** 2).mean()}


def _run(save_dir, seen, *, resume=None, dealt=None, shuffled=True, max_epochs=1):
    """A single-process run over 24 samples in batches of 2 (12 steps an epoch), recording the samples each step trains.

    ``dealt``: the ``(participant, participants)`` of each step in turn; the step commits its draw.
    """
    torch.manual_seed(0)
    model = _Model()
    holder = {}

    def step_fn(model, optimizer, batch, *, scheduler=None, scaler=None):
        optimizer.zero_grad()
        loss = model(batch)["loss"]
        loss.backward()
        optimizer.step()
        seen.append(_indices(batch))
        if "feed" in holder:
            holder["feed"].dealer.commit()  # as the fault-tolerant loop does after a committed step
        return {"loss": loss}

    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _loader(24, 2, shuffled=shuffled),
        hooks=[pf.save_every(1)],
        step_fn=step_fn,
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
    )
    if dealt is not None:
        feed = holder["feed"] = run.ctx.feed
        feed.deal(lambda: dealt[min(len(seen), len(dealt) - 1)])
    return run


@pytest.mark.parametrize("shuffled", [True, False])
def test_a_dealing_runs_checkpoint_resumes_plainly_with_exactly_the_rest_of_the_epoch(tmp_path, shuffled):
    """Dealt over 1, 3, 3, then 2 participants (18 samples consumed, this replica training 8), resumed plainly: the other 6, once."""
    dealt_seen: list = []
    dealing = _run(tmp_path, dealt_seen, dealt=[(0, 1), (2, 3), (1, 3), (0, 2)], shuffled=shuffled)
    dealing.run(steps=4)
    cursor = dealing.ctx.feed.state_dict()["dealt"]
    assert cursor == {"epoch": 0, "cursor": 2 + 6 + 6 + 4}  # every participant's batches, not only this one's
    order = dealing.ctx.feed.dealer._order
    assert [i for b in dealt_seen for i in b] == [order[p] for p in (0, 1, 6, 7, 10, 11, 14, 15)]
    plain_seen: list = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = _run(tmp_path, plain_seen, resume="auto", shuffled=shuffled)
    said = [str(w.message) for w in caught if issubclass(w.category, ResumeNotExactWarning)]
    assert len(said) == 1 and "dealt its data" in said[0] and "18 samples consumed" in said[0], said
    assert plain.state.progress.iter_in_epoch == 12 - 3  # the 6 samples left are 3 batches of 2
    plain.run()
    rest = [i for b in plain_seen for i in b]
    assert rest == [order[p] for p in range(18, 24)]
    p = plain.state.progress
    assert p.epoch == 0 and p.at_epoch_end and p.global_step == 4 + 3


def test_a_dealing_runs_checkpoint_continues_on_another_world_size_after_the_cursor(tmp_path):
    """Resumed on 2 ranks (a DistributedSampler each), the epoch's rest after the dealt cursor is shared: each sample once."""
    dealing = _run(tmp_path, [], dealt=[(0, 1), (2, 3), (1, 3), (0, 2)])
    dealing.run(steps=4)
    cursor, order = dealing.ctx.feed.state_dict(), dealing.ctx.feed.dealer._order
    info = types.SimpleNamespace(step=4, world_size=1)
    rests = []
    for rank in range(2):
        data = _indexed(24)
        loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, num_replicas=2, rank=rank, seed=5))
        ctx = types.SimpleNamespace(feed=Feed(loader), world_size=2, say=print)
        offset, why = positioning.world_offset(dealing.state.progress, ctx, info, cursor)
        assert (offset, why) == (18, "")
        with pytest.warns(ResumeNotExactWarning, match="18 samples consumed on all ranks"):
            state = positioning.new_world(dealing.state, ctx, info, offset, why, cursor)
        assert state.progress.iter_in_epoch == 6 - 2  # 6 samples left, shared: 2 batches of 2, the last padded
        rests.append([i for batch in ctx.feed.data for i in _indices(batch)])
    shared = [i for rest in rests for i in rest]
    assert set(shared) == {order[p] for p in range(18, 24)} and len(shared) == 6
