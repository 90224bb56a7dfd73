"""``verify``: is each checkpoint complete, does every byte of it read back, do sizes and checksums match.

Every tensor is really read: the weights file with ``torch.load``, the
trainer part through DCP in batches of bounded size, then unpacked into the
values a resume would build. When the marker records the files (``"files":
{relative path: {"size", "sha256"}}``), each size and digest is checked too.

A local snapshot (``iter_<step>``) is hard links to the files of the
``last`` it was copied from: one file under two names, so damage to one is
damage to both. A damaged file with other links says which entries beside
it hold the same file (``shared``), and how many links are elsewhere.
"""

from __future__ import annotations

import os
import pathlib
import stat

import attrs
from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn.checkpoint import storage
from pimm_fn.checkpoint.errors import CheckpointError
from pimm_fn.checkpoint.inspection import is_marked, read_back
from pimm_fn.cli import NOT_FOUND, OK, Failure, emit, location
from pimm_fn.cli._show import Entry, entries, entry_of, is_checkpoint_dir, model_dir_of, reason, some_damaged

__all__ = ["Finding", "check", "verify"]


@attrs.frozen
class Finding:
    """What verifying one entry found: ``problems`` make it damaged; ``notes`` say what was checked.

    ``status``: ``"ok"``, ``"note"`` (a leftover that is no checkpoint), ``"incomplete"`` (never
    finished: no marker, or a save in progress) or ``"damaged"`` (finished, then changed or lost).
    ``shared``: the entries beside it that hold its damaged file too (hard links), and a
    ``"<n> link(s) elsewhere"`` for links outside them.
    """

    name: str
    kind: str
    problems: tuple = ()
    notes: tuple = ()
    incomplete: bool = False
    shared: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def status(self) -> str:
        if self.problems:
            return "incomplete" if self.incomplete else "damaged"
        return "note" if self.kind in ("unfinished", "retired") else "ok"


def check(entry: Entry, *, named: bool = False) -> Finding:
    """Verify one entry; never raises for a damaged checkpoint (the finding says what is wrong).

    An unfinished save is a note in a directory's listing, but a problem when ``named`` on its own.
    """
    if entry.kind == "unfinished":
        text = "unfinished save or removal: never read, the next save removes it"
        return Finding(entry.name, entry.kind, (text,) if named else (), () if named else (text,), incomplete=True)
    try:
        problems, notes = read_back(entry.path, best=entry.kind == "best")
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - any failure to read is the finding
        if entry.kind == "retired" and not named:
            return Finding(entry.name, entry.kind, notes=(f"leftover of an interrupted publish: {reason(exc)}",))
        unmarked = not is_marked(entry.path)
        damaged = exc.file if isinstance(exc, CheckpointError) and entry.path.is_dir() else None
        return Finding(
            entry.name, entry.kind, problems=(reason(exc),), incomplete=unmarked, shared=shared_with(entry, damaged)
        )
    return Finding(entry.name, entry.kind, tuple(problems), tuple(notes), shared=shared_with(entry) if problems else ())


def _links(path: pathlib.Path) -> dict:
    """``{(device, inode): link count}`` of the regular files at ``path`` (itself, or below it), no link followed."""
    found = {}
    for here, _, names in os.walk(path) if path.is_dir() else [(path.parent, (), [path.name])]:
        for name in names:
            try:
                info = os.lstat(os.path.join(here, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[(info.st_dev, info.st_ino)] = info.st_nlink
    return found


def shared_with(entry: Entry, file: str | None = None) -> tuple:
    """The entries beside ``entry`` holding its damaged ``file`` (else any of its files) as a hard link.

    A snapshot is hard links to its ``last``'s files, so a file damaged in
    one is damaged in the other. Links outside those entries are counted.
    Local checkpoints only (a store has no links).
    """
    if storage.is_store(entry.path):
        return ()
    mine = _links(entry.path / file if file and (entry.path / file).exists() else entry.path)
    linked = {key: count for key, count in mine.items() if count > 1}
    if not linked:
        return ()
    names, seen = [], dict.fromkeys(linked, 1)
    for other in entries(entry.path.parent):
        if other.path == entry.path:
            continue
        assert not storage.is_store(other.path)  # beside entry's, on the same local file system
        common = linked.keys() & _links(other.path).keys()
        if common:
            names.append(other.name)
            for key in common:
                seen[key] += 1
    elsewhere = max(linked[key] - seen[key] for key in linked)
    return (*names, f"{elsewhere} link(s) elsewhere") if elsewhere > 0 else tuple(names)


def _targets(path: storage.Location) -> tuple[list[Entry], bool]:
    """The entries to verify, and whether ``path`` named one itself."""
    if not path.exists():
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a checkpoint, a save_dir or a model_dir")
    named = entry_of(path)
    if named is not None:
        return [named], True
    if path.is_file() or is_checkpoint_dir(path):
        return [Entry(path, "checkpoint")], True
    found = entries(model_dir_of(path, "verify"))
    if not found:
        raise Failure(NOT_FOUND, f"no checkpoint under {str(path)!r}; pass a checkpoint, a save_dir or a model_dir")
    return found, False


def _shared_text(shared: tuple) -> str:
    """What a damaged file's other links mean, for the text output."""
    return (
        f"shares the damaged file(s) with {', '.join(shared)} (hard links: a snapshot and the last it was "
        f"copied from are the same files), so the damage is theirs too"
    )


def _text(findings: list[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        said = [*(f.problems or f.notes), *([_shared_text(f.shared)] if f.shared else [])]
        lines.append(f"{f.status.upper():<10} {f.name.ljust(width)}  " + "; ".join(said))
    return "\n".join(lines)


def verify(args) -> int:
    """Verify a checkpoint, or every one under a save_dir/model_dir; exit 1 when any is damaged or incomplete."""
    targets, named = _targets(location(args.path))
    findings = [check(e, named=named) for e in targets]
    data = [
        {
            "name": f.name,
            "kind": f.kind,
            "status": f.status,
            "problems": list(f.problems),
            "notes": list(f.notes),
            "shared_with": list(f.shared),
        }
        for f in findings
    ]
    emit({"path": args.path, "ok": all(f.ok for f in findings), "entries": data}, _text(findings), args.json)
    damaged = [f.name for f in findings if not f.ok]
    if damaged:
        raise some_damaged(damaged, len(findings))
    return OK
