"""Checkpoints on object storage: ``save_dir`` as an fsspec URL (issue 23).

Against a real S3 API server on loopback (moto's server mode, started and
stopped by the fixture, reached through s3fs) and fsspec's ``memory://``:
a run saves, resumes bit-identical, keeps ``model_best``; retention; a
checkpoint whose marker is missing is never taken; a process SIGKILLed
mid-save leaves the previous checkpoint the latest and the half-written one
invisible; the lock is the store's exclusive create; an unknown scheme, or
``s3://`` without s3fs, or a bucket that does not exist (unless
``Saving(create_bucket=True)``), is refused before anything is written.
"""

import gc
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import uuid
import warnings
import weakref

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import storage
from pimm_fn.checkpoint.errors import SetAsideWarning
from pimm_fn.checkpoint import lock

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "runtime"))
import _s3  # noqa: E402
import _tiny_workload as tw  # noqa: E402


@pytest.fixture(scope="module")
def s3_endpoint():
    with _s3.s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["memory", "s3"])
def url(request):
    """A fresh, empty run location on each store."""
    if request.param == "memory":
        return f"memory://pimm-{uuid.uuid4().hex[:12]}/run"
    request.getfixturevalue("s3_endpoint")
    return f"s3://{_s3.new_bucket()}/run"


def _names(url: str) -> list[str]:
    return [p.name for p in storage.location(url).iterdir()]


def _small_save(model_dir, step, **kwargs):
    return pf.checkpoint.save_checkpoint(
        model_dir,
        step=step,
        weights={"w": torch.full((3,), float(step))},
        trainer={"lr": 0.1},
        local={"seed": step},
        **kwargs,
    )


def test_a_run_collected_while_its_store_hangs_does_not_stall_the_collection(tmp_path, monkeypatch):
    """Dropped unfinished while its store does not answer (a read hangs, as on an endpoint gone away): the
    collection that drops it waits a few seconds for the lock's release, not as long as the store hangs."""
    monkeypatch.chdir(tmp_path)
    _, run = tw.build(f"memory://pimm-{uuid.uuid4().hex[:12]}/run")
    run.run(steps=1)
    answering = threading.Event()
    read = storage.StorePath.read_bytes

    def hanging(self):
        answering.wait(120)  # the store answers only when the test lets it
        return read(self)

    monkeypatch.setattr(storage.StorePath, "read_bytes", hanging)
    monkeypatch.setattr(lock, "_COLLECTED_RELEASE_S", 0.5)  # the bound, shortened: the test is about there being one
    collected = weakref.ref(run)
    del run
    start = time.monotonic()
    gc.collect()
    took = time.monotonic() - start
    answering.set()
    assert collected() is None
    assert took < 30, f"the collection waited {took:.1f} s for the lock's release (the bound is 0.5 s here)"


def test_loop_saves_and_resumes_bit_identical_with_best_model(url, tmp_path, monkeypatch):
    """A run on the store, interrupted and resumed with 'auto', ends with the uninterrupted run's weights."""
    monkeypatch.chdir(tmp_path)
    model, run = tw.build(url + "/whole")
    run()
    whole = tw.weights(model)

    _, first = tw.build(url + "/split")
    first.run(steps=7)  # saved at step 6
    del first
    gc.collect()  # its lock released now, while the server runs
    resumed_model, resumed = tw.build(url + "/split", resume="auto")
    assert resumed.state.progress.global_step == 6
    resumed()
    assert tw.same_weights(tw.weights(resumed_model), whole)

    assert "model_best.pth" in _names(url + "/split/model")
    best = pf.checkpoint.load_weights_file(url + "/split/model/model_best.pth")
    assert best.keys() == whole.keys()
    assert list(tmp_path.iterdir()) == []  # nothing local: no folder named after the URL, no log


def test_background_save_on_the_store_resumes(tmp_path, monkeypatch):
    """``save_every(n, async_save=True)`` writes through the same fsspec path."""
    monkeypatch.chdir(tmp_path)
    url = f"memory://pimm-{uuid.uuid4().hex[:12]}/run"
    hooks = [pf.save_every(3, async_save=True)]
    model, run = tw.build(url, hooks=hooks)
    run()
    latest = pf.checkpoint.latest_checkpoint(url + "/model")
    assert latest.step == 15 and storage.is_store(latest.path)
    loaded = pf.checkpoint.load_checkpoint(latest)
    assert tw.same_weights(loaded.weights, tw.weights(model))


def test_retention_deletes_only_after_the_newer_is_committed(url):
    model_dir = url + "/model"
    for step in (1, 2, 3, 4):
        _small_save(model_dir, step, snapshot=True, keep=pf.keep_last(2), digests=True)
    names = _names(model_dir)
    assert sorted(n for n in names if n.startswith("iter_")) == ["iter_3", "iter_4"]
    assert [n for n in names if n.startswith("last")] and all(
        n.startswith("last-4-") for n in names if n.startswith("last")
    )
    latest = pf.checkpoint.latest_checkpoint(model_dir)
    assert latest.step == 4 and pf.checkpoint.validate(latest.path, digests=True).step == 4
    assert torch.equal(pf.checkpoint.load_checkpoint(latest).weights["w"], torch.full((3,), 4.0))


def test_a_checkpoint_whose_marker_is_missing_is_never_taken(url):
    model_dir = url + "/model"
    for step in (1, 2):
        _small_save(model_dir, step, snapshot=True)
    root = storage.location(model_dir)
    newest = [p for p in root.iterdir() if p.name.startswith("last-")]
    for entry in (*newest, root / "iter_2"):
        (entry / "COMPLETE").unlink()
    found = pf.checkpoint.latest_checkpoint(model_dir)
    assert found.step == 1 and found.path.name == "iter_1"
    assert pf.checkpoint.find_checkpoint(url).step == 1
    with pytest.raises(pf.CheckpointError, match="COMPLETE"):
        pf.checkpoint.validate(newest[0])
    # the next publish deletes what was never committed; iter_1, committed and readable, stays
    _small_save(model_dir, 3)
    assert sorted(n for n in _names(model_dir) if not n.startswith("last-3-")) == ["iter_1"]


def test_a_damaged_committed_checkpoint_is_never_deleted(url):
    """Retention and publish leave a checkpoint alone whose marker they cannot validate."""
    model_dir = url + "/model"
    _small_save(model_dir, 1, snapshot=True)
    damaged = storage.location(model_dir) / "iter_1"
    (damaged / "model.pth").write_bytes(b"cut")  # the marker records another size
    for step in (2, 3, 4):
        _small_save(model_dir, step, snapshot=True, keep=pf.keep_last(1))
    assert "iter_1" in _names(model_dir) and (damaged / "COMPLETE").exists()
    assert sorted(n for n in _names(model_dir) if n.startswith("iter_")) == ["iter_1", "iter_4"]


def test_a_damaged_snapshot_on_a_store_is_set_aside_when_its_step_is_saved_again(url):
    """A re-save of step 1 (after resuming from an older checkpoint) finds iter_1 damaged: it is copied to
    damaged-iter_1, bytes and marker kept, before iter_1 is written again; an intact iter_1 is simply replaced."""
    model_dir = url + "/model"
    _small_save(model_dir, 1, snapshot=True)
    snapshot = storage.location(model_dir) / "iter_1"
    (snapshot / "model.pth").write_bytes(b"cut")
    marker = (snapshot / "COMPLETE").read_bytes()
    with pytest.warns(SetAsideWarning, match="model.pth is 3 bytes.*kept as damaged-iter_1"):
        _small_save(model_dir, 1, snapshot=True)
    kept = storage.location(model_dir) / "damaged-iter_1"
    assert (kept / "model.pth").read_bytes() == b"cut" and (kept / "COMPLETE").read_bytes() == marker
    assert pf.checkpoint.validate(snapshot).step == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetAsideWarning)
        _small_save(model_dir, 1, snapshot=True)
    assert sorted(n for n in _names(model_dir) if "iter_" in n) == ["damaged-iter_1", "iter_1"]


def test_a_checkpoint_on_a_store_is_checked_from_one_listing(url, monkeypatch):
    """Sizes come from one listing of the checkpoint, not a request per file; a missing file and a crafted name
    are still refused, naming them."""
    path = _small_save(url + "/model", 1).path
    stat, is_file = storage.StorePath.stat, storage.StorePath.is_file

    def per_file(name):
        def refuse(self, *args):
            raise AssertionError(f"{name} of {self.name}: validation asked the store once per file")

        return refuse

    monkeypatch.setattr(storage.StorePath, "stat", per_file("stat"))
    monkeypatch.setattr(storage.StorePath, "is_file", lambda self: not self.path.endswith(".pth") and is_file(self))
    assert pf.checkpoint.validate(path).step == 1
    monkeypatch.setattr(storage.StorePath, "stat", stat)
    monkeypatch.setattr(storage.StorePath, "is_file", is_file)
    marker = (path / "COMPLETE").read_bytes()
    crafted = json.loads(marker)
    crafted["files"] = {"../outside.bin": {"size": 1}, **crafted["files"]}
    (path / "COMPLETE").write_bytes(json.dumps(crafted).encode())
    with pytest.raises(pf.checkpoint.CheckpointError, match="not a plain relative path"):
        pf.checkpoint.validate(path)
    (path / "COMPLETE").write_bytes(marker)
    (path / "model.pth").unlink()
    with pytest.raises(pf.checkpoint.CheckpointError, match=f"model.pth is missing.*ls {url}/model`"):
        pf.checkpoint.validate(path)


_KILLED_SAVE = """
import os, signal, sys, torch
import pimm_fn as pf
from pimm_fn.checkpoint import files
model_dir = sys.argv[1]
pf.checkpoint.save_checkpoint(model_dir, step=1, weights={"w": torch.ones(1000)}, trainer={"t": torch.zeros(1000)},
                              local={})
def killed(*args, **kwargs):
    print("killed before the marker", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
files.write_marker = killed
pf.checkpoint.save_checkpoint(model_dir, step=2, weights={"w": torch.ones(1000)}, trainer={"t": torch.zeros(1000)},
                              local={})
"""


def test_sigkill_mid_save_leaves_the_previous_checkpoint_discoverable(s3_endpoint, tmp_path):
    model_dir = f"s3://{_s3.new_bucket()}/run/model"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_SAVE, model_dir],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == -9, done.stderr[-3000:]
    half = [p for p in storage.location(model_dir).iterdir() if p.name.startswith("last-2-")]
    assert len(half) == 1 and (half[0] / "model.pth").is_file() and (half[0] / "trainer" / ".metadata").is_file()
    assert not (half[0] / "COMPLETE").exists()
    latest = pf.checkpoint.latest_checkpoint(model_dir)
    assert latest.step == 1
    assert pf.checkpoint.load_checkpoint(latest).trainer["t"].shape == (1000,)
    _small_save(model_dir, 3)  # the next publish removes the half-written directory
    assert [n for n in _names(model_dir)] == [pf.checkpoint.latest_checkpoint(model_dir).path.name]


def test_the_lock_is_the_stores_exclusive_create(url):
    """Of two takers one wins; a run finding another host's lock is refused and writes nothing."""
    path = storage.location(url) / lock.LOCK_NAME
    other = lock.Holder("another-host", 1, 0.0, "a" * 32)
    lock._create(path, other)
    with pytest.raises(FileExistsError):
        lock._create(path, lock.Holder("me", 2, 0.0, "b" * 32))
    with pytest.raises(lock.SaveDirLockError, match="another-host"):
        tw.build(url)
    assert _names(url) == [lock.LOCK_NAME]


def test_an_unknown_scheme_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no storage protocol 'nosuchstore'"):
        tw.build("nosuchstore://bucket/exp1")
    assert list(tmp_path.iterdir()) == []


def test_check_url_refuses_a_path_that_names_no_scheme():
    """check_url's refusal is a ValueError for a plain path too (an AttributeError escaped it before)."""
    with pytest.raises(ValueError, match="'runs/x' is not a URL: it names no scheme"):
        storage.check_url("runs/x")


def test_a_marker_written_unstaged_on_a_store_is_written_in_place():
    """write_marker(staged=False) on a store writes COMPLETE in place (no rename there); it raised a TypeError."""
    from pimm_fn.checkpoint import files

    directory = storage.location(f"memory://pimm-{uuid.uuid4().hex[:12]}/model/last")
    files.write_marker(directory, 7, 1)
    assert json.loads((directory / files.MARKER).read_text())["step"] == 7


def test_s3_without_s3fs_is_refused_naming_the_extra(tmp_path, monkeypatch):
    """s3fs made unimportable (``sys.modules["s3fs"] = None``, fsspec's registration of it forgotten): refused."""
    import fsspec  # noqa: F401 - its registry module, whose name the package's ``registry`` attribute shadows

    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "s3", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImportError):
        import s3fs  # noqa: F401 - the package is really out of reach
    with pytest.raises(ValueError, match=r"pip install 'pimm_fn\[s3\]'"):
        tw.build("s3://bucket/exp1")
    assert list(tmp_path.iterdir()) == []


def _buckets() -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return [name.rstrip("/") for name in fs.ls("")]


def test_a_missing_bucket_is_refused_naming_it_and_never_created(s3_endpoint, tmp_path, monkeypatch):
    """save_dir='s3://<a bucket that does not exist>/exp' is refused by loop() before anything is written, naming
    the bucket and the opt-in; save_checkpoint there is refused alike; the bucket is never created."""
    monkeypatch.chdir(tmp_path)
    typo = f"pimm-typo-{uuid.uuid4().hex[:8]}"
    refused = rf"the bucket '{typo}' of s3://{typo}/exp\S* does not exist, and pimm_fn creates no bucket unless asked"
    with pytest.raises(
        pf.checkpoint.CheckpointStorageError, match=rf"loop: save_dir 's3://{typo}/exp': {refused}"
    ) as raised:
        tw.build(f"s3://{typo}/exp", hooks=[pf.save_every(2)])
    assert "this run wrote nothing" in str(raised.value)
    assert str(raised.value).endswith("or pass loop(..., saving=pimm_fn.Saving(create_bucket=True))")
    with pytest.raises(pf.checkpoint.CheckpointStorageError, match=refused):
        _small_save(f"s3://{typo}/exp/model", 1)
    with pytest.raises(pf.checkpoint.CheckpointStorageError, match=refused):
        pf.checkpoint.write_best(f"s3://{typo}/exp/model", {"w": torch.ones(1)}, metric="acc", value=1.0, step=1)
    assert typo not in _buckets()
    assert list(tmp_path.iterdir()) == []


def test_create_bucket_creates_a_missing_bucket_says_so_and_trains_there(s3_endpoint, tmp_path, monkeypatch, capsys):
    """loop(saving=Saving(create_bucket=True)) creates the missing bucket, says so, and saves there; a bucket that
    exists is used as it is, without a word."""
    monkeypatch.chdir(tmp_path)
    name = f"pimm-new-{uuid.uuid4().hex[:8]}"
    url = f"s3://{name}/exp"
    tw.build(url, hooks=[pf.save_every(5)], saving=pf.Saving(create_bucket=True), console=True)[1]()
    assert name in _buckets()
    assert pf.checkpoint.latest_checkpoint(url + "/model").step == 15
    assert f"created the bucket s3://{name} for save_dir {url}" in capsys.readouterr().out
    tw.build(f"s3://{name}/again", hooks=[pf.save_every(5)], saving=pf.Saving(create_bucket=True), console=True)[1]()
    assert "created the bucket" not in capsys.readouterr().out


def test_legacy_format_is_refused_on_a_store():
    url = f"memory://pimm-{uuid.uuid4().hex[:12]}/model"
    with pytest.raises(ValueError, match="checkpoint_format='standard'"):
        _small_save(url, 1, format="legacy")
    with pytest.raises(ValueError, match="checkpoint_format='standard'"):
        tw.build(url.removesuffix("/model"), fmt="legacy")
    assert not storage.location(url.removesuffix("/model")).exists()


def test_plain_paths_and_file_urls_stay_local(tmp_path):
    assert storage.location(str(tmp_path)) == tmp_path
    assert storage.location(f"file://{tmp_path}") == tmp_path
    info = _small_save(f"file://{tmp_path}/model", 1)
    assert info.path == tmp_path / "model" / "last"


class _Boom:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_reading_from_a_store_never_unpickles(capsys):
    """The fsspec reader is guarded as the local one: a pickled entry is refused, DCP's own planner too."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from pimm_fn.checkpoint.formats import dcp_reading as safe_reading

    where = storage.location(f"memory://pimm-{uuid.uuid4().hex[:12]}/crafted")
    dcp.save({"x": _Boom(), "t": torch.ones(2)}, storage_writer=FsspecWriter(where.url + "/trainer"), no_dist=True)
    with pytest.raises(pf.CheckpointError, match="pickled object"):
        safe_reading.load({"x": torch.empty(1)}, where)
    meta = safe_reading.metadata(where)
    with pytest.raises(BaseException, match="dcp_reading.s planner only"):
        dcp.load({"x": None}, storage_reader=safe_reading._StoreReader(where / "trainer", meta), no_dist=True)
    template = {"t": torch.empty(2)}
    safe_reading.load(template, where)
    assert torch.equal(template["t"], torch.ones(2)) and "unpickled!" not in capsys.readouterr().out


def test_a_fresh_run_into_a_store_holding_checkpoints_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"memory://pimm-{uuid.uuid4().hex[:12]}/run"
    _small_save(url + "/model", 3)
    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        tw.build(url)
    assert pf.checkpoint.latest_checkpoint(url + "/model").step == 3


def test_log_files_stay_local(tmp_path, monkeypatch):
    """A logger given a URL is refused (no local folder named after it); a URL save_dir writes no log.jsonl."""
    monkeypatch.chdir(tmp_path)
    for logger in (pf.JsonlLogger, pf.CSVLogger):
        with pytest.raises(ValueError, match="stay local"):
            logger("s3://bucket/exp1/log.jsonl")
    assert list(tmp_path.iterdir()) == []
