"""Background (async) saves: same bytes as a synchronous save, published only
after the write, one at a time, and never racing the optimizer."""

import pathlib
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.checkpoint import background as _async

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, generator=g)}, {"optimizer": {"m": torch.randn(64, generator=g), "lr": 0.1}}


def test_async_save_round_trips_like_a_synchronous_one(tmp_path):
    """What an async save publishes loads back equal to what was passed in."""
    weights, trainer = _state(0)
    info = checkpoint.save_checkpoint_async(tmp_path, step=4, weights=weights, trainer=trainer, local={"r": 1}).wait()
    loaded = checkpoint.load_checkpoint(info)
    assert info == checkpoint.latest_checkpoint(tmp_path) and info.step == 4
    assert torch.equal(loaded.weights["w"], weights["w"]) and torch.equal(
        loaded.trainer["optimizer"]["m"], trainer["optimizer"]["m"]
    )
    assert loaded.local == {"r": 1}


def test_marker_and_publish_come_only_after_the_write(tmp_path, monkeypatch):
    """While the DCP write is blocked the previous checkpoint stays the latest and nothing new is marked complete."""
    weights, trainer = _state(0)
    checkpoint.save_checkpoint(tmp_path, step=1, weights=weights, trainer=trainer, local={})
    release, writing = threading.Event(), threading.Event()
    real_save = dcp.save

    def blocked_save(*args, **kwargs):
        writing.set()
        assert release.wait(10)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(dcp, "save", blocked_save)
    pending = checkpoint.save_checkpoint_async(tmp_path, step=2, weights=weights, trainer=trainer, local={})
    assert writing.wait(10)
    assert pending.staged and not pending.done()
    assert checkpoint.latest_checkpoint(tmp_path).step == 1  # a crash now loses nothing
    assert not list(tmp_path.glob(".staging-*/COMPLETE"))
    release.set()
    assert pending.wait().step == 2 and checkpoint.latest_checkpoint(tmp_path).step == 2


def test_the_loop_never_has_two_saves_in_flight(tmp_path, monkeypatch):
    """With a save on every step, each background write finishes before the next starts."""
    active, peak, lock = [0], [0], threading.Lock()
    real_save = dcp.save

    def counting_save(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.01)  # long enough that the next step's request would overlap
        try:
            return real_save(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(dcp, "save", counting_save)
    _, run = tw.build(tmp_path, hooks=[pf.save_every(1, async_save=True)], max_epochs=1)
    run()
    assert peak[0] == 1
    assert checkpoint.latest_checkpoint(tmp_path / "model").step == run.state.progress.global_step
    assert run.ctx.saver.pending is None


def _train_recording(save_dir, hooks, monkeypatch=None, **kwargs):
    """Train, recording the weights after every step; returns (model, run, {step: weights})."""
    model, run = tw.build(save_dir, hooks=hooks, **kwargs)
    seen = {}
    while not run.finished:
        run.step()
        seen[run.state.progress.global_step] = tw.weights(model)
    return model, run, seen


def test_async_snapshots_hold_exactly_the_weights_of_their_step_even_when_staging_is_slow(tmp_path, monkeypatch):
    """The optimizer waits for the copy: a snapshot of step k equals the weights right after step k."""
    real_stage = _async._stage

    def slow_stage(*args):
        time.sleep(0.05)  # far longer than a forward/backward of the tiny model
        return real_stage(*args)

    monkeypatch.setattr(_async, "_stage", slow_stage)
    model, run, seen = _train_recording(tmp_path, [pf.save_every(4, async_save=True, snapshots=True)])
    steps = [4, 8, 12]
    for step in steps:
        loaded = checkpoint.load_checkpoint(checkpoint.find_checkpoint(tmp_path / "model" / f"iter_{step}"))
        assert tw.same_weights(loaded.weights, seen[step]), step


def test_resume_from_an_async_checkpoint_is_bit_identical(tmp_path):
    """Async saving changes nothing: same final weights as a synchronous run, and a resume from an
    async snapshot ends bit-identical too."""
    sync_model, sync_run = tw.build(tmp_path / "sync", hooks=[pf.save_every(4, snapshots=True)])
    sync_run()
    async_model, run = tw.build(tmp_path / "async", hooks=[pf.save_every(4, async_save=True, snapshots=True)])
    run()
    assert tw.same_weights(tw.weights(sync_model), tw.weights(async_model))
    resumed_model, resumed = tw.build(
        tmp_path / "resumed",
        hooks=[pf.save_every(4, async_save=True, snapshots=True)],
        resume=str(tmp_path / "async" / "model" / "iter_8"),
    )
    assert resumed.state.progress.global_step == 8
    resumed()
    assert tw.same_weights(tw.weights(resumed_model), tw.weights(async_model))


def test_save_every_async_repr_and_effect():
    """save_every(async_save=True) reads back as code and marks its cadence saves, not the final one, async."""
    hook = pf.save_every(5, async_save=True)
    assert repr(hook) == "save_every(5, async_save=True)"
    with pytest.raises((TypeError, ValueError)):
        pf.save_every(5, async_save="yes")
    saves = [t.effect for t in pf.plan([hook], iters_per_epoch=4, max_epochs=3)]
    assert [(e.step, e.async_save, e.final) for e in saves] == [(5, True, False), (10, True, False), (12, False, True)]
