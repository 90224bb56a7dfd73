"""One run per save_dir: a second run is refused naming the first and writes nothing; a dead holder's lock is taken over.

The first run is a real process (``_lock_holder.py``: it trains 3 steps,
saves at step 2 and waits). Two runs on one save_dir used to destroy each
other (each save's clean-up deleted the other's ``.staging-*``): the
second is now refused before it reads or writes anything there.
"""

import gc
import weakref
import hashlib
import json
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import time

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import lock

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _tiny_workload as tw  # noqa: E402

HOLDER = HERE / "_lock_holder.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")]))}


def snapshot(root: pathlib.Path) -> dict:
    """Every entry under ``root`` (itself included) with its digest and mtime: any write shows."""
    found = {}
    for path in sorted([root, *root.rglob("*")]):
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        found[path.relative_to(root).as_posix()] = (digest, path.lstat().st_mtime_ns)
    return found


def second_run(save_dir, resume="auto", console=False):
    return tw.build(
        save_dir,
        hooks=[pf.save_every(2)],
        max_epochs=3,
        resume=resume,
        console=console,
        watching=pf.Watching(progress=False),
    )


@pytest.fixture
def holder(tmp_path):
    """A first run holding ``tmp_path/run``, trained to step 3 (saved at 2); killed at the end of the test."""
    save_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), str(save_dir), "--hold", "90"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    deadline, seen = time.monotonic() + 90, ""
    while "holding" not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"the first run did not start: {seen}{proc.stdout.read() if proc.poll() is not None else ''}")
        if select.select([proc.stdout], [], [], left)[0]:
            seen += proc.stdout.readline()
    yield proc, save_dir
    if proc.returncode is None:
        proc.kill()
        proc.wait()


def zombie(proc) -> None:
    """Wait until ``proc`` (killed, not reaped: no poll) is a zombie."""
    deadline = time.monotonic() + 20
    while pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the killed process never became a zombie"
        time.sleep(0.02)


def test_a_second_run_is_refused_naming_the_first_and_writes_nothing(holder):
    """While a run holds save_dir, another (resume='auto' or fresh) raises SaveDirLockError naming host, pid and
    since, and the save_dir is byte- and mtime-identical afterwards: no staging of the first is touched."""
    proc, save_dir = holder
    held = json.loads((save_dir / lock.LOCK_NAME).read_text())
    assert (held["host"], held["pid"]) == (socket.gethostname(), proc.pid) and held["since"] <= time.time()
    before = snapshot(save_dir)
    for resume in ("auto", None):
        with pytest.raises(pf.SaveDirLockError) as caught:
            second_run(save_dir, resume=resume)
        message = str(caught.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}, since " in message, message
        assert str(save_dir / lock.LOCK_NAME) in message and "another save_dir" in message, message
        assert caught.value.holder.pid == proc.pid and not caught.value.read_only
    assert snapshot(save_dir) == before


def test_a_killed_holders_lock_is_taken_over_with_a_notice(holder, capsys):
    """After the first run dies by SIGKILL (a zombie, not yet reaped), a new run takes its lock over, says so,
    resumes its checkpoint, trains to the end and releases the lock."""
    proc, save_dir = holder
    proc.send_signal(signal.SIGKILL)
    zombie(proc)
    model, run = second_run(save_dir, console=True)
    out = capsys.readouterr().out
    assert f"took over the lock of {save_dir}: its holder (pid {proc.pid} on host" in out, out
    assert "is no longer running" in out and run.state.progress.global_step == 2
    assert json.loads((save_dir / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    run()
    assert not (save_dir / lock.LOCK_NAME).exists()
    proc.wait()


def test_a_lock_held_on_another_host_is_refused_with_the_file_to_delete(tmp_path):
    """A holder on another host cannot be checked from here: refused, naming it and the file to delete if it is gone."""
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    other = lock.Holder("node-17", os.getpid(), time.time() - 60, "t")
    (save_dir / lock.LOCK_NAME).write_text(
        json.dumps({"host": other.host, "pid": other.pid, "since": other.since, "token": other.token})
    )
    before = snapshot(save_dir)
    with pytest.raises(pf.SaveDirLockError, match="on host node-17") as caught:
        second_run(save_dir)
    assert f"delete {save_dir / lock.LOCK_NAME}" in str(caught.value) and caught.value.holder == other
    assert snapshot(save_dir) == before


def test_a_lock_whose_pid_now_names_a_later_process_is_taken_over(tmp_path, capsys):
    """A pid reused by a process started after the lock was taken is not the holder: the lock is stale."""
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (save_dir / lock.LOCK_NAME).write_text(
            json.dumps({"host": socket.gethostname(), "pid": sleeper.pid, "since": time.time() - 3600, "token": "old"})
        )
        _, run = second_run(save_dir, console=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert f"took over the lock of {save_dir}" in capsys.readouterr().out
    run()
    assert not (save_dir / lock.LOCK_NAME).exists()


def test_a_run_rebuilt_in_the_same_process_takes_the_lock_and_the_first_cannot_release_it(tmp_path):
    """A notebook cell run again: the new run takes the lock quietly; the old run, collected, leaves it to the new."""
    save_dir = tmp_path / "run"
    _, first = second_run(save_dir, resume=None)
    first.run(steps=1)
    _, again = second_run(save_dir)
    token = json.loads((save_dir / lock.LOCK_NAME).read_text())["token"]
    collected = weakref.ref(first)
    del first
    gc.collect()
    assert collected() is None  # its finalizer ran: it released only a lock of its own
    assert json.loads((save_dir / lock.LOCK_NAME).read_text())["token"] == token
    again()
    assert not (save_dir / lock.LOCK_NAME).exists()
