"""``log.jsonl`` line by line: a record as a line, a line read back, and damaged lines set aside.

A record is one line, ``{"step": 10, "kind": "train", ..., "loss": 0.38}``
(``pimm_fn.core.records.row``), non-finite floats written as the strings
``"nan"``, ``"inf"``, ``"-inf"`` and read back as floats. A line that is
not UTF-8, not a JSON object, or lacks an integer ``step`` or a string
``kind`` is damaged: a disk error, a file edited by hand, or the last line
of a run killed mid-write. Reading skips it (``read_records``: read only,
what ``run.history`` is rebuilt from). A resume (``keep_upto``) keeps the
good records up to its step, in order, and moves the damaged lines, as
they were, to the end of ``log.jsonl.damaged`` (appended: an earlier
resume's are kept), saying so in one line: a damaged log never blocks a
resume and loses nothing.
"""

import json
import math
import os
from pathlib import Path

from pimm_fn.core.effects import Log
from pimm_fn.core.records import row, unrow

__all__ = ["line_of", "record_of", "read_records", "keep_upto", "DAMAGED"]

DAMAGED = ".damaged"  # the suffix of the file a resume moves damaged lines to
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how a line spells non-finite floats
_SHOWN = 5  # the line numbers a message names


def line_of(record: Log) -> str:
    """The line ``record`` is written as, newline included."""
    values = {k: v if not isinstance(v, float) or math.isfinite(v) else repr(v) for k, v in record.values.items()}
    return json.dumps(row(record.step, record.kind, values)) + "\n"


def record_of(line: bytes) -> tuple | None:
    """``(step, kind, values)`` of one line (non-finite floats restored); ``None`` when it is damaged."""
    try:
        found = json.loads(line.decode("utf-8"))
        step, kind, values = unrow(found) if found.__class__ is dict else (None, None, None)
    except (ValueError, KeyError, RecursionError):  # not UTF-8 (a ValueError), not JSON, a field missing
        return None
    if step.__class__ is not int or kind.__class__ is not str:  # also: not an object
        return None
    return step, kind, {k: _NONFINITE.get(v, v) if isinstance(v, str) else v for k, v in values.items()}


def _lines(data: bytes) -> list:
    """``[(line number, line)]`` of a file's ``data``, without newlines; blank ones (they hold nothing) left out."""
    return [(n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]


def read_records(path) -> list:
    """The good records of ``path`` in order, as ``(step, kind, values)``; none without a file. Writes nothing."""
    path = Path(path)
    if not path.is_file():
        return []
    return [record for record in (record_of(line) for _, line in _lines(path.read_bytes())) if record is not None]


def keep_upto(path, step: int, say=print) -> None:
    """Keep the good records of ``path`` up to ``step``; move its damaged lines to ``<path>.damaged``; say each.

    The damaged lines are appended (and flushed to disk) before ``path`` is
    replaced, atomically, so a crash in between leaves them in both files,
    never in neither.
    """
    path = Path(path)
    if not path.is_file():
        return
    data = path.read_bytes()
    lines = _lines(data)
    records = [(n, line, record_of(line)) for n, line in lines]
    damaged = [(n, line) for n, line, record in records if record is None]
    kept = [line for _, line, record in records if record is not None and record[0] <= step]
    past = len(lines) - len(damaged) - len(kept)
    if damaged:
        _set_aside(path, [line for _, line in damaged])
    if damaged or past or data[-1:] not in (b"", b"\n"):  # a last line without its newline: the next is not glued to it
        temp = path.with_name(path.name + ".tmp")
        _write(temp, b"".join(line + b"\n" for line in kept), "wb")
        os.replace(temp, path)
    if damaged:
        say(f"{path.name}: {_count(damaged)} damaged (not UTF-8, not a JSON record, or cut short): moved as they "
            f"were to {path.name}{DAMAGED}; the good records are kept in order")
    if past:
        say(f"{path.name}: dropped {past} record(s) after step {step}, where the run resumed")


def _set_aside(path: Path, lines: list) -> None:
    _write(path.with_name(path.name + DAMAGED), b"".join(line + b"\n" for line in lines), "ab")


def _write(path: Path, data: bytes, mode: str) -> None:
    """``data`` written (``"wb"``) or appended (``"ab"``), on disk before this returns."""
    with open(path, mode) as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _count(damaged: list) -> str:
    """``"3 lines (2, 4, 9)"``, ``"1 line (7)"``; the first few numbers of many."""
    numbers = [str(n) for n, _ in damaged[:_SHOWN]] + (["..."] if len(damaged) > _SHOWN else [])
    return f"{len(damaged)} line{'s' if len(damaged) > 1 else ''} ({', '.join(numbers)})"
