"""One run per ``save_dir``: a lock file naming its holder, taken before the run writes anything there.

Two runs writing one ``save_dir`` destroy each other: each save's clean-up
removes the other's staging directory, ``log.jsonl`` is set aside under the
other. So ``loop()`` takes ``save_dir/pimm_fn.lock`` before it writes
anything there (created with ``O_CREAT | O_EXCL``, holding the holder's host,
pid, start time and a token of its own), and a second run is refused with a
:class:`SaveDirLockError` naming the holder and the fix, before it reads
or writes anything there (on every rank alike). The lock is
released when training ends, when the ``Loop`` is collected, and at the
process's exit; only the run that took it removes it (by its token).

A lock whose holder is no longer running (a killed run: same host, no such
process, a zombie, or a process started after the lock) is taken over,
with a console line. One held on another host cannot be told from here:
refused, with the file to delete if that run is gone. A run rebuilt in the
holder's own process (a notebook cell run again) takes it over quietly.
The lock file is untrusted: a record that is not a sane holder (a crafted
pid or time, JSON nested too deep) is a garbled lock, taken over once older
than a write takes; one that cannot be read as a regular file (a FIFO, a
link, another user's file) is never waited on or taken over: refused, naming it.

Ranks of one job share the lock: rank 0 takes it and every rank learns the
outcome (one broadcast), so all raise or all go on. A run that will not
write (a finished run opened to read ``run.history``) needs no lock: it is
released at once (:meth:`Lock.settle`), and on read-only storage, where no
lock can be made, such a run opens without one; a run that would train
there is refused, saying the storage is read-only.

On an fsspec store (``save_dir="s3://..."``) the lock is an object created
with the store's exclusive create (``open(mode="xb")``: S3's conditional
``If-None-Match: *`` PUT through s3fs, which AWS S3 and MinIO honour),
so of two runs one wins. Where a store has no exclusive create it is a
best effort: the lock is written only when absent, then read back, and the
run that finds another token there is refused (two runs starting within
one round trip of each other may both read their own). A holder on another
host, or an unreadable lock object, is never taken over: delete the object
named in the error when its run is gone.

Who holds a ``save_dir`` lock (``Holder``, read from its file) and whether it may still be running.

A lock whose holder is no longer running (same host, no such process, a
zombie, or a process started after the lock) may be taken over; one held
on another host cannot be told from here. ``pimm_fn.checkpoint.lock`` takes
and releases the lock itself. The file is read as untrusted input: only a
regular file, and only a record whose pid and time are sane
(:func:`read_holder`), so nothing crafted reaches ``os.kill`` or ``localtime``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import socket
import threading
import time
import uuid

import attrs

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage
from pimm_fn.checkpoint.errors import SaveDirLockError

__all__ = [
    "Holder",
    "read_holder",
    "stale_reason",
    "LOCK_NAME",
    "Lock",
    "take",
    "release_when_collected",
]


_UNREADABLE_GRACE_S = 10.0  # an unreadable lock younger than this is being written; older, a taker killed mid-write


_LIMIT = 2**16  # bytes: a holder record is about 120

# Seconds a run collected unfinished waits for its lock's release on a store: a store's client retries an
# endpoint that is gone for half a minute, and a finalizer runs wherever the garbage collector happens to.
_COLLECTED_RELEASE_S = 5.0


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


def read_holder(path: storage.Location) -> Holder:
    """The holder a lock file names, read as the untrusted input it is (:mod:`pimm_fn.checkpoint.files`).

    Raises:
        ValueError: it is not a sane holder record (garbled, cut short, crafted): the message says why.
        FileNotFoundError: it is gone.
        NotRegularFileError: it is a FIFO, a link, a directory or a device (never waited on or followed).
        OSError: it cannot be read.
    """
    try:
        fields = files.read_json(path, limit=_LIMIT)
    except ValueError as exc:
        raise ValueError(f"unreadable lock file {path}: {exc}") from exc
    if not isinstance(fields, dict):
        raise ValueError(f"unreadable lock file {path}: a JSON {type(fields).__name__}, not a holder record")
    for name, (sane, expected) in _FIELDS.items():
        if not sane(fields.get(name)):
            raise ValueError(f"unreadable lock file {path}: {name!r} must be {expected} (got {fields.get(name)!r:.80})")
    return Holder(fields["host"], fields["pid"], float(fields["since"]), fields["token"])


def stale_reason(path: storage.Location, held: Holder | None, me: Holder) -> str | None:
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
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= since + 2.0  # a process started after the lock was taken reuses a dead holder's pid


LOCK_NAME = "pimm_fn.lock"


_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


@attrs.frozen
class Lock:
    """What taking ``save_dir``'s lock came to, the same on every rank: taken (``holder``) or refused (``refusal``).

    ``mine`` is true on the rank that took it (rank 0): the only one that releases it.
    """

    path: storage.Location | None
    holder: Holder | None = None
    refusal: SaveDirLockError | None = None
    mine: bool = False

    def settle(self, *, writes: bool) -> "Lock":
        """The lock as the run needs it: raises the refusal when it will write, released when it will not."""
        if writes and self.refusal is not None:
            raise self.refusal
        if not writes:
            self.release()
            return attrs.evolve(self, holder=None, mine=False)
        return self

    @contextlib.contextmanager
    def released_on_error(self):
        """Release the lock when building the run fails: a refused resume leaves ``save_dir`` as it was."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Remove the lock file if this run still holds it (idempotent; a no-op on the other ranks)."""
        if not self.mine or self.holder is None or self.path is None:
            return
        try:
            if read_holder(self.path) == self.holder:
                self.path.unlink()
        except (OSError, ValueError):
            pass  # gone already, or taken over: not ours to remove
        except Exception:  # noqa: BLE001 - a store's client raises its own (an endpoint gone): the lock stays, as after a crash
            if not storage.is_store(self.path):
                raise


def release_when_collected(lock: Lock) -> None:
    """``lock.release()`` for a run collected, or left at exit, without finishing: bounded on a store.

    On a local disk the release is immediate. On a store it runs in a
    thread, waited for ``_COLLECTED_RELEASE_S`` seconds at most: an
    endpoint that went away never stalls the collection that dropped the
    run (or the interpreter's exit). Past the bound the lock file stays, as
    after a crash, and the release may still finish in the background.
    """
    if lock.path is None or not storage.is_store(lock.path):
        return lock.release()
    releasing = threading.Thread(target=lock.release, name="pimm_fn-lock-release", daemon=True)
    releasing.start()
    releasing.join(_COLLECTED_RELEASE_S)


def take(save_dir, *, say, name: str = LOCK_NAME) -> Lock:
    """Take ``save_dir``'s lock on rank 0 and tell every rank how that went (collective; ``None``: no lock).

    ``name``: the lock file's (the replica groups of a fault-tolerant run share
    ``save_dir``, each under a lock of its own).

    Raises:
        SaveDirLockError: on every rank, when another run holds it: before
            this run reads or writes anything there. On read-only storage
            the :class:`Lock` carries the refusal instead, raised by
            :meth:`Lock.settle` when the run turns out to write.
    """
    if save_dir is None:
        return Lock(None)
    path = storage.location(save_dir) / name
    shared = dist.run_on_main(lambda: _attempt(path, say))  # an OS error of rank 0's raised on every rank
    if isinstance(shared, SaveDirLockError):
        if not shared.read_only:
            raise shared
        return Lock(path, refusal=shared)
    return Lock(path, holder=shared, mine=dist.is_main())


def _attempt(path: storage.Location, say) -> Holder | SaveDirLockError:
    me = Holder(socket.gethostname(), os.getpid(), time.time(), uuid.uuid4().hex)
    for _ in range(5):  # each round loses only to another taker that won
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _create(path, me)
            return me
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno in _READ_ONLY:
                return _read_only(path, exc)
            raise
        try:
            held = read_holder(path)
        except FileNotFoundError:
            continue  # released meanwhile: try again
        except ValueError:
            held = None  # unreadable: a taker killed between creating and writing it, or writing it now
        except OSError as exc:  # a FIFO, a link, a directory or another user's file: no taker of ours made it
            return _unreadable(path, exc)
        why = stale_reason(path, held, me)
        if why is None:
            return _busy(path, held)
        try:
            if not _set_aside(path, held):
                continue
        except OSError as exc:
            if exc.errno in _READ_ONLY:
                return _read_only(path, exc)
            raise
        if why:
            say(f"took over the lock of {path.parent}: {why}")
    return _busy(path, None)


def _create(path: storage.Location, holder: Holder) -> None:
    """Write ``path`` holding ``holder``, atomically refused (``FileExistsError``) when it exists."""
    if storage.is_store(path):
        _create_stored(path, json.dumps(attrs.asdict(holder)).encode())
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(fd, json.dumps(attrs.asdict(holder)).encode())  # no fsync: a crash that loses it killed its holder
    finally:
        os.close(fd)


def _create_stored(path: storage.StorePath, text: bytes) -> None:
    """:func:`_create` on a store: its exclusive create where it has one, else written when absent and read back."""
    try:
        with path.open("xb") as f:
            f.write(text)
        return
    except (ValueError, NotImplementedError, TypeError):  # a FileExistsError (held) goes up
        pass  # no exclusive create on this store: the best effort the module says
    if path.exists():
        raise FileExistsError(str(path))
    path.write_bytes(text)
    if path.read_bytes() != text:
        raise FileExistsError(str(path))


def _set_aside(path: storage.Location, held: Holder | None) -> bool:
    """Remove the stale lock ``held`` names, unless another taker replaced it meanwhile (then ``False``)."""
    if storage.is_store(path):  # no rename on a store: read again and remove (the best effort above)
        try:
            if read_holder(path) != held:
                return False
        except ValueError:
            if held is not None:
                return False
        path.unlink(missing_ok=True)
        return True
    aside = path.with_name(f"{path.name}.stale-{uuid.uuid4().hex[:12]}")
    try:
        os.rename(path, aside)  # atomic: of several takers, one moves this file
    except FileNotFoundError:
        return False
    try:
        moved = read_holder(aside)
    except (OSError, ValueError):
        moved = None
    if moved != held:  # a fresh lock, taken between our read and our rename: put it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        os.unlink(aside)
        return False
    os.unlink(aside)
    return True


def _busy(path: storage.Location, held: Holder | None) -> SaveDirLockError:
    who = f"another run ({held})" if held is not None else "another run (its lock file is being written)"
    gone = f"if that run is no longer running (on another host it cannot be checked from here), delete {path}"
    return SaveDirLockError(
        f"save_dir {str(path.parent)!r} is in use by {who}; its lock file is {path}. Two runs writing one "
        f"save_dir destroy each other's checkpoints, so this run wrote nothing. Wait for that run to end (or stop "
        f"it) and pass resume='auto', or choose another save_dir; {gone}",
        held,
    )


def _unreadable(path: storage.Location, exc: OSError) -> SaveDirLockError:
    """The refusal for a lock file that cannot be read: never taken over, since its holder cannot be told."""
    if isinstance(exc, files.NotRegularFileError):
        why = f"{exc.strerror}, which no pimm_fn run leaves there"
    else:
        why = f"cannot be read ({exc.strerror or exc}), so whether its run still holds it cannot be told"
    return SaveDirLockError(
        f"save_dir {str(path.parent)!r} cannot be locked: its lock file {path} {why}; this run wrote nothing. "
        f"If no run is using this save_dir, delete {path} and run again, or choose another save_dir",
    )


def _read_only(path: storage.Location, exc: OSError) -> SaveDirLockError:
    return SaveDirLockError(
        f"save_dir {str(path.parent)!r} cannot be written ({exc.strerror or exc}: {path}), and this run would train "
        f"and write checkpoints and logs there. Train on writable storage (copy the run there and pass the copy as "
        f"save_dir); a finished run, with nothing left to train, opens here without writing",
        read_only=True,
    )
