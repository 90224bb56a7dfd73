"""What a run keeps does not grow with its steps unless asked: the trace holds the newest keep_trace effects."""

import pytest

import pimm_fn as pf
from _tiny_workload import build


def _kinds(trace):
    return [(entry.step, type(entry.effect).__name__, getattr(entry.effect, "kind", None)) for entry in trace]


def test_the_trace_keeps_only_the_newest_effects_it_is_asked_to():
    """keep_trace=3 over a run that logs every step: run.trace holds the last three effects the full run would."""
    hooks = [pf.log_every(1)]
    _, full = build(None, hooks=hooks, max_epochs=2, watching=pf.Watching(keep_trace=None))
    full()
    _, kept = build(None, hooks=hooks, max_epochs=2, watching=pf.Watching(keep_trace=3))
    kept()
    assert len(full.trace) == 12  # 2 epochs of 5 steps, and 2 epoch means
    assert _kinds(kept.trace) == _kinds(full.trace)[-3:]


@pytest.mark.parametrize("keep_trace", [-1, 2.5, "all"])
def test_keep_trace_must_be_none_or_a_count(keep_trace):
    """A bad keep_trace is refused at construction, naming it."""
    with pytest.raises(ValueError, match=r"loop: 'keep_trace' must be None or an int >= 0"):
        build(None, hooks=[], max_epochs=1, watching=pf.Watching(keep_trace=keep_trace))
