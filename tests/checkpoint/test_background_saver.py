"""Background saving is one object a run owns: its save in flight, its prewarm, its optimizer hooks; closed at the end."""

import sys
import pathlib
import time

import torch

import pimm_fn as pf
from pimm_fn.checkpoint import BackgroundSaver, latest_checkpoint
from pimm_fn.checkpoint import background as _staging

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402


def _registered(optimizer, handles) -> list:
    """Those of ``handles`` (torch's removable handles) still registered on ``optimizer``'s step."""
    hooks = {**optimizer._optimizer_step_pre_hooks, **optimizer._optimizer_step_post_hooks}
    return [h for h in handles if h.id in hooks]


def test_a_run_closes_its_saver_at_the_end_and_leaves_no_hook_on_the_optimizer(tmp_path):
    """After training, the run's saver is closed, nothing is in flight, and its optimizer carries no hook of the run."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(2, async_save=True)], max_epochs=1)
    optimizer = run.ctx.optimizer
    arming = run.ctx.saver.arming.handles
    run.run(steps=2)
    gate = run.ctx.saver.gate.handles
    assert run.ctx.saver.is_open and _registered(optimizer, gate) == list(gate)  # while saves may still come
    run()
    assert not run.ctx.saver.is_open and run.ctx.saver.pending is None
    assert _registered(optimizer, gate + arming) == []
    assert latest_checkpoint(tmp_path / "model").step == run.state.progress.global_step


def test_two_runs_own_two_savers(tmp_path):
    """Each run's saves are its own: waiting in one never waits for, nor forgets, the other's save in flight."""
    _, a = tw.build(tmp_path / "a", hooks=[pf.save_every(1, async_save=True)], max_epochs=1)
    _, b = tw.build(tmp_path / "b", hooks=[pf.save_every(1, async_save=True)], max_epochs=1)
    assert a.ctx.saver is not b.ctx.saver
    a.step()
    b.step()
    b.ctx.wait_for_save()
    assert a.ctx.saver.pending is not None and a.ctx.saver.pending.step == 1
    a.ctx.wait_for_save()
    assert latest_checkpoint(tmp_path / "a" / "model").step == 1


def test_closing_stops_a_running_prewarm_and_keeps_its_memory(monkeypatch):
    """close() stops the prewarm at its next chunk; the memory it readied is the process's idle area."""
    monkeypatch.setattr(_staging, "_CHUNK", 256)
    _staging.drop_idle()
    saver = BackgroundSaver().open()
    saver.prewarm = saver.warm(weights={"w": torch.ones(4096)}, trainer={}, local={}, pause_s=0.05)
    started = time.perf_counter()
    saver.close()
    assert time.perf_counter() - started < 1.0 and saver.prewarm.done() and saver.prewarm.finished is False
    area = _staging.acquire()
    try:
        assert area is saver.prewarm.area
    finally:
        _staging.release(area)
        _staging.drop_idle()
