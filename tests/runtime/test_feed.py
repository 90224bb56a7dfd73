"""The feed's hold on a loader's iterator: a run dropped mid-epoch lets its worker processes go at once; a
stateful loader's iterator rebuilt after failures leaves the RNG as an uninterrupted run's."""

import gc
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from pimm_fn.runtime.data.feed import Feed


def _run_with_workers():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = DataLoader(TensorDataset(torch.randn(48, 4)), batch_size=4, num_workers=2)

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        optimizer.zero_grad()
        model(batch[0]).pow(2).mean().backward()
        optimizer.step()
        return {}

    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        max_epochs=1,
        step_fn=step,
        hooks=[lambda s, e: (s, ())],
    )


def test_a_run_dropped_mid_epoch_shuts_its_loaders_workers_down_cleanly():
    """Collected in its reference cycle, the run's loader still sends its workers the signal to exit.

    Before, the queues' finalizers could run first: torch's shutdown then
    waited 5 s a worker (10 s here) for an exit its closed queues never
    asked for. The bound is that wait's, not a speed: a clean shutdown
    takes a fraction of a second even on a busy machine.
    """
    before = set(multiprocessing.active_children())
    run = _run_with_workers()
    run.run(steps=3)
    workers = [p for p in multiprocessing.active_children() if p not in before]
    assert len(workers) == 2
    del run
    began = time.monotonic()
    gc.collect()
    took = time.monotonic() - began
    assert not any(w.is_alive() for w in workers)
    assert took < 5.0, f"collecting the dropped run took {took:.1f} s: its workers were waited for, not signalled"


class _Flaky:
    """A loader whose ``fail``-ed calls raise: ``("fetch", n)`` before the n-th batch, ``("open", n)`` after the n-th
    ``iter()`` opened the loader's iterator (its seed drawn); everything else is the wrapped loader's."""

    def __init__(self, data, fail):
        self.data, self.fail, self.calls = data, set(fail), {"fetch": 0, "open": 0}

    def _call(self, site):
        self.calls[site] += 1
        if (site, self.calls[site]) in self.fail:
            raise RuntimeError(f"{site} {self.calls[site]}")

    def __len__(self):
        return len(self.data)

    def __iter__(self):
        iterator = iter(self.data)
        self._call("open")
        return _Fetching(self, iterator)

    def __getattr__(self, name):
        return getattr(self.data, name)


class _Fetching:
    """A ``_Flaky`` loader's iterator: each ``next()`` is a fetch, the one that finds the epoch's end too."""

    def __init__(self, loader, iterator):
        self.loader, self.iterator = loader, iterator

    def __iter__(self):
        return self

    def __next__(self):
        self.loader._call("fetch")
        return next(self.iterator)


def _two_epochs(feed) -> list:
    """Two epochs fed, each batch with a number its step draws (as dropout does); each fetch, epoch opening or
    closing that raises retried as the loop retries it."""

    def retried(call):
        while True:
            try:
                return call()
            except RuntimeError:
                pass

    steps = []
    for epoch in range(2):
        retried(lambda: feed.start_epoch(epoch))
        steps += [(retried(feed.next_batch)[0], torch.rand(())) for _ in range(feed.iters_per_epoch)]
        retried(feed.end_epoch)
    return steps


def test_a_stateful_loaders_reopening_that_fails_after_a_failed_fetch_leaves_the_rng_as_if_uninterrupted():
    """A StatefulDataLoader draws a seed from the torch RNG as its iterator opens: an opening that raises after it
    puts the RNG back.

    Here the fetch that finds epoch 0's end raises, and so does the opening
    that rebuilds the epoch's iterator at its cursor to drain it again.
    Before, that opening's seed stayed drawn: every draw of epoch 1 differed.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    def data():
        torch.manual_seed(0)  # its sampler's generator is seeded from it
        return StatefulDataLoader(TensorDataset(torch.arange(40.0)), batch_size=8, shuffle=True)

    expected = _two_epochs(Feed(_Flaky(data(), ())))
    got = _two_epochs(Feed(_Flaky(data(), {("fetch", 6), ("open", 2)})))
    assert all(torch.equal(b, c) and torch.equal(x, y) for (b, x), (c, y) in zip(got, expected, strict=True))


class _NoisyOnce(torch.utils.data.Dataset):
    """Samples noised from the torch RNG as they are read (an augmentation); the ``at``-th read raises after its draw."""

    def __init__(self, at):
        self.at, self.reads = at, 0

    def __len__(self):
        return 40

    def __getitem__(self, i):
        self.reads += 1
        noise = torch.randn(())
        if self.reads == self.at:
            raise RuntimeError(f"read {self.reads}")
        return torch.tensor(float(i)) + noise


def test_a_grouped_epochs_drain_that_fails_after_drawing_is_drained_again_from_the_rng_before_it():
    """Two steps of two batches take 4 of a StatefulDataLoader's 5 batches: the epoch's end drains the fifth, which
    draws its samples' noise. A read of it that raises after drawing is retried from the RNG of before the drain."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def feed(at):
        torch.manual_seed(0)
        return Feed(StatefulDataLoader(_NoisyOnce(at), batch_size=8, shuffle=True), group=2)

    expected = _two_epochs(feed(at=0))
    got = _two_epochs(feed(at=35))  # the third sample of the fifth batch, drained at epoch 0's end
    assert len(got) == len(expected) == 4
    assert all(torch.equal(b[0], c[0]) and torch.equal(x, y) for (b, x), (c, y) in zip(got, expected, strict=True))


def _rng_after(call) -> torch.Tensor:
    """The torch RNG's state after ``call`` raised ``RuntimeError`` (it must)."""
    try:
        call()
    except RuntimeError:
        return torch.get_rng_state()
    raise AssertionError("the call was meant to raise")


def test_a_resume_whose_replayed_epoch_raises_after_drawing_leaves_the_rng_as_it_found_it():
    """Resuming mid-epoch replays the epoch from its starting RNG; a read that raises during the replay, after its
    draw, leaves the process RNG where the caller had put it (the checkpoint's), not at the replay's."""
    torch.manual_seed(0)
    feed = Feed(DataLoader(_NoisyOnce(at=0), batch_size=8, shuffle=True))
    feed.start_epoch(0)
    feed.next_batch(), feed.next_batch()
    cursor = feed.state_dict()

    resumed = Feed(DataLoader(_NoisyOnce(at=12), batch_size=8, shuffle=True))  # raises in the skipped second batch
    torch.manual_seed(1)
    before = torch.get_rng_state()
    after = _rng_after(lambda: resumed.resume(cursor, 0, 2))
    assert torch.equal(after, before)


class _LoadRaises:
    """A stateful loader whose ``load_state_dict`` draws from the torch RNG, then raises."""

    def __init__(self, data):
        self.data = data

    def __getattr__(self, name):
        return getattr(self.data, name)

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)

    def load_state_dict(self, state):
        torch.rand(())
        raise RuntimeError("the loader's state could not be loaded")


def test_a_resume_at_a_finished_epoch_whose_loader_fails_to_load_leaves_the_rng_as_it_found_it():
    """At an epoch's end a StatefulDataLoader's state is loaded without drawing: one that raises after a draw
    leaves the process RNG as it was."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(TensorDataset(torch.arange(16.0)), batch_size=8, shuffle=True)
    feed = Feed(loader)
    feed.start_epoch(0)
    feed.next_batch(), feed.next_batch()
    feed.end_epoch()
    cursor = feed.state_dict()
    assert cursor["epoch_done"]

    resumed = Feed(_LoadRaises(StatefulDataLoader(TensorDataset(torch.arange(16.0)), batch_size=8, shuffle=True)))
    assert resumed.stateful
    torch.manual_seed(1)
    before = torch.get_rng_state()
    after = _rng_after(lambda: resumed.resume(cursor, 0, 2))
    assert torch.equal(after, before)
