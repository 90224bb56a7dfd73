"""A hook that reports the train step's scalar outputs and epoch averages."""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register
from pimm_fn.core.effects import Log
from pimm_fn.core.frozen import FrozenMap, own
from pimm_fn.hooks._validate import int_at_least

__all__ = ["log_every", "LogState"]


@register
@attrs.frozen
class LogState:
    """Running sums of this epoch's step outputs; rank-local (each rank's losses).

    ``count`` counts the epoch's steps, ``counts`` the steps that reported each
    output, so an output only some steps report is averaged over those.
    """

    sums: FrozenMap = FrozenMap()
    count: int = 0
    counts: FrozenMap = FrozenMap()


def _accumulate(slot: LogState, outputs) -> LogState:
    sums, counts = slot.sums, slot.counts
    if sums.keys() == outputs.keys() == counts.keys():
        # The common case, every step: the same outputs as each step before. New
        # dicts become the new maps without a copy (``own``); nothing else holds them.
        return LogState(
            own({k: v + outputs[k] for k, v in sums.items()}),
            slot.count + 1,
            own({k: n + 1 for k, n in counts.items()}),
        )
    sums = {k: slot.sums.get(k, 0.0) + v for k, v in outputs.items()}
    # A sum without a count (a slot saved before counts existed) covered every step.
    counts = {k: slot.counts.get(k, slot.count if k in slot.sums else 0) + 1 for k in outputs}
    return LogState(slot.sums.merge(sums), slot.count + 1, slot.counts.merge(counts))


@attrs.frozen(repr=False)
class _LogEvery:
    factory_name: ClassVar[str] = "log_every"
    events: ClassVar[tuple] = (ev.AfterStep, ev.AfterEpoch, ev.MetricsPublished)
    n: int = attrs.field(validator=int_at_least(1))

    def init(self) -> LogState:
        return LogState()

    @property
    def step_cadence(self) -> int:
        """Emits on ``AfterStep(step)`` only when ``step % n == 0``; see ``quiet_step``."""
        return self.n

    def quiet_step(self, slot: LogState, event) -> LogState:
        """The slot after an ``AfterStep`` that logs nothing: the outputs added to the sums."""
        return _accumulate(slot, event.outputs)

    def __call__(self, state, event):
        p = state.progress
        match event:
            case ev.AfterStep(step=step, outputs=outputs):
                state = state.with_slot(_accumulate(state.slot, outputs))
                if step % self.n == 0:
                    where = {"epoch": p.epoch, "iter": p.iter_in_epoch, "of": p.iters_per_epoch}
                    return state, (Log(step, "train", FrozenMap({**where, **outputs})),)
                return state, ()
            case ev.AfterEpoch(epoch=epoch):
                slot = state.slot
                means = {k: v / slot.counts.get(k, slot.count) for k, v in slot.sums.items()} if slot.count else {}
                return state.with_slot(LogState()), (Log(p.global_step, "epoch", FrozenMap({"epoch": epoch, **means})),)
            case ev.MetricsPublished(values=values, source=source) if values:
                return state, (Log(p.global_step, f"eval/{source}" if source else "eval", values),)
        return state, ()

    def __repr__(self):
        return f"log_every({self.n})"


def log_every(n: int):
    """Log the train step's outputs every ``n`` steps, epoch averages, and evaluations.

    Records go to the console and ``save_dir/log.jsonl`` from the main rank.

    Emits:
        ``Log(step, "train", outputs)`` every ``n`` steps; ``Log(step, "epoch",
        means)`` at each epoch's end; ``Log(step, "eval/<source>", values)``
        for each published evaluation.

    State:
        ``LogState(sums, count)``: this epoch's running sums (rank-local).

    >>> log_every(50)
    log_every(50)
    """
    return _LogEvery(n)
