"""What a run keeps does not grow with its steps unless asked: the trace holds the newest keep_trace effects."""

import gc
import itertools
import tracemalloc

import pytest
import torch

import pimm_fn as pf
from pimm_fn.core.effects import Log
from pimm_fn.core.events import AfterStep
from _tiny_workload import TinyNet, build, negative_mse, one_long_epoch


def _kinds(trace):
    return [(entry.step, type(entry.effect).__name__, getattr(entry.effect, "kind", None)) for entry in trace]


def test_the_trace_keeps_only_the_newest_effects_it_is_asked_to():
    """keep_trace=3 over a run that logs every step: run.trace holds the last three effects the full run would."""
    hooks = [pf.log_every(1)]
    _, full = build(None, hooks=hooks, max_epochs=2, watching=pf.Watching(keep_trace=50))
    full()
    _, kept = build(None, hooks=hooks, max_epochs=2, watching=pf.Watching(keep_trace=3))
    kept()
    assert len(full.trace) == 12  # 2 epochs of 5 steps, and 2 epoch means
    assert _kinds(kept.trace) == _kinds(full.trace)[-3:]


def _alive(*types) -> list:
    """How many objects of each of ``types`` are alive (after a collection)."""
    gc.collect()
    found = dict.fromkeys(types, 0)
    for value in gc.get_objects():
        kind = type(value)  # not value.__class__: a deprecated torch object warns when asked
        if kind in found:
            found[kind] += 1
    return list(found.values())


def test_a_full_trace_holds_the_only_events_and_records_a_run_keeps_of_its_steps():
    """Logging every step, the live AfterStep events and Log records stay where a full trace of keep_trace puts them."""
    hooks = [pf.log_every(1), pf.evaluate_every(20, negative_mse, name="val")]
    before = _alive(AfterStep, Log)  # what earlier tests in this process still hold, if anything
    _, run = build(None, hooks=hooks, max_epochs=200, watching=pf.Watching(keep_trace=50))
    run.run(steps=200)
    full = _alive(AfterStep, Log)
    run.run(steps=600)
    assert len(run.trace) == 50 and full[0] - before[0] <= 50 and full[1] - before[1] <= 50, (before, full)
    assert _alive(AfterStep, Log) == full


def test_a_long_epoch_whose_outputs_no_hook_reads_holds_them_only_so_many_steps():
    """One 5 000-step epoch, no hook reading the step's outputs: what waits unread stops growing (< 50 B a step)."""
    from pimm_fn.runtime.engine.outputs import WAIT_AT_MOST

    first, last = 1.5 * WAIT_AT_MOST, 4.5 * WAIT_AT_MOST  # the same number of steps waits at both (if bounded)
    calls, held = itertools.count(1), {}

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        """The default step, sampling the traced memory as the steps ``first`` and ``last`` begin."""
        if next(calls) in (first, last):
            gc.collect()
            held[len(held)] = tracemalloc.get_traced_memory()[0]
        return pf.train_step(model, optimizer, batch, scheduler=scheduler, scaler=scaler)

    torch.manual_seed(0)
    model = TinyNet()
    tracemalloc.start()
    try:
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            one_long_epoch(5 * WAIT_AT_MOST),
            hooks=[],
            max_epochs=1,
            step_fn=step,
            watching=pf.Watching(console=False),
        )()
    finally:
        tracemalloc.stop()
    assert (held[1] - held[0]) / (last - first) < 50, held  # each step's waiting: ~0.75 KB


@pytest.mark.parametrize("keep_trace", [-1, 2.5, "all"])
def test_keep_trace_must_be_none_or_a_count(keep_trace):
    """A bad keep_trace is refused at construction, naming it."""
    with pytest.raises(ValueError, match=r"loop: 'keep_trace' must be None or an int >= 0"):
        build(None, hooks=[], max_epochs=1, watching=pf.Watching(keep_trace=keep_trace))
