"""Who holds a ``save_dir`` lock (``Holder``, read from its file) and whether it may still be running.

A lock whose holder is no longer running (same host, no such process, a
zombie, or a process started after the lock) may be taken over; one held
on another host cannot be told from here. ``pimm_fn.runtime.lock`` takes
and releases the lock itself.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import attrs

__all__ = ["Holder", "read_holder", "stale_reason"]

_UNREADABLE_GRACE_S = 10.0  # an unreadable lock younger than this is being written; older, a taker killed mid-write


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
    """The holder a lock file names; ``ValueError`` when it does not parse, ``FileNotFoundError`` when gone."""
    try:
        fields = json.loads(path.read_bytes())
        return Holder(str(fields["host"]), int(fields["pid"]), float(fields["since"]), str(fields["token"]))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable lock file {path}") from exc


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
