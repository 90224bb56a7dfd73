"""Where ``Log`` records go: loggers with a lifecycle, and the run's ``Logs`` that feeds them.

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
is closed too when a run is dropped unfinished). ``pimm_fn.runtime.log_feed`` feeds them;
``CSVLogger`` lives in ``pimm_fn.runtime.csv_logger``, TensorBoard and MLflow
loggers in ``pimm_fn.runtime.trackers``, W&B's in ``pimm_fn.runtime.wandb_logger``.
"""

import os
import weakref
from pathlib import Path
from typing import Callable

import attrs

from pimm_fn.checkpoint import storage
from pimm_fn.core.effects import Log
from pimm_fn.runtime.jsonl import keep_upto, line_of

__all__ = [
    "Opening", "JsonlLogger", "LogFile", "check_loggers", "run_loggers", "resolve_path", "local_path", "keep_lines",
    "set_aside", "LOG_NAME",
]

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
    ``log.jsonl.damaged`` (``pimm_fn.runtime.jsonl``); a fresh run sets an
    earlier run's file aside (``log.1.jsonl``).

    Args:
        path: the file; default ``save_dir/log.jsonl``.
    """

    def __init__(self, path=None):
        self.path = local_path(self, path)
        self._file = None

    def open(self, opening: Opening) -> None:
        path = resolve_path(self, self.path, opening.save_dir, LOG_NAME, store=opening.store)
        if opening.resumed and not opening.continued:
            keep_upto(path, opening.step, opening.say)  # and damaged lines moved to log.jsonl.damaged
        elif not opening.continued:
            set_aside(path, opening.say)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = LogFile(path)

    def write(self, record: Log) -> None:
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
        raise ValueError(f"{type(logger).__name__}: {str(path)!r} is a URL, and log files stay local (an object store "
                         f"cannot append); pass a local path (checkpoints may still go to the store via save_dir)")
    return Path(path) if path is not None else None


def resolve_path(logger, path, save_dir, default: str, *, store: str | None = None) -> Path:
    """``path`` when the logger was given one, else ``save_dir/default``; a ``ValueError`` saying so without either.

    ``store``: the run's ``save_dir`` when it is a URL (``Opening.store``), said in the error: logs stay local.
    """
    if path is not None:
        return path
    if save_dir is None and store is not None:
        raise ValueError(f"{type(logger).__name__}() writes into save_dir by default, but this run's save_dir is "
                         f"{store!r}, on an object store, and log files stay local (an object store cannot append): "
                         f"pass the logger a local directory, e.g. {type(logger).__name__}({default!r})")
    if save_dir is None:
        raise ValueError(f"{type(logger).__name__}() writes into save_dir by default, and this run has none: "
                         f"pass save_dir= to loop(), or a path to the logger")
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
        raise TypeError(f"loop: 'loggers' must be a list of loggers, e.g. [pimm_fn.CSVLogger()] "
                        f"(got {type(loggers).__name__})")
    for logger in loggers:
        missing = [m for m in ("open", "write", "close") if not callable(getattr(logger, m, None))]
        if isinstance(logger, type) or missing:
            made = f" (the class itself: make one, {logger.__name__}())" if isinstance(logger, type) else ""
            raise TypeError(f"loop: logger {logger!r:.80} needs the methods open(opening), write(record) and "
                            f"close(){made}; missing: {', '.join(missing) or 'an instance'}")
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
