"""A step's outputs are read off the device only when a hook asks for a value: the reads table, counted.

Each run trains 200 steps (8 an epoch) and counts the calls that read a
tensor's value (``item``, ``tolist``, ``float``, ``cpu``, ...): what a GPU
would stall on. The baseline is a run with no hook (one batched read at each
epoch's end).
"""

import math

import pytest
import torch

import pimm_fn as pf
from _sync_count import counting_reads
from _tiny_workload import NaNAt, SumsBetween, TinyNet
from benchmarks.host_reads import CountsSteps, noop
from pimm_fn.core.events import AfterStep
from pimm_fn.core.outputs import StepOutputsClosed

STEPS, IPE = 200, 8


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(IPE * 8, 4, generator=g)
    return list(zip(x.split(8), x.sum(1, keepdim=True).split(8)))


def _reads(hooks, **kwargs) -> int:
    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=STEPS // IPE,
        watching=pf.Watching(console=False),
        **kwargs,
    )
    with counting_reads() as calls:
        run()
    assert run.state.progress.global_step == STEPS
    return len(calls)


def other_noop(state, event):
    return state, ()


def reads_the_loss(state, event):
    if isinstance(event, AfterStep):
        assert math.isfinite(event.outputs["loss"])
    return state, ()


@pytest.fixture(scope="module")
def baseline():
    return _reads([])


@pytest.mark.parametrize(
    "hooks",
    [
        [noop],
        [noop, other_noop],
        [CountsSteps()],
        [pf.chain(noop, CountsSteps(), name="quiet_chain")],
        [pf.evaluate_every(100_000, lambda model: {"acc": 0.0})],
    ],
    ids=["plain", "two_plain", "slotted", "chain", "far_evaluation"],
)
def test_hooks_that_never_read_outputs_cost_no_more_reads_than_no_hooks(hooks, baseline):
    assert _reads(hooks) <= baseline


def test_a_hook_that_reads_the_loss_reads_each_step_it_asks_for(baseline):
    assert _reads([reads_the_loss]) == STEPS  # each step read once, on demand: nothing waits at the epoch end


@pytest.mark.parametrize("k", [1, 10, 50])
def test_log_every_k_reads_once_per_k_steps_on_top(k, baseline):
    assert baseline < _reads([pf.log_every(k)]) <= baseline + STEPS // k


def test_an_accumulating_hook_reads_in_batches_at_its_cadence(baseline):
    assert baseline < _reads([SumsBetween(20)]) <= baseline + STEPS // 20


def test_the_outputs_read_on_demand_are_the_step_loss():
    seen = []

    def keep_loss(state, event):
        if isinstance(event, AfterStep):
            seen.append((event.step, event.outputs["loss"]))
        return state, ()

    read_up_front = []

    def logged(state, event):
        if isinstance(event, AfterStep):
            read_up_front.append((event.step, event.outputs["loss"]))
        return state, ()

    logged.reads_outputs = True
    _reads([keep_loss])
    _reads([logged])
    assert len(seen) == STEPS and seen == read_up_front
    assert all(type(loss) is float for _, loss in seen)


def test_outputs_asked_for_after_their_step_raise_a_clear_error():
    kept = []

    def hold_the_event(state, event):
        if isinstance(event, AfterStep):
            assert "loss" in event.outputs and list(event.outputs) == ["loss", "lr"]  # names cost no read
            kept.append(event)
        return state, ()

    _reads([hold_the_event])
    with pytest.raises(StepOutputsClosed, match=r"step 1 \(loss, lr\).*float\(event.outputs\['loss'\]\)"):
        kept[0].outputs["loss"]


def test_outputs_read_during_their_step_stay_readable_after_it():
    kept = []

    def read_then_hold(state, event):
        if isinstance(event, AfterStep):
            event.outputs["loss"]
            kept.append(event)
        return state, ()

    _reads([read_then_hold])
    last = kept[-1].outputs
    assert type(last["loss"]) is float and dict(last) == {"loss": last["loss"], "lr": 0.01}


def _sums_run(tmp_path, resume=None):
    torch.manual_seed(0)
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _data(),
        hooks=[SumsBetween(20), pf.save_every(13)],
        max_epochs=3,
        save_dir=tmp_path,
        resume=resume,
        watching=pf.Watching(console=False),
    )


def test_a_checkpoint_holds_the_sums_of_outputs_no_hook_read_up_front(tmp_path):
    """save_every reads nothing itself: the outputs that wait are summed into the slots before the save."""
    run = _sums_run(tmp_path)
    run.run(steps=13)  # steps 9..13 wait on the device when step 13 saves
    live = run.state.slots[0]
    assert live > 0 and _sums_run(tmp_path, resume="auto").state.slots[0] == live


def test_a_nan_loss_is_said_before_a_later_step_is_saved(tmp_path):
    torch.manual_seed(0)
    model = NaNAt(3)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        _data(),
        hooks=[noop, pf.save_every(5)],
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(pf.NonFiniteLossError, match="step 3"):
        run()
    assert not (tmp_path / "model" / "last").exists()
