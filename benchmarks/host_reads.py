"""The reads of tensor values a run makes, by hook list: the host syncs each would cost on a GPU.

Reading a tensor's value on the host (``item()``, ``float()``, ``tolist()``,
``cpu()``...) makes it wait for the device; on a CPU nothing waits, so the
calls are counted instead. Every row trains the same 200 steps (8 an epoch,
the default step on a tiny model, ``on_nonfinite="raise"``) with one hook
list; the baseline row has none. The counts are exact: no timing involved.

Run: ``python -m benchmarks.host_reads``.
"""

from __future__ import annotations

import contextlib

from benchmarks._common import print_table, write_result

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
STEPS, IPE = 200, 8


@contextlib.contextmanager
def counting_reads():
    """Yield a list that grows by one method name per read of a tensor's value (``READS``) while the block runs."""
    import torch

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


def noop(state, event):
    return state, ()


def reads_the_loss(state, event):
    from pimm_fn.core.events import AfterStep

    if event.__class__ is AfterStep:
        float(event.outputs["loss"])
    return state, ()


class CountsSteps:
    """A hook in the slot-apart form (``update``) that never looks at the outputs."""

    def init(self):
        return 0

    def update(self, slot, state, event):
        return slot + 1, state, ()

    def __call__(self, state, event):
        from pimm_fn.core.fold import called_plainly

        return called_plainly(self, state, event)


def _rows():
    import pimm_fn as pf

    return {
        "no hook": [],
        "one no-op hook": [noop],
        "a slotted hook": [CountsSteps()],
        "chain(no-op, slotted)": [pf.chain(noop, CountsSteps(), name="chained")],
        "evaluate_every(100000, ...)": [pf.evaluate_every(100_000, lambda model: {"acc": 0.0})],
        "log_every(50)": [pf.log_every(50)],
        "log_every(1)": [pf.log_every(1)],
        "a hook reading the loss each step": [reads_the_loss],
    }


def count(hooks) -> int:
    """The tensor reads of a 200-step run with ``hooks``."""
    import torch

    import pimm_fn as pf

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(IPE)]
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        data,
        step_fn=pf.TrainStep(loss_fn=torch.nn.functional.mse_loss),
        hooks=hooks,
        max_epochs=STEPS // IPE,
        watching=pf.Watching(console=False),
    )
    with counting_reads() as calls:
        run()
    return len(calls)


def main() -> None:
    counts = {name: count(hooks) for name, hooks in _rows().items()}
    print_table(
        f"Tensor reads in {STEPS} steps ({IPE} an epoch)",
        ["hook list", "reads"],
        [[name, str(n)] for name, n in counts.items()],
    )
    print(f"\nwrote {write_result('host_reads', {'steps': STEPS, 'iters_per_epoch': IPE, 'reads': counts})}")


if __name__ == "__main__":
    main()
