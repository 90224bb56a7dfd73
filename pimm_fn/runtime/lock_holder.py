"""Who holds a ``save_dir`` lock (``Holder``, read from its file) and whether it may still be running.

A lock whose holder is no longer running (same host, no such process, a
zombie, or a process started after the lock) may be taken over; one held
on another host cannot be told from here. ``pimm_fn.runtime.lock`` takes
and releases the lock itself. The file is read as untrusted input: only a
regular file, and only a record whose pid and time are sane
(:func:`read_holder`), so nothing crafted reaches ``os.kill`` or ``localtime``.
"""

from __future__ import annotations

import os
import pathlib
import time

import attrs

from pimm_fn.checkpoint import regular_files

__all__ = ["Holder", "read_holder", "stale_reason"]

_UNREADABLE_GRACE_S = 10.0  # an unreadable lock younger than this is being written; older, a taker killed mid-write
_LIMIT = 2**16  # bytes: a holder record is about 120
_MAX_PID = 2**31 - 1  # pid_t's range: a larger number names no process (and os.kill would overflow)
_LATEST = 1e11  # a time.time() before the year 5000: a later "since" is crafted (and localtime would overflow)
# What each field of a holder record must be: a crafted value never reaches os.kill or localtime.
_FIELDS = {
    "host": (lambda v: isinstance(v, str), "a str"),
    "pid": (lambda v: type(v) is int and 1 <= v <= _MAX_PID, f"an int from 1 to {_MAX_PID}"),
    "since": (lambda v: type(v) in (int, float) and 0 <= v <= _LATEST, f"a time.time() value from 0 to {_LATEST:.0e}"),
    "token": (lambda v: isinstance(v, str), "a str"),
}


@attrs.frozen
class Holder:
    """Who holds a lock: host, pid, when it was taken (``time.time()``) and its own token."""

    host: str
    pid: int
    since: float
    token: str

    def __str__(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on host {self.host}, since {since}"


def read_holder(path: pathlib.Path) -> Holder:
    """The holder a lock file names, read as the untrusted input it is (:mod:`pimm_fn.checkpoint.regular_files`).

    Raises:
        ValueError: it is not a sane holder record (garbled, cut short, crafted): the message says why.
        FileNotFoundError: it is gone.
        NotRegularFileError: it is a FIFO, a link, a directory or a device (never waited on or followed).
        OSError: it cannot be read.
    """
    try:
        fields = regular_files.read_json(path, limit=_LIMIT)
    except ValueError as exc:
        raise ValueError(f"unreadable lock file {path}: {exc}") from exc
    if not isinstance(fields, dict):
        raise ValueError(f"unreadable lock file {path}: a JSON {type(fields).__name__}, not a holder record")
    for name, (sane, expected) in _FIELDS.items():
        if not sane(fields.get(name)):
            raise ValueError(f"unreadable lock file {path}: {name!r} must be {expected} (got {fields.get(name)!r:.80})")
    return Holder(fields["host"], fields["pid"], float(fields["since"]), fields["token"])


def stale_reason(path: pathlib.Path, held: Holder | None, me: Holder) -> str | None:
    """Why the lock may be taken over ("" quietly: this very process), or ``None`` while its holder may run."""
    if held is None:
        try:
            age = time.time() - getattr(path.stat(), "st_mtime", time.time())  # a store's object: never taken over
        except FileNotFoundError:
            return ""
        if age <= _UNREADABLE_GRACE_S:
            return None  # being written by a taker right now
        return f"its lock file was unreadable, {age:.0f} s old (a run killed while taking it)"
    if held.host != me.host:
        return None  # another host's processes cannot be seen from here
    if held.pid == me.pid:
        return ""  # a run rebuilt in this process: the earlier one no longer writes on its own
    if _running(held.pid, held.since):
        return None
    return f"its holder ({held}) is no longer running"


def _running(pid: int, since: float) -> bool:
    """Whether process ``pid`` of this host may still be the one that took a lock at ``since``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    except (OSError, StopIteration, ValueError, IndexError):
        return True  # no /proc to tell a zombie or a reused pid: assume it runs
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= since + 2.0  # a process started after the lock was taken reuses a dead holder's pid
