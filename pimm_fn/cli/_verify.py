"""``verify``: is each checkpoint complete, does every byte of it read back, do sizes and checksums match.

Every tensor is really read: the weights file with ``torch.load``, the
trainer part through DCP in batches of bounded size, then unpacked into the
values a resume would build. When the marker records the files (``"files":
{relative path: {"size", "sha256"}}``), each size and digest is checked too.
"""

from __future__ import annotations

import pathlib

import attrs
from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn.checkpoint.inspection import is_marked, read_back
from pimm_fn.cli import DAMAGED, NOT_FOUND, OK, Failure, emit, location
from pimm_fn.cli._listing import Entry, entries, entry_of, is_checkpoint_dir, model_dir_of, reason

__all__ = ["Finding", "check", "verify"]


@attrs.frozen
class Finding:
    """What verifying one entry found: ``problems`` make it damaged; ``notes`` say what was checked.

    ``status``: ``"ok"``, ``"note"`` (a leftover that is no checkpoint), ``"incomplete"`` (never
    finished: no marker, or a save in progress) or ``"damaged"`` (finished, then changed or lost).
    """

    name: str
    kind: str
    problems: tuple = ()
    notes: tuple = ()
    incomplete: bool = False

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
        return Finding(entry.name, entry.kind, problems=(reason(exc),), incomplete=unmarked)
    return Finding(entry.name, entry.kind, tuple(problems), tuple(notes))


def _targets(path: pathlib.Path) -> tuple[list[Entry], bool]:
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


def _text(findings: list[Finding]) -> str:
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{f.status.upper():<10} {f.name.ljust(width)}  " + "; ".join(f.problems or f.notes))
    return "\n".join(lines)


def verify(args) -> int:
    """Verify a checkpoint, or every one under a save_dir/model_dir; exit 1 when any is damaged or incomplete."""
    targets, named = _targets(location(args.path))
    findings = [check(e, named=named) for e in targets]
    data = [{"name": f.name, "kind": f.kind, "status": f.status, "problems": list(f.problems), "notes": list(f.notes)}
            for f in findings]
    emit({"path": args.path, "ok": all(f.ok for f in findings), "entries": data}, _text(findings), args.json)
    damaged = [f.name for f in findings if not f.ok]
    if damaged:
        raise Failure(DAMAGED, f"{len(damaged)} of {len(findings)} damaged or incomplete: {', '.join(damaged)}")
    return OK
