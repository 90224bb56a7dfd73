"""The reusable staging area of background saves, and the weights file written beside DCP:
copies are exact, memory is reused, no byte of one save reaches another, and the marker
still comes after every file is durable."""

import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

from pimm_fn import checkpoint
from pimm_fn.checkpoint import _layout, _staging

SENTINEL = 1234.56789  # a value whose bytes appear nowhere else


def test_staged_tensors_are_exact_contiguous_copies_with_storages_of_their_own():
    """Each staged tensor equals its source, is contiguous, and its storage holds exactly its bytes."""
    src = {"a": torch.randn(5, 7).t(), "b": torch.arange(10, dtype=torch.int64), "c": torch.tensor([True, False]),
           "d": torch.empty(0, 3), "e": torch.tensor(2.5), "plain": 3}
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
    big = {"w": torch.full((4096,), SENTINEL, dtype=torch.float64), "b": torch.full((64,), SENTINEL, dtype=torch.float64)}
    checkpoint.save_checkpoint_async(tmp_path / "a", step=1, weights=dict(big), trainer={"opt": dict(big)}, local={}).wait()
    assert _files_contain(tmp_path / "a" / "last", needle)  # the needle is findable when present
    small_w, small_t = {"w": torch.arange(100, dtype=torch.float64)}, {"opt": {"m": torch.ones(10, dtype=torch.float64)}}
    info = checkpoint.save_checkpoint_async(tmp_path / "b", step=2, weights=small_w, trainer=small_t, local={"r": 1}).wait()
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
    """When the weights file cannot be written, the error surfaces and the previous checkpoint stays the latest."""
    checkpoint.save_checkpoint(tmp_path, step=1, weights={"w": torch.ones(2)}, trainer={}, local={})
    real = _layout.durable_write

    def failing(path, write):
        if path.name == _layout.WEIGHTS:
            raise OSError("disk full")
        return real(path, write)

    monkeypatch.setattr(_layout, "durable_write", failing)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint(tmp_path, step=2, weights={"w": torch.ones(2)}, trainer={}, local={})
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint_async(tmp_path, step=3, weights={"w": torch.ones(2)}, trainer={}, local={}).wait()
    assert checkpoint.latest_checkpoint(tmp_path).step == 1


@pytest.mark.parametrize("background", [False, True])
def test_the_marker_comes_after_every_file_and_directory_is_durable(tmp_path, monkeypatch, background):
    """The weights file runs beside DCP, but COMPLETE is written only after both and the trainer directory are durable."""
    events, lock = [], threading.Lock()
    real_write, real_dir, real_save = _layout.durable_write, _layout.fsync_dir, dcp.save

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

    monkeypatch.setattr(_layout, "durable_write", write)
    monkeypatch.setattr(_layout, "fsync_dir", fsync_dir)
    monkeypatch.setattr(dcp, "save", save)
    args = dict(step=1, weights={"w": torch.ones(2)}, trainer={"m": torch.zeros(2)}, local={})
    if background:
        checkpoint.save_checkpoint_async(tmp_path, **args).wait()
    else:
        checkpoint.save_checkpoint(tmp_path, **args)
    marker = events.index(_layout.MARKER)
    assert {"model.pth", "dcp", "dir:trainer"} <= set(events[:marker])
    assert events[marker + 1:] == ["dir:.staging", f"dir:{tmp_path.name}"]
