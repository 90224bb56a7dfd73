"""A quiet step does only the work it needs: one torch RNG capture when its data draws nothing while fetched."""

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.step import rng

from tests.runtime._tiny_workload import TinyNet


def _batches(n):
    g = torch.Generator().manual_seed(0)
    return [(x, x.sum(1, keepdim=True)) for x in torch.randn(n, 8, 4, generator=g)]


def _captures_per_step(monkeypatch, tmp_path, data, steps, exact_retry=True):
    """Torch RNG captures (``rng.torch_rng``'s CPU state reads) per quiet step of the standard stack."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        data,
        hooks=[pf.save_every(10**6)],
        max_epochs=1,
        save_dir=tmp_path,
        training=pf.Training(exact_retry=exact_retry),
    )
    run.run(steps=2)  # past the epoch's opening
    real, count = rng._get_cpu, []
    monkeypatch.setattr(rng, "_get_cpu", lambda: count.append(1) or real())
    run.run(steps=steps)
    return len(count) / steps


@pytest.mark.parametrize("kind", [list, tuple])
def test_a_quiet_step_over_a_sequence_takes_one_rng_capture(monkeypatch, tmp_path, kind):
    """Fetching from a list draws nothing: only the forward's RNG is taken (the feed takes its own on a failure)."""
    assert _captures_per_step(monkeypatch, tmp_path, kind(_batches(12)), steps=8) == 1


def test_a_loader_fetching_in_process_still_has_its_rng_taken_before_each_fetch(monkeypatch, tmp_path):
    """A dataset may augment with torch's RNG while fetched: a failed fetch must put back the RNG from before it."""
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1)), batch_size=2
    )
    assert _captures_per_step(monkeypatch, tmp_path, data, steps=8) == 2


def test_without_exact_retry_a_loader_fetching_in_process_has_no_rng_taken_a_step(monkeypatch, tmp_path):
    """Training(exact_retry=False): neither the forward's RNG nor the fetch's is taken on a quiet step."""
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1)), batch_size=2
    )
    assert _captures_per_step(monkeypatch, tmp_path, data, steps=8, exact_retry=False) == 0


class _Augmenting(list):
    """A list whose iteration draws from torch's RNG: not a plain list."""

    def __iter__(self):
        return ((x + torch.rand(()), y) for x, y in super().__iter__())


def test_a_sequence_subclass_may_draw_so_its_rng_is_taken_before_each_fetch(monkeypatch, tmp_path):
    """Only the exact types list, tuple, range and Tensor are taken as drawing nothing."""
    assert _captures_per_step(monkeypatch, tmp_path, _Augmenting(_batches(12)), steps=8) == 2
