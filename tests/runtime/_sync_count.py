"""Counting the reads of tensor values (device-to-host transfers on a GPU) a piece of code makes."""

import contextlib

import torch

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


@contextlib.contextmanager
def counting_reads():
    """Yield a list that grows by one name per call of a tensor-reading method while the block runs."""
    calls = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name, original):
        def read(self, *args, **kwargs):
            calls.append(name)
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def quiet_steps(max_step: int, cadences, iters_per_epoch: int) -> list:
    """The steps on which no cadence fires and no epoch opens or closes."""
    return [k for k in range(1, max_step + 1) if all(k % c for c in cadences) and k % iters_per_epoch not in (0, 1)]


def reads_per_step(run) -> dict:
    """``{global step: [reads]}``: ``run`` stepped to its end, each ``step()`` call's tensor reads recorded."""
    found = {}
    while not run.finished:
        with counting_reads() as calls:
            run.step()
        found[run.state.progress.global_step] = list(calls)
    return found
