"""A loader changed since the checkpoint (workers, batch size, dataset length): one line says it, one rule follows.

One process, a ``DistributedSampler`` of 1 rank over 48 indexed samples,
batch 4 (12 steps an epoch), saves every 3 steps.
"""

import collections
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import pimm_fn as pf
from pimm_fn.runtime.data.positioning import Remainder, epoch_order, share

SAMPLES = 48


def _loader(kind="stateful", *, batch_size=4, num_workers=0, samples=SAMPLES):
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(samples, 4, generator=g), torch.arange(samples))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)
    make = StatefulDataLoader if kind == "stateful" else DataLoader
    return make(data, batch_size=batch_size, sampler=sampler, num_workers=num_workers)


def _run(save_dir, seen, *, resume=None, **loader_args):
    """A tiny run whose step notes the sample indices of every batch it trains on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        x, index = batch
        seen.append(index.tolist())
        return _sgd(model, optimizer, x)

    return pf.loop(
        model,
        optimizer,
        _loader(**loader_args),
        hooks=[pf.save_every(3)],
        max_epochs=2,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
        step_fn=step,
    )


def _sgd(model, optimizer, x):
    optimizer.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item()}


def _resumed(save_dir, **loader_args):
    """The run resumed from ``save_dir``'s latest checkpoint: the run, its ResumeNotExactWarning lines, its batches."""
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _run(save_dir, seen, resume="auto", **loader_args)
    said = [str(w.message) for w in caught if issubclass(w.category, pf.ResumeNotExactWarning)]
    return run, said, seen


def _flat(batches):
    return [i for batch in batches for i in batch]


@pytest.mark.parametrize("kind", ["stateful", "plain"])
def test_more_workers_at_resume_warn_once_and_replay_the_same_samples(tmp_path, kind):
    """num_workers 0 -> 2 mid-epoch: one line names it, and the epoch goes on with the samples the original had next."""
    original = []
    _run(tmp_path, original, kind=kind).run(steps=4)  # the latest checkpoint is step 3's
    run, said, seen = _resumed(tmp_path, kind=kind, num_workers=2)
    (message,) = said
    assert "num_workers 0 -> 2" in message and "replayed from its start to step 3" in message
    run.run(steps=7)
    assert seen == _flat_reference(tmp_path, kind)[3:10]


def _flat_reference(tmp_path, kind):
    """The batches of an uninterrupted run of the same data."""
    seen = []
    _run(tmp_path / "reference", seen, kind=kind).run()
    return seen


def test_more_workers_at_an_epoch_boundary_open_the_next_epoch_afresh(tmp_path):
    """num_workers 0 -> 2 at an epoch's end: one line names it, and the next epoch is the sampler's next one."""
    _run(tmp_path, []).run(steps=12)  # epoch 0 whole: the deferred save of step 12 is at its end
    run, said, seen = _resumed(tmp_path, num_workers=2)
    (message,) = said
    assert "num_workers 0 -> 2" in message and "epoch 1 opens afresh" in message
    run.run()
    assert seen == _flat_reference(tmp_path, "stateful")[12:]


def test_another_dataset_length_with_the_same_steps_warns_naming_it(tmp_path):
    """46 samples instead of 48 keeps 12 steps an epoch: the loader's state is not loaded, the warning says so."""
    _run(tmp_path, []).run(steps=4)
    run, said, seen = _resumed(tmp_path, samples=46)
    (message,) = said
    assert "dataset length 48 -> 46" in message and "not loaded" in message
    run.run()
    assert run.state.progress.global_step == 24


def test_another_batch_size_continues_a_distributed_sampler_epoch_by_samples(tmp_path):
    """Batch 4 -> 6 after 3 steps (12 samples): the epoch continues at sample 12 of its order, each sample once."""
    original = []
    _run(tmp_path, original).run(steps=4)
    run, said, seen = _resumed(tmp_path, batch_size=6)
    (message,) = said
    assert "12 samples consumed" in message and "continues after them at step 2 of 8" in message
    p = run.state.progress
    assert (p.epoch, p.iter_in_epoch, p.iters_per_epoch, p.global_step) == (0, 2, 8, 3)
    run.run()
    assert collections.Counter(_flat(original[:3]) + _flat(seen[:6])) == collections.Counter(range(SAMPLES))
    assert run.state.progress.global_step == 3 + 6 + 8


def test_a_share_deals_the_rest_of_an_epoch_round_robin_padded_like_distributed_sampler():
    """The ranks' shares of a rest cover it once, padded by its own first samples to a multiple of the ranks."""
    order = list(range(11))
    shares = [share(order, 4, num_replicas=3, rank=r, drop_last=False) for r in range(3)]
    assert shares == [[4, 7, 10], [5, 8, 4], [6, 9, 5]]
    cut = [share(order, 4, num_replicas=3, rank=r, drop_last=True) for r in range(3)]
    assert sorted(_flat(cut)) == list(range(4, 10))


def test_the_epoch_order_is_the_distributed_samplers_own_on_any_rank_count():
    """Dealing the whole order from position 0 gives exactly what DistributedSampler gives each rank."""
    data = TensorDataset(torch.arange(10))
    for world in (1, 2, 3):
        for rank in range(world):
            sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=9)
            sampler.set_epoch(4)
            dealt = share(epoch_order(sampler, 4), 0, num_replicas=world, rank=rank, drop_last=False)
            assert dealt == list(sampler)
    assert len(Remainder([1, 2], sampler)) == 2
