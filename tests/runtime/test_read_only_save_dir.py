"""A finished run opens without writing: on read-only storage (run.history, the CLI, plan) and on writable storage alike.

Read-only storage is real: as root (who writes through any mode bits) a
read-only bind mount of the run, in a private mount namespace of the child
process only (``unshare --mount``: it vanishes with the child); as another
user, the run's directories with their write bits removed. Where neither
can be had the test is skipped, saying why.
"""

import hashlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys

import pytest

import pimm_fn as pf

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _tiny_workload as tw  # noqa: E402

CHECK = HERE / "_read_only_check.py"
TIMEOUT = 120
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))}


def snapshot(root: pathlib.Path) -> dict:
    """Every entry under ``root`` with its bytes' digest (files) and mtime: any write shows."""
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        found[path.relative_to(root).as_posix()] = (digest, info.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch run of the standard hooks (saves, evaluations, best weights, log.jsonl)."""
    save_dir = tmp_path_factory.mktemp("finished") / "run"
    tw.build(save_dir, max_epochs=2)[1]()
    return save_dir


def read_only_child(save_dir: pathlib.Path, tmp_path: pathlib.Path) -> dict:
    """Run ``_read_only_check.py`` on ``save_dir`` made read-only for that child alone; its JSON result."""
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("running as root, whose writes pass any mode bits, and no unshare for a read-only mount")
        view = tmp_path / "read-only-view"
        view.mkdir()
        script = (
            f'mount --bind "{save_dir}" "{view}" && mount -o remount,bind,ro "{view}" && '
            f'exec "{sys.executable}" "{CHECK}" "{view}" 2'
        )
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'mount --bind "{save_dir}" "{view}"'],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            pytest.skip(f"running as root and no read-only mount is permitted here: {probe.stderr.strip()}")
        restore = None
    else:
        view = save_dir
        command = [sys.executable, str(CHECK), str(view), "2"]
        modes = {p: p.stat().st_mode for p in [save_dir, *save_dir.rglob("*")]}
        for path, mode in modes.items():
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        restore = modes
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)
    finally:
        for path, mode in (restore or {}).items():
            path.chmod(mode)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[0][len("RESULT ") :]), view


def test_a_finished_run_on_read_only_storage_opens_and_its_history_reads_back(finished, tmp_path):
    """resume='auto' opens the finished run (history rebuilt) without a write; a run that would train is refused."""
    before = snapshot(finished)
    found, view = read_only_child(finished, tmp_path)
    opened = found["opened"]  # the error's text, where opening it raised
    assert isinstance(opened, dict) and (opened["step"], opened["finished"], opened["evals"]) == (10, True, 2), opened
    assert opened["history"] >= 4, opened
    kind, message = found["train"]
    assert kind == "SaveDirLockError" and "cannot be written" in message and "would train" in message, message
    assert str(view) in message, message
    assert {name: code for name, (code, _) in found["cli"].items()} == {"ls": 0, "inspect": 0, "verify": 0}, found
    assert found["plan"] > 0
    assert snapshot(finished) == before


def test_a_finished_run_on_writable_storage_opens_without_a_write(finished, tmp_path):
    """Opening a finished run leaves every file and mtime as it was: no lock file, no log truncation, no log.1.jsonl."""
    save_dir = tmp_path / "run"
    shutil.copytree(finished, save_dir)
    before = snapshot(save_dir)
    with pytest.warns(pf.ConfigurationWarning, match="nothing is left to train"):
        _, run = tw.build(save_dir, resume="auto", max_epochs=2)
    assert run.finished and len(run.history.records("eval")) == 2
    run.run()
    assert snapshot(save_dir) == before
