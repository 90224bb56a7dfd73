"""Where ``Log`` records go: loggers with a lifecycle, ``log.jsonl`` and CSV among them.

A logger is any object with three methods, called on the main rank only:

``open(opening)``  the run starts, or goes on after a ``close``; ``opening``
                   (an :class:`Opening`) says where it writes (``save_dir``),
                   the step it starts from, whether that is a resume
                   (``resumed``: drop what was written past ``step``) or a
                   continuation (``continued``: append). A fresh run never
                   appends to an earlier run's file: it sets it aside.
``write(record)``  one ``Log`` effect: ``step``, ``kind`` (``"train"``,
                   ``"epoch"``, ``"eval/<name>"``) and ``values``.
``close()``        at the end of training and on an error; the next record
                   opens it again (``continued``), as a notebook's run goes on.

``loop(loggers=[...])`` takes them; the run's own :class:`JsonlLogger`
(``save_dir/log.jsonl``, the source ``run.history`` is rebuilt from on
resume) is always among them when there is a ``save_dir``. Each is opened
once when the run is built, and kept open: a record is one write and a
flush, not a file opened per record (a file of its own, a :class:`LogFile`,
is closed too when a run is dropped unfinished). ``pimm_fn.runtime.handlers.logs`` feeds them;
``CSVLogger`` lives in ``pimm_fn.runtime.logs.loggers``, TensorBoard and MLflow
loggers in ``pimm_fn.runtime.logs.trackers``, W&B's in ``pimm_fn.runtime.logs.trackers``.

``log.jsonl`` line by line: a record as a line, a line read back, and damaged lines set aside.

A record is one line, ``{"step": 10, "kind": "train", ..., "loss": 0.38}``
(``pimm_fn.core.effects.row``), non-finite floats written as the strings
``"nan"``, ``"inf"``, ``"-inf"`` and read back as floats. A line that is
not UTF-8, not a JSON object, or lacks an integer ``step`` or a string
``kind`` is damaged: a disk error, a file edited by hand, or the last line
of a run killed mid-write. Reading skips it (``read_records``: read only,
what ``run.history`` is rebuilt from). A resume (``keep_upto``) keeps the
good records up to its step, in order, and moves the damaged lines, as
they were, to the end of ``log.jsonl.damaged`` (appended: an earlier
resume's are kept), saying so in one line: a damaged log never blocks a
resume and loses nothing.

``CSVLogger``: a run's records as comma-separated values, a column per name, following the logger lifecycle.

The lifecycle (open, write, close; a resume drops the rows past its step,
a fresh run sets an earlier file aside) is ``pimm_fn.runtime.logs.loggers``'.
"""

import csv
import json
import math
import os
import weakref
from pathlib import Path
from typing import Callable

import attrs

from pimm_fn.checkpoint import storage
from pimm_fn.core import effects, untrusted_json
from pimm_fn.core.effects import Log, row, unrow

__all__ = [
    "line_of",
    "record_of",
    "read_records",
    "keep_upto",
    "DAMAGED",
    "Opening",
    "JsonlLogger",
    "LogFile",
    "check_loggers",
    "run_loggers",
    "resolve_path",
    "local_path",
    "keep_lines",
    "set_aside",
    "LOG_NAME",
    "CSVLogger",
]


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
        found = untrusted_json.loads(line.decode("utf-8"))
        if found.__class__ is not dict:  # JSON, but not an object
            return None
        step, kind, values = unrow(found)
    except (ValueError, KeyError):  # not UTF-8 (a ValueError), not JSON, a field missing
        return None
    if step.__class__ is not int or kind.__class__ is not str:
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
        say(
            f"{path.name}: {_count(damaged)} damaged (not UTF-8, not a JSON record, or cut short): moved as they "
            f"were to {path.name}{DAMAGED}; the good records are kept in order"
        )
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


LOG_NAME = "log.jsonl"  # the run's own record in save_dir


@attrs.frozen
class Opening:
    """What a logger learns when it opens: where the run writes and where it starts."""

    save_dir: Path | None
    step: int = 0
    resumed: bool = False  # the run restored a checkpoint of ``step``: records past it are gone
    continued: bool = False  # the same run after a close: append
    say: Callable = print  # a console line on the main rank (what a logger set aside or dropped)
    store: str | None = None  # the run's save_dir when it is a URL: logs stay local, so ``save_dir`` is None
    history: object = None  # a resumed run's records up to ``step`` (``run.history``): what a tracker may lack


class LogFile:
    """A logger's file open to append, closed by ``close()``, or when the logger goes unclosed with its run.

    ``loop()`` opens the loggers as it builds the run, and a run keeps them
    open between ``run()`` calls: a run built and never run, or left half-way
    and dropped, would leave its file to the garbage collector (a
    ``ResourceWarning``). Its file is closed as this object is collected.

    Args:
        path: the file, created when missing.
        **options: ``open``'s (``newline=""`` for csv).
    """

    def __init__(self, path, **options):
        file = open(path, "a", **options)
        self.write, self.flush = file.write, file.flush
        self.close = weakref.finalize(self, file.close)  # close(): now, once; else when this object is collected


def set_aside(path: Path, say) -> None:
    """Rename a non-empty ``path`` left by an earlier run to the first free ``<stem>.<n><suffix>``, and say so."""
    if not path.exists() or (path.stat().st_size == 0 if path.is_file() else not any(path.iterdir())):
        return  # nothing an earlier run wrote
    n = 1
    while (aside := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    path.rename(aside)
    say(f"a fresh run: the earlier run's {path.name} is kept as {aside.name}")


def keep_lines(path: Path, keep, say, what: str) -> None:
    """Rewrite ``path`` (atomically) with only the lines ``keep(line)`` accepts; say how many went."""
    if not path.is_file():
        return
    with open(path, newline="") as file:  # line endings as written (csv writes \r\n)
        lines = file.read().splitlines(keepends=True)
    kept = [line for line in lines if keep(line)]
    if len(kept) == len(lines):
        return
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "w", newline="") as file:
        file.write("".join(line if line.endswith("\n") else line + "\n" for line in kept))
    os.replace(temp, path)
    say(f"{path.name}: dropped {len(lines) - len(kept)} {what}")


class JsonlLogger:
    """JSON lines, one record a line: ``{"step": 10, "kind": "train", "loss": 0.38, ...}``.

    Non-finite floats are written as the strings ``"nan"``, ``"inf"``,
    ``"-inf"``. On resume the records past the resumed step are dropped
    and damaged lines (not UTF-8, not JSON, cut short) are moved to
    ``log.jsonl.damaged`` (``pimm_fn.runtime.logs.loggers``); a fresh run sets an
    earlier run's file aside (``log.1.jsonl``).

    Args:
        path: the file; default ``save_dir/log.jsonl``.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = local_path(self, path)
        self._file: LogFile | None = None

    def open(self, opening: Opening) -> None:
        path = resolve_path(self, self.path, opening.save_dir, LOG_NAME, store=opening.store)
        if opening.resumed and not opening.continued:
            keep_upto(path, opening.step, opening.say)  # and damaged lines moved to log.jsonl.damaged
        elif not opening.continued:
            set_aside(path, opening.say)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = LogFile(path)

    def write(self, record: Log) -> None:
        assert self._file is not None  # open: a run writes between open() and close()
        self._file.write(line_of(record))
        self._file.flush()  # on disk at once: a killed run keeps every record it wrote

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self):
        return f"JsonlLogger({str(self.path)!r})" if self.path is not None else "JsonlLogger()"


def local_path(logger, path) -> Path | None:
    """A logger's file as a local ``Path``; a URL is refused: logs stay local (object stores do not append)."""
    if storage.is_url(path) or storage.is_store(path):
        raise ValueError(
            f"{type(logger).__name__}: {str(path)!r} is a URL, and log files stay local (an object store "
            f"cannot append); pass a local path (checkpoints may still go to the store via save_dir)"
        )
    return Path(path) if path is not None else None


def resolve_path(logger, path, save_dir, default: str, *, store: str | None = None) -> Path:
    """``path`` when the logger was given one, else ``save_dir/default``; a ``ValueError`` saying so without either.

    ``store``: the run's ``save_dir`` when it is a URL (``Opening.store``), said in the error: logs stay local.
    """
    if path is not None:
        return path
    if save_dir is None and store is not None:
        raise ValueError(
            f"{type(logger).__name__}() writes into save_dir by default, but this run's save_dir is "
            f"{store!r}, on an object store, and log files stay local (an object store cannot append): "
            f"pass the logger a local directory, e.g. {type(logger).__name__}({default!r})"
        )
    if save_dir is None:
        raise ValueError(
            f"{type(logger).__name__}() writes into save_dir by default, and this run has none: "
            f"pass save_dir= to loop(), or a path to the logger"
        )
    return Path(save_dir) / default


def check_loggers(loggers, log_reduce=None) -> tuple:
    """``loggers`` as a tuple, refused with advice when one lacks ``open``, ``write`` or ``close``.

    Raises:
        TypeError: not a list or tuple, or a logger without one of the methods.
        ValueError: the same logger twice; ``log_reduce`` neither ``None`` nor ``"mean"``.
    """
    if log_reduce not in (None, "mean"):
        raise ValueError(f"loop: 'log_reduce' must be None (rank 0's outputs) or 'mean' (got {log_reduce!r})")
    if not isinstance(loggers, (list, tuple)):
        raise TypeError(
            f"loop: 'loggers' must be a list of loggers, e.g. [pimm_fn.CSVLogger()] (got {type(loggers).__name__})"
        )
    for logger in loggers:
        missing = [m for m in ("open", "write", "close") if not callable(getattr(logger, m, None))]
        if isinstance(logger, type) or missing:
            made = f" (the class itself: make one, {logger.__name__}())" if isinstance(logger, type) else ""
            raise TypeError(
                f"loop: logger {logger!r:.80} needs the methods open(opening), write(record) and "
                f"close(){made}; missing: {', '.join(missing) or 'an instance'}"
            )
    if len({id(logger) for logger in loggers}) < len(loggers):
        raise ValueError("loop: 'loggers' holds the same logger twice: each writes once per record")
    return tuple(loggers)


def run_loggers(save_dir, loggers) -> tuple:
    """The loggers of a run: ``loggers``, after the run's own ``save_dir/log.jsonl`` unless they hold a JSONL one.

    A ``save_dir`` on an fsspec store (a URL) gets no ``log.jsonl``: logs stay local (pass a ``JsonlLogger(path)``).
    """
    if storage.is_store(save_dir) or storage.is_url(save_dir):
        save_dir = None
    own = save_dir is not None and not any(
        isinstance(logger, JsonlLogger) and logger.path in (None, Path(save_dir) / LOG_NAME) for logger in loggers
    )
    return ((JsonlLogger(),) if own else ()) + tuple(loggers)


class CSVLogger:
    """Comma-separated values, one row per record: ``step,kind,`` then every name logged.

    A name first logged mid-run adds a column: the file is rewritten with
    it (a few times a run at most). Empty cells where a record lacks a name.

    Args:
        path: the file; default ``save_dir/log.csv``.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = local_path(self, path)
        self._file: LogFile | None = None
        self._columns: list = []
        self._where: Path | None = None

    def open(self, opening: Opening) -> None:
        path = self._where = resolve_path(self, self.path, opening.save_dir, "log.csv", store=opening.store)
        if opening.resumed and not opening.continued:
            header = _header(path)
            keep_lines(
                path,
                lambda line: line == header or _step_of_csv(line) <= opening.step,
                opening.say,
                f"row(s) after step {opening.step}, where the run resumed",
            )
        elif not opening.continued:
            set_aside(path, opening.say)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = _header(path)  # a resumed or continued file keeps its columns
        self._columns = next(csv.reader([header])) if header else []
        self._file = LogFile(path, newline="")

    def write(self, record: Log) -> None:
        row = effects.row(record.step, record.kind, record.values)
        new = [name for name in row if name not in self._columns]
        if new:
            self._widen(self._columns + new)
        assert self._file is not None  # open: a run writes between open() and close()
        csv.DictWriter(self._file, self._columns).writerow(row)
        self._file.flush()

    def _widen(self, columns: list) -> None:
        """Rewrite the file under the header ``columns`` (a new name came)."""
        where = self._where
        assert self._file is not None and where is not None  # open: a run writes between open() and close()
        self._file.close()
        with open(where, newline="") as file:
            rows = list(csv.DictReader(file))
        temp = where.with_name(where.name + ".tmp")
        with open(temp, "w", newline="") as file:
            writer = csv.DictWriter(file, columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temp, where)
        self._columns = columns
        self._file = LogFile(where, newline="")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self):
        return f"CSVLogger({str(self.path)!r})" if self.path is not None else "CSVLogger()"


def _header(path: Path) -> str:
    if not path.is_file():
        return ""
    with open(path, newline="") as file:
        return file.readline()


def _step_of_csv(line: str) -> float:
    try:
        return int(line.split(",", 1)[0])
    except ValueError:
        return math.inf
