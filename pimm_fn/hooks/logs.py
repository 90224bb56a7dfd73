"""A hook that reports the train step's scalar outputs and epoch averages."""

from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, named
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least

__all__ = ["log_every", "LogState"]


_EMPTY = FrozenMap()
_OUTPUT = "log_every: the train step returned output"  # whose values a record refuses (pimm_fn.core.effects)


@register_slot_type
@attrs.frozen
class LogState:
    """Running sums of this epoch's step outputs; rank-local (each rank's losses).

    ``count`` counts the epoch's steps. ``counts`` holds, for an output that
    some of those steps did not report, how many did, so it is averaged over
    those; an output every step reported has no entry (the common case: no
    per-output counts to keep up every step).

    >>> LogState().count, LogState(FrozenMap({"loss": 3.0}), 2).sums["loss"]
    (0, 3.0)
    """

    sums: FrozenMap = _EMPTY
    count: int = 0
    counts: FrozenMap = _EMPTY


def _accumulate(slot: LogState, outputs: Mapping[str, float]) -> LogState:
    """``slot`` with one step's ``outputs`` added; a step without outputs counts for nothing."""
    if not outputs:
        return slot
    counts = slot.counts
    if counts is _EMPTY or not counts:  # every output so far came with every step
        summed = slot.sums.plus(outputs)
        if summed is not None:  # the common case, every step: the same outputs as each step before
            return LogState(summed, slot.count + 1, counts)
    # Outputs that come and go (or a slot saved when every output kept a count).
    count = slot.count + 1
    sums = dict(slot.sums)
    for k, v in outputs.items():
        sums[k] = sums.get(k, 0.0) + v
    # An output with a sum but no count was reported by every step so far.
    reported = {k: counts.get(k, slot.count if k in slot.sums else 0) + (k in outputs) for k in sums}
    partial = {k: n for k, n in reported.items() if n != count}
    return LogState(FrozenMap(sums), count, FrozenMap(partial) if partial else _EMPTY)


def _accumulate_all(slot: LogState, steps) -> LogState:
    """``_accumulate`` over each of ``steps`` in order, one ``LogState`` at the end: the same floats, added alike.

    >>> _accumulate_all(LogState(), [{"loss": 1.0}, {"loss": 0.5}, {}]) == _accumulate(_accumulate(LogState(),
    ...     {"loss": 1.0}), {"loss": 0.5})
    True
    """
    sums, count = dict(slot.sums), slot.count
    for outputs in steps:
        if not outputs:
            continue
        if slot.counts or outputs.keys() != sums.keys():  # outputs that come and go: one step at a time
            slot = _accumulate(LogState(FrozenMap(sums), count, slot.counts), outputs)
            sums, count = dict(slot.sums), slot.count
            continue
        for k, v in outputs.items():
            sums[k] = sums[k] + v  # as FrozenMap.plus adds (IEEE addition commutes exactly)
        count += 1
    return slot if count == slot.count else LogState(FrozenMap(sums), count, slot.counts)


@attrs.frozen(repr=False)
class _LogEvery:
    factory_name: ClassVar[str] = "log_every"
    events: ClassVar[tuple] = (ev.AfterStep, ev.AfterEpoch, ev.MetricsPublished)
    emits: ClassVar[tuple] = (Log,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    n: int = attrs.field(validator=int_at_least(1))

    def init(self) -> LogState:
        return LogState()

    @property
    def every(self) -> int:
        """Called for ``AfterStep(step)`` only when ``step % n == 0``; ``accumulate`` sums the rest."""
        return self.n

    # The slot after a step the cadence skips: its outputs added to the sums. A plain
    # function, so the fold's call on every such step makes no bound method.
    accumulate = staticmethod(_accumulate)
    accumulate_all = staticmethod(_accumulate_all)  # the quiet steps' outputs, read at once

    def update(self, slot: LogState, state, event):
        """The hook protocol's ``update``: its ``LogState`` comes and goes apart from ``state``."""
        p = state.progress
        match event:
            case ev.AfterStep(step=step, outputs=outputs):
                where = {"epoch": p.epoch, "iter": p.iter_in_epoch, "of": p.iters_per_epoch}
                record = Log(step, "train", FrozenMap({**where, **named(outputs, _OUTPUT, "train")}))
                return _accumulate(slot, outputs), state, (record,)
            case ev.AfterEpoch(epoch=epoch):
                means = {k: v / slot.counts.get(k, slot.count) for k, v in slot.sums.items()} if slot.count else {}
                means = named(means, _OUTPUT, "train")
                return LogState(), state, (Log(p.global_step, "epoch", FrozenMap({"epoch": epoch, **means})),)
            case ev.MetricsPublished(values=values, source=source) if values:
                return slot, state, (Log(p.global_step, f"eval/{source}" if source else "eval", values),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        return f"log_every({self.n})"


@hook_factory
def log_every(n: int) -> _LogEvery:
    """Log the train step's outputs every ``n`` steps, epoch averages, and evaluations.

    Records go, from the main rank, to the console, ``save_dir/log.jsonl``,
    the run's ``loggers`` and ``run.history``; the progress bar shows the
    outputs read on these steps (reading them is the one host sync it costs).
    An output named like a field the record holds itself (``step``, ``kind``,
    ``epoch``, ``iter``, ``of``, ...: ``pimm_fn.core.effects``), or two names
    alike once written (``1`` and ``"1"``), is refused with a ``ValueError``.

    Emits:
        ``Log(step, "train", outputs)`` every ``n`` steps; ``Log(step, "epoch",
        means)`` at each epoch's end; ``Log(step, "eval/<source>", values)``
        for each published evaluation.

    State:
        ``LogState(sums, count, counts)``: this epoch's running sums (rank-local).

    >>> log_every(50)
    log_every(50)
    """
    return _LogEvery(n)
