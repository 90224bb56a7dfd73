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

pimm's ``WandbNamer`` as a pure hook: the run's name, made from config values before anything is logged.
"""

from collections.abc import Iterable, Mapping
from typing import ClassVar

import attrs

from pimm_fn.compat.effects import TimeStep
from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, named
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool

__all__ = [
    "information_writer",
    "WriterState",
    "iteration_timer",
    "LARGE_OUTPUT_KEYS",
    "wandb_namer",
]


# Model outputs pimm's InformationWriter never logs (PIMM.md 2.4); also any key containing "match_".
LARGE_OUTPUT_KEYS = frozenset(
    {
        "seg_logits",
        "sem_logits",
        "instance_embedding",
        "vertex_embedding",
        "sigma",
        "point",
        "pred_logits",
        "pred_masks",
        "teacher_logits",
    }
)


def _scalars(outputs: Mapping) -> dict:
    """The outputs pimm's InformationWriter logs: no large or ``match_`` keys; ``total_loss`` reported as ``loss``."""
    kept = {
        k: v
        for k, v in outputs.items()
        if k not in LARGE_OUTPUT_KEYS and "match_" not in k and k not in ("loss", "total_loss")
    }
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
                where = {
                    "epoch": p.epoch + 1,
                    "of_epochs": p.max_epochs,
                    "iter": p.iter_in_epoch,
                    "of": p.iters_per_epoch,
                }
                values = named(values, "information_writer: the train step returned output", "train")
                return state, (Log(step + self.step_offset, "train", FrozenMap({**where, **values})),)
            case ev.AfterEpoch(epoch=epoch):
                slot = state.slot
                means = named(
                    {k: v / slot.counts[k] for k, v in slot.sums.items()},
                    "information_writer: the train step returned output",
                    "train",
                )
                return state.with_slot(WriterState()), (
                    Log(p.global_step, "epoch", FrozenMap({"epoch": epoch + 1, **means})),
                )
        return state, ()

    def __repr__(self):
        extra = f", step_offset={self.step_offset}" if self.step_offset else ""
        return f"information_writer({self.log_frequency}{extra})"


@hook_factory
def information_writer(log_frequency: int = 1, step_offset: int = 0) -> _InformationWriter:
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
def iteration_timer(warmup_iter: int = 1) -> _IterationTimer:
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


def _nested(config, path: str):
    """``config["a"]["b"]`` for ``"a.b"``; ``None`` where a part is missing (pimm's ``_get_nested``)."""
    value = config
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return None
    return value


def _number(value: float) -> str:
    """pimm's K/M/B formatting: one decimal, trailing zeros stripped."""
    n = float(value)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(int(n) if n == int(n) else n)


def _strings(keys: Iterable[str]) -> tuple[str, ...]:
    return tuple(keys)


@attrs.frozen(repr=False)
class _WandbNamer:
    factory_name: ClassVar[str] = "wandb_namer"
    events: ClassVar[tuple] = (ev.ModifyConfig,)
    emits: ClassVar[tuple] = ()
    rank_consistent: ClassVar[bool] = True
    keys: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    sep: str = "-"
    format_numbers: bool = attrs.field(default=True, validator=is_bool)
    extra: tuple = attrs.field(
        default=(), converter=lambda e: () if e is None else (e,) if isinstance(e, str) else tuple(e)
    )

    def name(self, config: Mapping) -> str | None:
        """The run name for ``config``, or ``None`` when no part exists."""
        parts = []
        for key in self.keys:
            value = _nested(config, key)
            if value is not None:
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                parts.append(_number(value) if self.format_numbers and numeric else str(value))
        parts += list(self.extra)
        return self.sep.join(parts) if parts else None

    def __call__(self, state, event):
        config = state.config
        if "wandb_run_name" in (config.get("_cli_options") or ()):  # named on the command line: kept
            return state, ()
        name = self.name(config)
        return (state, ()) if name is None else (state.evolve(config=config.set("wandb_run_name", name)), ())

    def __repr__(self):
        args = [f"keys={self.keys!r}"] if self.keys else []
        args += [f"sep={self.sep!r}"] if self.sep != "-" else []
        args += ["format_numbers=False"] if not self.format_numbers else []
        args += [f"extra={self.extra!r}"] if self.extra else []
        return f"wandb_namer({', '.join(args)})"


@hook_factory
def wandb_namer(
    keys: Iterable[str] = (), sep: str = "-", format_numbers: bool = True, extra: str | Iterable[str] | None = None
) -> _WandbNamer:
    """pimm's ``WandbNamer``: name the run from config values, into ``State.config["wandb_run_name"]``.

    At ``ModifyConfig`` (a fresh run, before anything is logged) it joins the
    values of the dotted ``keys`` of ``State.config`` (``loop(training=Training(config=cfg))``;
    missing ones skipped, numbers as ``1.5K``/``2M``/``1B``) and ``extra``
    with ``sep``. A name given on the command line (``wandb_run_name`` among
    ``config["_cli_options"]``, as ``apply_options`` records them) is kept.
    Pure: no W&B needed; a tracker handler reads the name from the config.

    >>> namer = wandb_namer(keys=("model.type", "data.max_len", "seed"), extra="fft")
    >>> namer.name({"model": {"type": "PTv3"}, "data": {"max_len": 1500000}, "seed": 0})
    'PTv3-1.5M-0-fft'
    """
    return _WandbNamer(keys, sep, format_numbers, extra)
