"""The reusable staging area of background saves, and the weights file written beside DCP:
copies are exact, memory is reused, no byte of one save reaches another, and the marker
still comes after every file is durable."""

import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

from pimm_fn import checkpoint
from pimm_fn.checkpoint import files as _layout
from pimm_fn.checkpoint import files as _safe_writes
from pimm_fn.checkpoint import background as _staging

SENTINEL = 1234.56789  # a value whose bytes appear nowhere else


def test_staged_tensors_are_exact_contiguous_copies_with_storages_of_their_own():
    """Each staged tensor equals its source, is contiguous, and its storage holds exactly its bytes."""
    src = {
        "a": torch.randn(5, 7).t(),
        "b": torch.arange(10, dtype=torch.int64),
        "c": torch.tensor([True, False]),
        "d": torch.empty(0, 3),
        "e": torch.tensor(2.5),
        "plain": 3,
    }
    staged = _staging.StagingArea().stage(src)
    assert list(staged) == list(src) and staged["plain"] == 3
    for key in "abcde":
        assert staged[key].dtype == src[key].dtype and torch.equal(staged[key], src[key]), key
        assert staged[key].is_contiguous()
        assert staged[key].untyped_storage().nbytes() == staged[key].numel() * staged[key].element_size(), key
        assert staged[key].numel() == 0 or staged[key].data_ptr() != src[key].data_ptr()


def test_a_second_save_of_the_same_shapes_reuses_the_memory_and_holds_the_new_values():
    """Same keys, shapes and dtypes: the same tensors are filled again, in full."""
    area = _staging.StagingArea()
    first = area.stage({"w": torch.full((1000,), SENTINEL), "m": torch.zeros(3)})
    ptrs = {k: v.data_ptr() for k, v in first.items()}
    second = area.stage({"w": torch.ones(1000), "m": torch.arange(3.0)})
    assert {k: v.data_ptr() for k, v in second.items()} == ptrs
    assert torch.equal(second["w"], torch.ones(1000)) and torch.equal(second["m"], torch.arange(3.0))


def test_a_changed_layout_allocates_only_what_changed():
    """A tensor whose shape changed gets new memory of its new size; unchanged ones are kept."""
    area = _staging.StagingArea()
    first = area.stage({"keep": torch.ones(4), "grow": torch.ones(2)})
    second = area.stage({"keep": torch.zeros(4), "grow": torch.full((6,), 2.0), "new": torch.ones(1)})
    assert second["keep"].data_ptr() == first["keep"].data_ptr()
    assert second["grow"].shape == (6,) and torch.equal(second["grow"], torch.full((6,), 2.0))
    assert area.nbytes == 4 * (4 + 6 + 1)


def _files_contain(root, needle: bytes) -> list:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_reused_staging_memory_never_leaks_one_saves_bytes_into_the_next(tmp_path, same):
    """After a save of a large state, a save of a smaller one reuses the idle area yet writes only its own bytes."""
    needle = torch.tensor([SENTINEL] * 4, dtype=torch.float64).numpy().tobytes()
    big = {
        "w": torch.full((4096,), SENTINEL, dtype=torch.float64),
        "b": torch.full((64,), SENTINEL, dtype=torch.float64),
    }
    checkpoint.save_checkpoint_async(
        tmp_path / "a", step=1, weights=dict(big), trainer={"opt": dict(big)}, local={}
    ).wait()
    assert _files_contain(tmp_path / "a" / "last", needle)  # the needle is findable when present
    small_w, small_t = (
        {"w": torch.arange(100, dtype=torch.float64)},
        {"opt": {"m": torch.ones(10, dtype=torch.float64)}},
    )
    info = checkpoint.save_checkpoint_async(
        tmp_path / "b", step=2, weights=small_w, trainer=small_t, local={"r": 1}
    ).wait()
    assert not _files_contain(tmp_path / "b", needle)
    loaded = checkpoint.load_checkpoint(info)
    same(loaded.weights, small_w)
    same(loaded.trainer, small_t)


def test_a_copy_shared_by_two_threads_copies_every_chunk_once(monkeypatch):
    """Chunks are handed out once each, so two threads running the copy produce the exact values."""
    monkeypatch.setattr(_staging, "_CHUNK", 64)
    src = {f"t{i}": torch.randn(1000 + i) for i in range(8)}
    (staged,), copy = _staging.StagingArea().prepare(src)
    helper = threading.Thread(target=copy.run)
    helper.start()
    copy.run()
    helper.join()
    copy.wait()
    assert copy.done and all(torch.equal(staged[k], v) for k, v in src.items())


def test_concurrent_saves_never_share_an_area():
    """While one save holds the idle area, another gets a fresh one; the larger is kept afterwards."""
    a = _staging.acquire()
    b = _staging.acquire()
    assert a is not b
    a.stage({"x": torch.ones(100)})
    b.stage({"x": torch.ones(10)})
    _staging.release(b)
    _staging.release(a)
    assert _staging.acquire() is a


def test_a_failed_weights_write_publishes_nothing(tmp_path, monkeypatch):
    """When the weights file cannot be written, the storage error says so (the OS error its cause) and the previous
    checkpoint stays the latest."""
    checkpoint.save_checkpoint(tmp_path, step=1, weights={"w": torch.ones(2)}, trainer={}, local={})
    real = _safe_writes.durable_write

    def failing(path, write):
        if path.name == _layout.WEIGHTS:
            raise OSError("disk full")
        return real(path, write)

    monkeypatch.setattr(_safe_writes, "durable_write", failing)
    with pytest.raises(checkpoint.CheckpointStorageError, match="OSError: disk full") as raised:
        checkpoint.save_checkpoint(tmp_path, step=2, weights={"w": torch.ones(2)}, trainer={}, local={})
    assert isinstance(raised.value.__cause__, OSError)
    with pytest.raises(checkpoint.CheckpointStorageError, match="OSError: disk full"):
        checkpoint.save_checkpoint_async(tmp_path, step=3, weights={"w": torch.ones(2)}, trainer={}, local={}).wait()
    assert checkpoint.latest_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize("background", [False, True])
def test_the_marker_comes_after_every_file_and_directory_is_durable(tmp_path, monkeypatch, background):
    """The weights file runs beside DCP, but COMPLETE is written only after both and the trainer directory are durable."""
    events, lock = [], threading.Lock()
    real_write, real_dir, real_save = _safe_writes.durable_write, _safe_writes.fsync_dir, dcp.save

    def write(path, fn):
        out = real_write(path, fn)
        with lock:
            events.append(path.name)
        return out

    def fsync_dir(path):
        real_dir(path)
        with lock:
            events.append(f"dir:{path.name.split('-')[0] or path.name}")

    def save(*args, **kwargs):
        out = real_save(*args, **kwargs)
        with lock:
            events.append("dcp")
        return out

    monkeypatch.setattr(_safe_writes, "durable_write", write)
    monkeypatch.setattr(_safe_writes, "fsync_dir", fsync_dir)
    monkeypatch.setattr(dcp, "save", save)
    args = dict(step=1, weights={"w": torch.ones(2)}, trainer={"m": torch.zeros(2)}, local={})
    if background:
        checkpoint.save_checkpoint_async(tmp_path, **args).wait()
    else:
        checkpoint.save_checkpoint(tmp_path, **args)
    marker = events.index(_layout.MARKER)
    assert {"model.pth", "dcp", "dir:trainer"} <= set(events[:marker])
    assert events[marker + 1 :] == ["dir:.staging", f"dir:{tmp_path.name}"]


@pytest.fixture
def no_idle_area():
    """Each prewarm test starts as a new process would: no staging memory yet."""
    _staging.drop_idle()
    yield
    _staging.drop_idle()


def _prewarm_state():
    g = torch.Generator().manual_seed(3)
    weights = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
    trainer = {"optimizer": {"m": torch.randn(64, 32, generator=g), "step": torch.tensor(4.0), "lr": 0.1}}
    return weights, trainer


def test_a_prewarm_readies_the_area_the_first_save_then_fills_without_allocating(tmp_path, no_idle_area, same):
    """After a finished prewarm the idle area holds every tensor of the save; the save copies into exactly those."""
    weights, trainer = _prewarm_state()
    warming = checkpoint.prewarm_async_save(weights=weights, trainer=trainer, local={}).wait()
    assert warming.finished is True and warming.error is None
    ready = {entry: t.data_ptr() for entry, t in warming.area.tensors().items()}
    assert {(part, key) for part, key, _, _ in ready} >= {(0, "trainer/t/0"), (0, "trainer/t/1"), (1, "w"), (1, "b")}
    assert warming.area.nbytes > sum(t.numel() * 4 for t in (*weights.values(), trainer["optimizer"]["m"]))
    info = checkpoint.save_checkpoint_async(tmp_path, step=4, weights=weights, trainer=trainer, local={"r": 1}).wait()
    area = _staging.acquire()
    try:
        assert area is warming.area
        after = {entry: t.data_ptr() for entry, t in area.tensors().items()}
        kept = [e for e in ready if not e[1].endswith("/skeleton")]  # skeletons hold the plain values of the save
        assert kept and all(after.get(e) == ready[e] for e in kept)
    finally:
        _staging.release(area)
    loaded = checkpoint.load_checkpoint(info)
    same(loaded.weights, weights)
    same(loaded.trainer, trainer)


def test_a_save_arriving_during_a_slow_prewarm_takes_its_memory_over_and_writes_exact_values(
    tmp_path, no_idle_area, monkeypatch, same
):
    """The prewarm stops at its next chunk and hands its area to the save: one area, exact bytes, no wait for the rest."""
    monkeypatch.setattr(_staging, "_CHUNK", 256)  # 32+ chunks, each followed by a pause
    weights, trainer = _prewarm_state()
    warming = checkpoint.prewarm_async_save(weights=weights, trainer=trainer, local={}, pause_s=0.05)
    assert not warming.done()  # still writing: the slowest path a first save can meet
    started = time.perf_counter()
    info = checkpoint.save_checkpoint_async(tmp_path, step=4, weights=weights, trainer=trainer, local={}).wait()
    assert time.perf_counter() - started < 1.0  # the save waited for one chunk at most, not for ~1.6 s of prewarm
    assert warming.wait().finished is False and warming.error is None
    area = _staging.acquire()
    try:
        assert area is warming.area  # taken over, not a second allocation
    finally:
        _staging.release(area)
    loaded = checkpoint.load_checkpoint(info)
    same(loaded.weights, weights)
    same(loaded.trainer, trainer)


def test_only_one_prewarm_runs_at_a_time(no_idle_area, monkeypatch):
    """A prewarm asked for while one runs is the running one; a finished one gives its area back as the idle one."""
    monkeypatch.setattr(_staging, "_CHUNK", 256)
    layout = _staging.layout_of({"w": torch.ones(1024)})
    first = _staging.prewarm(layout, pause_s=0.01)
    assert _staging.prewarm(layout) is first
    first.wait()
    assert first.finished is True
    area = _staging.acquire()
    assert area is first.area and area.nbytes == 4096
    _staging.release(area)
