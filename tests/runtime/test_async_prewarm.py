"""A loop whose hooks save in the background readies the staging memory after the first
optimizer step: the first save then copies into it, results are unchanged, and a save
that arrives while the memory is still being readied takes it over."""

import pytest
import torch

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.checkpoint import background as _staging
from pimm_fn.runtime.handlers import checkpointing as background_staging

import _tiny_workload as tw


@pytest.fixture(autouse=True)
def no_idle_area():
    """Each test starts as a new process would: no staging memory yet."""
    _staging.drop_idle()
    yield
    _staging.drop_idle()


def _train(run, *, wait_for_prewarm=False) -> dict:
    """Train to the end (maybe letting the prewarm finish after step 1); returns {step: weights right after it}."""
    seen = {}
    while not run.finished:
        run.step()
        seen[run.state.progress.global_step] = tw.weights(run.ctx.model)
        if wait_for_prewarm and run.ctx.saver.prewarm:
            run.ctx.saver.prewarm.wait()
    return seen


def test_the_staging_area_is_ready_before_the_first_save(tmp_path):
    """Right after the first step, before any save, a prewarm readies memory for the weights and optimizer state."""
    model, run = tw.build(tmp_path, hooks=[pf.save_every(4, async_save=True)], max_epochs=1)
    assert run.ctx.saver.prewarm is None  # nothing before the optimizer state exists
    run.step()
    warming = run.ctx.saver.prewarm.wait()
    assert warming.finished is True and run.ctx.saver.pending is None
    entries = warming.area.tensors()
    weights = {(1, k, v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()}
    assert weights <= set(entries)
    moments = [e for e in entries if e[0] == 0 and e[1].startswith("trainer/t/")]
    assert len(moments) >= 2 * len(weights)  # Adam's two moments per parameter (and its step counters)


def test_the_first_async_save_copies_into_the_prewarmed_memory(tmp_path):
    """The first background save takes the prewarmed area and allocates none of the tensors it readied."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(4, async_save=True)], max_epochs=1)
    run.step()
    warming = run.ctx.saver.prewarm.wait()
    ready = {entry: t.data_ptr() for entry, t in warming.area.tensors().items()}
    while run.state.progress.global_step < 4:
        run.step()
    assert run.ctx.saver.pending is not None and run.ctx.saver.pending.step == 4
    run.ctx.wait_for_save()
    area = _staging.acquire()
    try:
        assert area is warming.area
        after = {entry: t.data_ptr() for entry, t in area.tensors().items()}
        kept = [e for e in ready if not e[1].endswith("/skeleton")]  # skeletons hold the plain values of the save
        assert kept and all(after.get(e) == ready[e] for e in kept)
    finally:
        _staging.release(area)


def _checkpoint(path):
    return checkpoint.load_checkpoint(checkpoint.find_checkpoint(path))


def _same_tree(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_tree, a, b))
    return a == b


def test_a_run_with_prewarm_is_bit_identical_to_one_without(tmp_path):
    """Same weights after every step and the same snapshots, whether or not the staging memory was prewarmed."""
    hooks = [pf.save_every(4, async_save=True, snapshots=True)]
    _, warm = tw.build(tmp_path / "warm", hooks=hooks)
    warm_seen = _train(warm, wait_for_prewarm=True)
    assert warm.ctx.saver.prewarm.finished is True
    _staging.drop_idle()
    _, cold = tw.build(tmp_path / "cold", hooks=hooks)
    cold.ctx.saver.arming.remove()  # this run's first save copies into fresh memory
    cold_seen = _train(cold)
    assert cold.ctx.saver.prewarm is None
    assert warm_seen.keys() == cold_seen.keys()
    assert all(tw.same_weights(warm_seen[s], cold_seen[s]) for s in warm_seen)
    for step in (4, 8, 12):
        a = _checkpoint(tmp_path / "warm" / "model" / f"iter_{step}")
        b = _checkpoint(tmp_path / "cold" / "model" / f"iter_{step}")
        assert tw.same_weights(a.weights, b.weights) and tw.same_weights(a.weights, warm_seen[step]), step
        assert _same_tree(a.trainer, b.trainer) and _same_tree(a.local, b.local), step


@pytest.mark.parametrize(
    "hooks, fmt",
    [
        ([pf.save_every(4)], "standard"),
        ([pf.log_every(2)], "standard"),
        ([pf.save_every(4, async_save=True)], "legacy"),  # legacy checkpoints are always written synchronously
    ],
)
def test_no_prewarm_without_a_background_saver(tmp_path, hooks, fmt):
    """Without a hook that saves in the background, no hook is registered and no staging memory is allocated."""
    _, run = tw.build(tmp_path, hooks=hooks, fmt=fmt, max_epochs=1)
    assert run.ctx.saver.arming is None
    run()
    assert run.ctx.saver.prewarm is None
    area = _staging.acquire()
    assert area.nbytes == 0  # a new, empty one: no idle area was left by anything
    _staging.release(area)


def test_a_save_arriving_while_the_prewarm_runs_takes_it_over(tmp_path, monkeypatch):
    """With a save on step 1 and a slow prewarm, the save takes the prewarm's memory and every snapshot is exact."""
    monkeypatch.setattr(_staging, "_CHUNK", 16)  # many chunks, each followed by the pause below
    hooks = [pf.save_every(1, async_save=True, snapshots=True)]
    _, run = tw.build(tmp_path, hooks=hooks, max_epochs=1)
    background_staging.prewarm_staging(run.ctx, run.hooks.hooks, pause_s=0.05)  # replaces the loop's own arming
    seen = _train(run)
    warming = run.ctx.saver.prewarm
    assert warming.wait().finished is False and warming.error is None  # the first save took over
    area = _staging.acquire()
    try:
        assert area is warming.area  # no second area was allocated beside it
    finally:
        _staging.release(area)
    for step in (1, 2, run.state.progress.global_step):
        loaded = _checkpoint(tmp_path / "model" / f"iter_{step}")
        assert tw.same_weights(loaded.weights, seen[step]), step
