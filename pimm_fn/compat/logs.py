"""pimm's logging hooks as pure hooks: ``InformationWriter``, ``IterationTimer``.

The records are pimm_fn ``Log`` effects (the console and ``save_dir/log.jsonl``
from the main rank); what needs the model or a clock is an effect of
``pimm_fn.compat.effects`` carried out by ``pimm_fn.compat.HANDLERS``.

Differences from pimm, each on purpose: steps are global steps, the same on
every rank and after a resume (pimm's ``GradientNormLogger`` counts its own
calls, restarting at 0 on resume); one record per step of
``InformationWriter`` instead of a console line and tracker scalars apart
(``step_offset`` shifts the step of the per-step records, as pimm's tracker
axis); ``IterationTimer`` reports the step time and the time remaining once
per epoch instead of on every console line.

>>> import pimm_fn as pf
>>> [(e.step, e.effect.kind) for e in pf.plan([information_writer(4)], iters_per_epoch=6, max_epochs=1)]
[(4, 'train'), (6, 'train'), (6, 'epoch')]
"""

from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.compat.effects import TimeStep
from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.records import named
from pimm_fn.core.validate import int_at_least

__all__ = ["information_writer", "WriterState", "iteration_timer", "LARGE_OUTPUT_KEYS"]

# Model outputs pimm's InformationWriter never logs (PIMM.md 2.4); also any key containing "match_".
LARGE_OUTPUT_KEYS = frozenset({"seg_logits", "sem_logits", "instance_embedding", "vertex_embedding", "sigma", "point",
                               "pred_logits", "pred_masks", "teacher_logits"})


def _scalars(outputs: Mapping) -> dict:
    """The outputs pimm's InformationWriter logs: no large or ``match_`` keys; ``total_loss`` reported as ``loss``."""
    kept = {k: v for k, v in outputs.items() if k not in LARGE_OUTPUT_KEYS and "match_" not in k
            and k not in ("loss", "total_loss")}
    if "total_loss" in outputs:
        kept["loss"] = outputs["total_loss"]
    elif "loss" in outputs:
        kept["loss"] = outputs["loss"]
    return kept


@register_slot_type
@attrs.frozen
class WriterState:
    """This epoch's sums and counts of each logged output (rank-local: each rank's own losses)."""

    sums: FrozenMap = FrozenMap()
    counts: FrozenMap = FrozenMap()


@attrs.frozen(repr=False)
class _InformationWriter:
    factory_name: ClassVar[str] = "information_writer"
    events: ClassVar[tuple] = (ev.AfterStep, ev.AfterEpoch)
    emits: ClassVar[tuple] = (Log,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    log_frequency: int = attrs.field(default=1, validator=int_at_least(1))
    step_offset: int = attrs.field(default=0, validator=int_at_least(0))

    def init(self) -> WriterState:
        return WriterState()

    def __call__(self, state, event):
        p = state.progress
        match event:
            case ev.AfterStep(step=step, outputs=outputs):
                values = _scalars(outputs)
                slot = state.slot
                sums, counts = dict(slot.sums), dict(slot.counts)
                for k, v in values.items():
                    sums[k], counts[k] = sums.get(k, 0.0) + v, counts.get(k, 0) + 1
                state = state.with_slot(WriterState(FrozenMap(sums), FrozenMap(counts)))
                if step % self.log_frequency and not p.at_epoch_end:
                    return state, ()
                where = {"epoch": p.epoch + 1, "of_epochs": p.max_epochs, "iter": p.iter_in_epoch, "of": p.iters_per_epoch}
                values = named(values, "information_writer: the train step returned output", "train")
                return state, (Log(step + self.step_offset, "train", FrozenMap({**where, **values})),)
            case ev.AfterEpoch(epoch=epoch):
                slot = state.slot
                means = named({k: v / slot.counts[k] for k, v in slot.sums.items()},
                              "information_writer: the train step returned output", "train")
                return state.with_slot(WriterState()), (Log(p.global_step, "epoch", FrozenMap({"epoch": epoch + 1, **means})),)
        return state, ()

    def __repr__(self):
        extra = f", step_offset={self.step_offset}" if self.step_offset else ""
        return f"information_writer({self.log_frequency}{extra})"


@hook_factory
def information_writer(log_frequency: int = 1, step_offset: int = 0):
    """pimm's ``InformationWriter``: the train step's scalar outputs and the epoch's averages.

    Every ``log_frequency`` global steps, and at each epoch's last step, a
    record of the step's outputs (pimm's selection: no logits, masks or
    ``match_`` keys; ``total_loss`` reported as ``loss``; the learning rate
    as ``lr`` when the step reports it) at step ``step + step_offset``; at
    each epoch's end the averages of its steps at the epoch's last step.

    Emits:
        ``Log(step + step_offset, "train", {epoch, of_epochs, iter, of, **outputs})``
        (epoch 1-based as pimm prints it); ``Log(step, "epoch", {epoch, **means})``.

    State:
        ``WriterState(sums, counts)``: this epoch's sums (rank-local).

    >>> information_writer(20), information_writer(1, step_offset=5000)
    (information_writer(20), information_writer(1, step_offset=5000))
    """
    return _InformationWriter(log_frequency, step_offset)


@attrs.frozen(repr=False)
class _IterationTimer:
    factory_name: ClassVar[str] = "iteration_timer"
    events: ClassVar[tuple] = (ev.AfterStep,)
    emits: ClassVar[tuple] = (TimeStep,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    reads_outputs: ClassVar[bool] = False  # the clock is the handler's; the step's outputs are not read
    warmup_iter: int = attrs.field(default=1, validator=int_at_least(0))

    def __call__(self, state, event):
        p = state.progress
        # pimm resets its averages while the step's 0-based index in the epoch is <= warmup_iter.
        warmup = p.iter_in_epoch - 1 <= self.warmup_iter
        return state, (TimeStep(event.step, p.steps_left, warmup, p.at_epoch_end),)

    def __repr__(self):
        return f"iteration_timer({self.warmup_iter})"


@hook_factory
def iteration_timer(warmup_iter: int = 1):
    """pimm's ``IterationTimer``: the time of each step, and at each epoch's end the average and the time left.

    The clock is read by the handler, never by the hook. Steps whose index in
    their epoch is at most ``warmup_iter`` are left out of the average, as pimm's.

    Emits:
        ``TimeStep(step, steps_left, warmup, report)`` after every step (main
        rank); ``report`` at an epoch's last step, where the handler logs
        ``Log(step, "timing", {batch_time, steps_left, remain_s})``.

    >>> iteration_timer(2)
    iteration_timer(2)
    """
    return _IterationTimer(warmup_iter)
