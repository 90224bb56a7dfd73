"""pf.profile: torch.profiler over a schedule of global steps, one real TensorBoard trace per recorded cycle."""

import json
import pickle

import pytest
import torch

import pimm_fn as pf
from pimm_fn.hooks.profiler import StartProfiler, StepProfiler, StopProfiler
from _tiny_workload import TinyNet, loader


def _effects(hook, **kwargs):
    return [(e.step, e.effect) for e in pf.plan([hook], iters_per_epoch=5, **kwargs)]


def test_the_window_is_planned_from_the_global_step():
    """Start after skip_first, a step effect for each step of repeat cycles, the last one ends it."""
    hook = pf.profile(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
    assert hook.last_step == 9 and repr(hook) == "profile(active=2, repeat=2, skip_first=1)"
    assert _effects(hook, max_epochs=3) == [
        (1, StartProfiler(1, 1, 1, 2, 2)),
        *[(s, StepProfiler(s, last=s == 9)) for s in range(2, 10)],
    ]
    assert _effects(pf.profile(active=3), max_steps=3) == [  # skip_first=0: it starts before the first step
        (0, StartProfiler(0, 1, 1, 3, 1)),
        (1, StepProfiler(1)),
        (2, StepProfiler(2)),
        (3, StepProfiler(3)),
        (3, StopProfiler(3)),  # training ended inside the window
    ]
    for value in (hook, StartProfiler(1, 1, 1, 2, 2, "d"), StepProfiler(3, last=True), StopProfiler(4)):
        assert pickle.loads(pickle.dumps(value)) == value


def test_bad_arguments_are_refused_at_construction():
    """active and repeat count from 1, the others from 0; dir is a path."""
    with pytest.raises(ValueError, match="'active' must be an int >= 1"):
        pf.profile(active=0)
    with pytest.raises(ValueError, match="'wait' must be an int >= 0"):
        pf.profile(wait=-1)
    with pytest.raises(TypeError, match="'memory'"):
        pf.profile(memory="yes")


def _run(hooks, **kwargs):
    torch.manual_seed(0)
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        hooks=hooks,
        watching=pf.Watching(progress=False),
        **kwargs,
    )


def _traces(folder) -> list:
    return sorted(folder.glob("rank0*.pt.trace.json"))


def _steps(trace) -> list:
    """The ProfilerStep#n events a trace recorded."""
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")})


def test_a_run_writes_one_tensorboard_trace_per_recorded_cycle(tmp_path, capsys):
    """Two cycles of 2 active steps after skipping 1 step: two trace files under save_dir/profiler, 2 steps each."""
    run = _run([pf.profile(wait=1, warmup=1, active=2, repeat=2, skip_first=1)], max_steps=12, save_dir=tmp_path)
    run()
    traces = _traces(tmp_path / "profiler")
    assert len(traces) == 2, list((tmp_path / "profiler").iterdir())
    assert [len(_steps(t)) for t in traces] == [2, 2]
    assert "profiling steps 2-9 (recording the last 2 of every 4)" in capsys.readouterr().out


def test_training_ending_inside_the_window_writes_what_was_recorded(tmp_path):
    """max_steps ends the run in an active phase: the profiler stops there and its trace is written to dir."""
    run = _run([pf.profile(wait=0, warmup=1, active=5)], max_steps=3, save_dir=tmp_path / "run")
    run()
    (trace,) = _traces(tmp_path / "run" / "profiler")
    assert len(_steps(trace)) >= 1
    run = _run([pf.profile(wait=0, warmup=1, active=2, dir=tmp_path / "elsewhere")], max_steps=4)
    run()
    assert len(_traces(tmp_path / "elsewhere")) == 1  # dir= needs no save_dir


def test_without_a_save_dir_or_dir_the_error_says_what_to_pass():
    """No save_dir and no dir: a ValueError naming profile(dir=...) and loop(save_dir=...)."""
    run = _run([pf.profile()], max_steps=3)
    with pytest.raises(ValueError, match=r"pass profile\(dir=\.\.\.\) or loop\(save_dir=\.\.\.\)"):
        run()
