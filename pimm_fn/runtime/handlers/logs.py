"""The handler of ``Log`` (``pimm_fn.hooks.logs``), and the run's logs it writes to: its loggers, ``run.history``,
its clock.

One ``Logs`` per run, in ``Context.logs``. The main rank opens the loggers
when the run is built (``start``: a resumed run's history is read back from
``log.jsonl`` up to the resumed step), hands each record to them and to the
history, and closes them at the end of training and on an error; the next
record opens them again, appending. Its clock gives each console line the
time since the start and, for training records, ms/step and samples/s
since the previous one. With several ranks, ``over_ranks`` says whose
training outputs a record holds, rank 0's or (``log_reduce="mean"``) their
mean over the ranks (two small all-reduces per training record: the first
checks that every rank logged a record of the same step, kind and names,
so that ranks logging different outputs all fail with one clear error
instead of pairing values of other names or waiting on each other).
"""

import contextlib
import time
from pathlib import Path
from typing import Any

import attrs

from pimm_fn import dist
from pimm_fn.checkpoint import storage
from pimm_fn.core.effects import Log
from pimm_fn.runtime.engine.guard import digest_of
from pimm_fn.runtime.errors import CollectiveDivergenceError  # the guard's digest: 63 bits, an int64
from pimm_fn.runtime.logs.history import POSITION, History
from pimm_fn.runtime.logs.loggers import LOG_NAME, Opening, run_loggers

__all__ = ["log", "RecordedLog", "Logs", "clock", "mean_over_ranks", "same_on_every_rank"]

_TRAINING = ("train", "epoch")  # the kinds holding training outputs: what log_reduce averages over ranks


@contextlib.contextmanager
def clock(logs: "Logs | None"):
    """The logs' clock runs inside ``run()`` and ``step()`` only: their pace counts training time."""
    if logs is None:
        yield
        return
    logs.go()
    try:
        yield
    finally:
        logs.hold()


class Logs:
    """The run's loggers, history and clock; see the module docstring. Only the main rank opens or writes."""

    def __init__(self, loggers=(), *, save_dir=None, say=print, rank=0, world_size=1, reduce=None):
        self.loggers = tuple(loggers)
        self.history = History()
        # A save_dir on an fsspec store keeps no log file (an object store cannot append): logs stay local.
        self.store = str(save_dir) if storage.is_store(save_dir) or storage.is_url(save_dir) else None
        self.save_dir = None if self.store is not None else save_dir
        self.say, self.rank, self.world_size, self.reduce = say, rank, world_size, reduce
        self._opening = Opening(self.save_dir, say=say, store=self.store)
        self._open = False
        self.written = 0  # records kept so far (a custom Log handler's wrapper tells whether it kept one)
        self._start = self._last = (time.monotonic(), 0, 0)  # (time, global step, samples seen)
        self._held = None  # when the clock stopped: run() or step() returned

    def start(self, progress, *, resumed: bool, writes: bool = True) -> None:
        """Begin the run at ``progress``: rebuild the history of a resumed run, open the loggers.

        A run that will not write (``writes=False``: finished, opened to be
        read, perhaps on read-only storage) only rebuilds its history.
        """
        self._start = self._last = (time.monotonic(), progress.global_step, progress.samples_seen)
        if self.rank != 0:
            return
        if resumed and self.save_dir is not None:
            self.history = History.from_jsonl(Path(self.save_dir) / LOG_NAME, upto=progress.global_step)
        if not writes:
            return
        self._opening = Opening(
            self.save_dir,
            progress.global_step,
            resumed,
            say=self.say,
            store=self.store,
            history=self.history if resumed else None,
        )
        self._open_all(self._opening)

    def _open_all(self, opening: Opening) -> None:
        for logger in self.loggers:
            logger.open(opening)
        self._open = True

    def write(self, record: Log) -> None:
        """Hand ``record`` to every logger (opening them again after a close), then to the history."""
        if not self._open:
            self._open_all(attrs.evolve(self._opening, continued=True))
        for logger in self.loggers:
            logger.write(record)
        self.history.append(record.step, record.kind, record.values)
        self.written += 1

    def close(self) -> None:
        """Close every logger (all are tried); the first failure is raised after."""
        if not self._open:
            return
        self._open = False
        failed = []
        for logger in self.loggers:
            try:
                logger.close()
            except Exception as error:  # noqa: BLE001 - the others still close
                failed.append(error)
        if failed:
            raise failed[0]

    def over_ranks(self, record: Log) -> Log:
        """``record`` saying whose training outputs it holds, with several ranks: rank 0's, or their mean.

        Under ``reduce="mean"`` every rank calls it for every training record
        (on the steps that log only): one small all-reduce checks that every
        rank holds a record of the same step, kind and names, a second one
        averages the values. Position fields stay as they are.

        Raises:
            CollectiveDivergenceError: on every rank, when the ranks' records
                differ (a step function returning other outputs on some rank),
                naming each rank's record.
        """
        if self.world_size == 1 or record.kind not in _TRAINING or isinstance(record.values.get("over"), str):
            return record  # one rank, not training outputs, or already said whose (a handler called twice)
        values = dict(record.values)
        if self.reduce == "mean":
            names = sorted(k for k, v in values.items() if k not in POSITION and _number(v))
            same_on_every_rank(record.step, record.kind, names)  # else the mean below would pair other names
            if names:  # the same names on every rank, checked just above: all call, or none
                values.update(zip(names, mean_over_ranks([float(values[k]) for k in names])))
            values["over"] = f"mean of {self.world_size} ranks"
        else:
            values["over"] = "rank 0"
        return Log(record.step, record.kind, values)

    def hold(self) -> None:
        """Stop the clock as ``run()`` or ``step()`` returns: a notebook's time between cells counts in no pace."""
        self._held = time.monotonic()

    def go(self) -> None:
        """Start the clock again, where it stopped."""
        if self._held is not None:
            gap = time.monotonic() - self._held
            self._start = (self._start[0] + gap, *self._start[1:])
            self._last = (self._last[0] + gap, *self._last[1:])
            self._held = None

    def pace(self, kind: str, progress) -> str:
        """``" (12.3s, 24.1 ms/step, 332 samples/s)"``: the time since the start, and for a training record the pace.

        samples/s counts every rank's samples (this rank's times the world size).
        """
        now = time.monotonic()
        text = _duration(now - self._start[0])
        if kind in _TRAINING:
            then, step, samples = self._last
            if progress.global_step > step and now > then:
                per_step = (now - then) / (progress.global_step - step)
                rate = (progress.samples_seen - samples) * self.world_size / (now - then)
                text += f", {per_step * 1e3:.3g} ms/step" + (f", {rate:.4g} samples/s" if rate else "")
            self._last = (now, progress.global_step, progress.samples_seen)
        return f" ({text})"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def same_on_every_rank(step: int, kind: str, names: list) -> None:
    """Check, with one all-reduce (max of ``d`` and ``-d``), that every rank has a record of this step, kind and names.

    Every rank learns the same answer, so all raise together, none waits in
    the mean's all-reduce; the records are then gathered for the message.

    Raises:
        CollectiveDivergenceError: the ranks' records differ.
    """
    import torch
    import torch.distributed as td

    digest = digest_of(step, kind, tuple(names))
    device = dist.collective_device()
    extremes = torch.tensor([digest, -digest], dtype=torch.int64, device=device)
    td.all_reduce(extremes, op=td.ReduceOp.MAX)
    highest, lowest = extremes.tolist()  # one copy to the host, not one per element
    if highest == -lowest:
        return
    records: list[Any] = [None] * td.get_world_size()  # each rank's (step, kind, names), gathered
    td.all_gather_object(records, (step, kind, list(names)))
    said = "; ".join(f"rank {r}: step {s} {k!r} with {n}" for r, (s, k, n) in enumerate(records))
    raise CollectiveDivergenceError(
        f"ranks logged different training records ({said}), which log_reduce='mean' cannot average: the step "
        f"function must return the same outputs on every rank (a rank-local value: log it under the same name "
        f"everywhere, or keep it out of the outputs), or pass pimm_fn.Watching(log_reduce=None) to log rank 0's"
    )


def mean_over_ranks(values: list) -> list:
    """The mean over the ranks of the default group of each of ``values`` (one all-reduce, float64)."""
    import torch
    import torch.distributed as td

    device = dist.collective_device()
    total = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(total)
    return (total / td.get_world_size()).tolist()


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


def log(effect: Log, state, ctx) -> tuple:
    """Rank 0 hands the record to the run's loggers and history, then, with the console on, says it with the time and pace.

    Under ``loop(watching=Watching(log_reduce="mean"))`` every rank runs it (``ctx.everywhere``)
    and averages a training record over the ranks first (``Logs.over_ranks``).
    """
    logs = _logs(ctx)
    effect = logs.over_ranks(effect)
    if ctx.rank != 0:
        return ()
    logs.write(effect)
    if ctx.console:  # the line, and the pace since the last one said, only where it is shown
        fields = " ".join(f"{k}={_format(v)}" for k, v in effect.values.items())
        ctx.say(f"step {effect.step} {effect.kind}: {fields}{logs.pace(effect.kind, state.progress)}")
    return ()


def _logs(ctx) -> Logs:
    if ctx.logs is None:  # a context built by hand: the console, and save_dir's log.jsonl appended to (none on a store)
        ctx.logs = Logs(
            run_loggers(ctx.save_dir, ()), save_dir=ctx.save_dir, say=ctx.say, rank=ctx.rank, world_size=ctx.world_size
        )
    return ctx.logs


class RecordedLog:
    """A ``Log`` handler of the user's (``loop(handlers={Log: show})``), with the run still remembering each record.

    ``show`` replaces how a record is shown (the default's console line),
    not whether the run keeps it: each record, averaged over the ranks
    first under ``log_reduce="mean"``, reaches ``run.history``,
    ``log.jsonl`` and the ``loggers=`` once, after ``show`` returned (a
    ``show`` that raises is retried with the step, and nothing is kept
    twice). ``show`` is handed that record; one that calls the default
    ``pimm_fn.runtime.handlers.logs.log`` itself keeps it through that call.
    """

    def __init__(self, show):
        self.show = show

    def __call__(self, effect: Log, state, ctx) -> tuple:
        logs = _logs(ctx)
        record = logs.over_ranks(effect)
        written = logs.written
        followups = self.show(record, state, ctx)
        if ctx.rank == 0 and logs.written == written:
            logs.write(record)
        return followups

    def close(self) -> None:
        close = getattr(self.show, "close", None)
        if callable(close):
            close()

    def __repr__(self):
        return f"RecordedLog({self.show!r})"
