"""A crafted or damaged ``pimm_fn.lock`` is an unreadable lock, never a traceback from os.kill or localtime.

A pid of ``10**30`` on this host reached ``os.kill`` (OverflowError), a
``since`` of ``1e300`` or NaN reached ``time.localtime``, JSON nested
100,000 deep raised RecursionError, and a FIFO as the lock file made the
run wait forever. Each now lands where a garbled lock always did: refused
while it may be being written, taken over (with a notice) once it is older
than that; a FIFO, which no run leaves, is refused naming the file to delete.
"""

import json
import os
import pathlib
import socket
import sys
import time

import pytest

import pimm_fn as pf
from pimm_fn.checkpoint import lock
from pimm_fn.checkpoint.lock import Holder, read_holder

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _tiny_workload as tw  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

HOST = socket.gethostname()
CRAFTED = {
    "pid 10**30 on this host": json.dumps({"host": HOST, "pid": 10**30, "since": 0, "token": "t"}),
    "pid 1e400 on this host": '{"host": "%s", "pid": 1e400, "since": 0, "token": "t"}' % HOST,
    "pid 0 (every process of the group)": json.dumps({"host": HOST, "pid": 0, "since": 0, "token": "t"}),
    "pid -1 (every process)": json.dumps({"host": HOST, "pid": -1, "since": 0, "token": "t"}),
    "pid true": json.dumps({"host": HOST, "pid": True, "since": 0, "token": "t"}),
    "since 10**400": json.dumps({"host": "node-17", "pid": 1, "since": 10**400, "token": "t"}),
    "since 1e300": json.dumps({"host": "node-17", "pid": 1, "since": 1e300, "token": "t"}),
    "since NaN": '{"host": "node-17", "pid": 1, "since": NaN, "token": "t"}',
    "since a str": json.dumps({"host": "node-17", "pid": 1, "since": "yesterday", "token": "t"}),
    "host a list": json.dumps({"host": ["a"], "pid": 1, "since": 0, "token": "t"}),
    "nested 100,000 deep": "[" * 100000,
    "a list": "[1, 2]",
}


def _run(save_dir, console=False):
    return tw.build(
        save_dir,
        hooks=[pf.save_every(2)],
        max_epochs=1,
        resume="auto",
        console=console,
        watching=pf.Watching(progress=False),
    )


def _locked(tmp_path, content: str | None, age_s: float = 0.0) -> pathlib.Path:
    """A save_dir whose lock file holds ``content`` (a FIFO for ``None``), last written ``age_s`` ago."""
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    path = save_dir / lock.LOCK_NAME
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return save_dir


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_read_holder_calls_a_crafted_record_unreadable_naming_the_field(tmp_path, name):
    """Each crafted record is a ValueError naming the lock file (and the field), never Overflow- or RecursionError."""
    path = _locked(tmp_path, CRAFTED[name]) / lock.LOCK_NAME
    with pytest.raises(ValueError, match=f"unreadable lock file {path}"):
        read_holder(path)


def test_read_holder_reads_a_sane_record_as_before(tmp_path):
    """A record as a run writes it reads back as its Holder, whose text names pid, host and time."""
    since = time.time() - 60
    path = _locked(tmp_path, json.dumps({"host": "node-17", "pid": 4242, "since": since, "token": "t"}))
    held = read_holder(path / lock.LOCK_NAME)
    assert held == Holder("node-17", 4242, since, "t") and str(held).startswith("pid 4242 on host node-17, since ")


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_fresh_crafted_lock_is_refused_as_one_being_written(tmp_path, name):
    """A crafted lock written just now is what a taker writing it looks like: refused, nothing written there."""
    save_dir = _locked(tmp_path, CRAFTED[name])
    with pytest.raises(pf.SaveDirLockError, match="its lock file is being written") as caught:
        _run(save_dir)
    assert f"delete {save_dir / lock.LOCK_NAME}" in str(caught.value)
    assert sorted(p.name for p in save_dir.iterdir()) == [lock.LOCK_NAME]


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_an_old_crafted_lock_is_taken_over_with_a_notice(tmp_path, name, capsys):
    """A crafted lock older than a write takes is a taker killed mid-write: taken over, said, released at the end."""
    save_dir = _locked(tmp_path, CRAFTED[name], age_s=60)
    _, run = _run(save_dir, console=True)
    assert f"took over the lock of {save_dir}: its lock file was unreadable" in capsys.readouterr().out
    assert read_holder(save_dir / lock.LOCK_NAME).pid == os.getpid()
    run()
    assert not (save_dir / lock.LOCK_NAME).exists()


@pytest.mark.parametrize("age_s", [0.0, 60.0])
def test_a_fifo_as_the_lock_is_refused_at_once_naming_the_file_to_delete(tmp_path, age_s):
    """A FIFO (no run leaves one) is never read, never waited on, never taken over: refused, naming it."""
    save_dir = _locked(tmp_path, None, age_s=age_s)
    with within(60), pytest.raises(pf.SaveDirLockError, match="is a FIFO, not a regular file") as caught:
        _run(save_dir)
    assert f"delete {save_dir / lock.LOCK_NAME}" in str(caught.value) and caught.value.holder is None
    assert sorted(p.name for p in save_dir.iterdir()) == [lock.LOCK_NAME]
