"""One torch RNG capture a quiet step when the data hands out a list's iterator, whatever its container's class."""

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.step import rng
from pimm_fn.runtime.data.feed import Feed

from tests.runtime._tiny_workload import TinyNet


def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [(x, x.sum(1, keepdim=True)) for x in torch.randn(n, 8, 4, generator=g)]


class Batches:
    """An in-memory batch list behind a class of its own (as peers' benchmarks pass it): iter() gives the list's."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


def test_a_container_handing_out_a_list_iterator_takes_one_rng_capture_per_quiet_step(monkeypatch, tmp_path):
    """next() on a list's iterator runs no user code, so only the forward's RNG is taken, as for a plain list."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        Batches(_batches(12)),
        hooks=[pf.save_every(10**6)],
        max_epochs=1,
        save_dir=tmp_path,
    )
    run.run(steps=2)  # past the epoch's opening
    real, count = rng._get_cpu, []
    monkeypatch.setattr(rng, "_get_cpu", lambda: count.append(1) or real())
    run.run(steps=8)
    assert len(count) == 8


class ShufflingOnIter:
    """A list's iterator over a permutation drawn from torch's RNG at each iter(); the ``fail_at``-th iter() raises
    after its draw."""

    def __init__(self, items, fail_at=None):
        self.items, self.fail_at, self.opened = items, fail_at, 0

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        order = torch.randperm(len(self.items)).tolist()
        self.opened += 1
        if self.opened == self.fail_at:
            raise OSError("flaky reopen")
        return iter([self.items[i] for i in order])


def test_a_restart_that_draws_then_fails_is_retried_from_the_rng_before_the_fetch():
    """An epoch longer than the data reopens it inside a fetch; when that reopening draws and raises, the retry
    gives the batch and leaves the RNG exactly as an uninterrupted fetch does."""
    items = list(range(4))
    torch.manual_seed(0)
    plain = Feed(ShufflingOnIter(items), iters_per_epoch=7)
    plain.start_epoch(0)
    expected = [plain.next_batch() for _ in range(6)]
    expected_rng = torch.rand(3)

    torch.manual_seed(0)
    flaky = Feed(ShufflingOnIter(items, fail_at=2), iters_per_epoch=7)
    flaky.start_epoch(0)
    got = [flaky.next_batch() for _ in range(4)]
    with pytest.raises(OSError, match="flaky reopen"):
        flaky.next_batch()  # the data's end: iter() draws a new order, then raises
    got += [flaky.next_batch(), flaky.next_batch()]
    assert got == expected
    assert torch.equal(torch.rand(3), expected_rng)
