"""The feed's hold on a loader's iterator: a run dropped mid-epoch lets its worker processes go at once."""

import gc
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf


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
