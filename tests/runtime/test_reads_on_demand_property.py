"""Property: reading outputs on demand gives the traces, slots and checkpoints of reading every step up front.

Each example builds a generated hook stack (cadences of saves, logs, an
accumulating hook, a plain hook that reads the loss at a cadence into its
slot, a no-op) and trains it twice on the same data: as it is, and with a
hook appended that asks for every step's outputs up front (what a plain hook
did before outputs were read on demand). The two must agree on the trace,
on every slot, and on what the last checkpoint restores.
"""

import attrs
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from _tiny_workload import SumsBetween, TinyNet
from benchmarks.host_reads import noop
from pimm_fn.core.events import AfterStep

IPE, EPOCHS = 5, 3


@attrs.frozen
class LossEvery:
    """A plain hook: every ``n``-th step it reads the loss and keeps the running sum in its slot."""

    n: int

    @property
    def every(self):
        return self.n

    def init(self):
        return 0.0

    def __call__(self, state, event):
        if isinstance(event, AfterStep):
            return state.evolve(slot=state.slot + event.outputs["loss"]), ()
        return state, ()


class ReadsUpFront:
    """Asks for every step's outputs up front and does nothing with them."""

    events = (AfterStep,)
    reads_outputs = True

    def __call__(self, state, event):
        return state, ()


@st.composite
def stacks(draw):
    every = st.integers(1, 2 * IPE + 1)
    hooks = [LossEvery(draw(every)), SumsBetween(draw(every)), pf.save_every(draw(every)), noop]
    if draw(st.booleans()):
        hooks.append(pf.log_every(draw(every)))
    return draw(st.permutations(hooks))


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(IPE * 4, 4, generator=g)
    return list(zip(x.split(4), x.sum(1, keepdim=True).split(4)))


def _run(hooks, save_dir, resume=None):
    torch.manual_seed(0)
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=EPOCHS,
        save_dir=save_dir,
        resume=resume,
        watching=pf.Watching(console=False),
    )


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hooks=stacks(), stop=st.integers(1, IPE * EPOCHS))
def test_on_demand_reads_agree_with_reads_up_front(tmp_path_factory, hooks, stop):
    on_demand, up_front = tmp_path_factory.mktemp("demand"), tmp_path_factory.mktemp("front")
    lazy = _run(hooks, on_demand)
    lazy.run(steps=stop)  # each trained as soon as built: the global RNG its dropout draws from starts alike
    eager = _run([*hooks, ReadsUpFront()], up_front)
    eager.run(steps=stop)
    n = len(hooks)
    assert [(e.step, e.effect, e.hook) for e in lazy.trace] == [(e.step, e.effect, e.hook) for e in eager.trace]
    assert lazy.state.slots == eager.state.slots[:n]
    if any(isinstance(e.effect, pf.effects.SaveCheckpoint) for e in lazy.trace):
        resumed_lazy = _run(hooks, on_demand, resume="auto").state
        resumed_eager = _run([*hooks, ReadsUpFront()], up_front, resume="auto").state
        assert resumed_lazy.slots == resumed_eager.slots[:n]
        assert resumed_lazy.progress == resumed_eager.progress
