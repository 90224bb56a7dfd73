"""A DistributedSampler is told every epoch, resumed epochs included, so shuffles differ per epoch and resume exactly."""

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import pimm_fn as pf
from _tiny_workload import TinyNet, dataset, same_weights, weights


class RecordingSampler(DistributedSampler):
    """A real DistributedSampler that also remembers the epochs it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)
        super().set_epoch(epoch)


def _build(save_dir, resume=None):
    torch.manual_seed(0)
    sampler = RecordingSampler(dataset(), num_replicas=2, rank=0, shuffle=True, seed=3)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        DataLoader(dataset(), batch_size=4, sampler=sampler),
        hooks=[pf.save_every(2)],
        max_epochs=3,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
    )
    return sampler, model, run


def test_set_epoch_is_called_every_epoch(tmp_path):
    """Each epoch starts with sampler.set_epoch(epoch)."""
    sampler, _, run = _build(tmp_path)
    run()
    assert sampler.epochs == [0, 1, 2]


def test_resumed_epoch_sets_its_epoch_and_ends_bit_identical(tmp_path):
    """A run resumed mid-epoch tells the sampler that epoch again and trains on the same shuffled shard."""
    _, full_model, full = _build(tmp_path / "full")
    full()
    _, _, first = _build(tmp_path / "cut")
    first.run(steps=7)  # 5 steps per epoch: the checkpoint of step 6 is in epoch 1
    sampler, model, resumed = _build(tmp_path / "cut", resume="auto")
    assert resumed.state.progress.global_step == 6
    resumed()
    assert sampler.epochs[0] == 1 and sampler.epochs[-1] == 2
    assert same_weights(weights(model), weights(full_model))


@pytest.mark.parametrize("stop", [7, 10])
def test_a_sampler_with_its_own_generator_resumes_its_order_mid_epoch_and_at_the_boundary(tmp_path, stop):
    """RandomSampler(generator=g) keeps g across epochs: the checkpoint carries g, so the resumed epochs shuffle alike."""
    from torch.utils.data import RandomSampler

    def build(save_dir, resume=None):
        torch.manual_seed(0)
        model = TinyNet()
        data = dataset()
        loader = DataLoader(data, batch_size=8, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(3)))
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            loader,
            hooks=[pf.save_every(1)],
            max_epochs=3,
            save_dir=save_dir,
            resume=resume,
            watching=pf.Watching(console=False),
        )
        return model, run

    reference, run = build(tmp_path / "reference")
    run()
    _, run = build(tmp_path / "run")
    run.run(steps=stop)
    model, run = build(tmp_path / "run", resume="auto")
    run()
    assert same_weights(weights(model), weights(reference))
