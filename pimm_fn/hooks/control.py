"""Hooks that steer training: stop it early, step the learning-rate scheduler.

Both decide from data every rank holds alike: ``early_stop`` from broadcast
metrics (its ``Stop`` is collective: every rank must end at the same step),
``step_scheduler`` from the progress or a broadcast metric (each rank steps
its own scheduler, so they must step alike to keep one learning rate). A
metric that is not rank-consistent (``evaluate_every(..., broadcast=False)``)
is refused with an error. As with ``best_on``, put the evaluator before
these hooks' savers: a save at an evaluation step then records the decision.
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, StepScheduler, Stop
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import finite, int_at_least, non_empty_str, number, one_of
from pimm_fn.hooks.metric_names import lower_is_better

__all__ = ["early_stop", "EarlyStopState", "step_scheduler"]


def _require_consistent(caller: str, metric: str, event) -> None:
    """Refuse a rank-local value of ``metric`` for a decision every rank must take alike."""
    if not event.consistent:
        source = f" from evaluator {event.source!r}" if event.source else ""
        raise ValueError(
            f"{caller} got {metric!r}{source} as a rank-local value (broadcast=False): every rank must decide "
            f"alike, so it needs the same value on every rank. Evaluate with broadcast=True "
            f"(evaluate_every(..., broadcast=True), the default)"
        )


@register_slot_type
@attrs.frozen
class EarlyStopState:
    """``best``: the best value so far (``None`` before any); ``without_improvement``:
    the evaluations since it last improved. Rank-consistent (broadcast metrics only)."""

    best: float | None = None
    without_improvement: int = 0


@attrs.frozen(repr=False)
class _EarlyStop:
    factory_name: ClassVar[str] = "early_stop"
    events: ClassVar[tuple] = (ev.MetricsPublished,)
    emits: ClassVar[tuple] = (Stop, Log)
    rank_consistent: ClassVar[bool] = True  # decides from broadcast metrics alone, and refuses others
    metric: str = attrs.field(validator=non_empty_str)
    patience: int = attrs.field(validator=int_at_least(1))
    mode: str = attrs.field(default="max", validator=one_of("max", "min"))
    min_delta: float = attrs.field(default=0.0, validator=number(at_least=0))

    def init(self) -> EarlyStopState:
        return EarlyStopState()

    @property
    def reads_metrics(self) -> tuple:
        return (self.metric,)

    def _improves(self, value, best) -> bool:
        if not finite(value):
            return False  # NaN, +/-inf (or a non-number) never improves
        if best is None:
            return True
        return value > best + self.min_delta if self.mode == "max" else value < best - self.min_delta

    def update(self, slot: EarlyStopState, state, event):
        """The hook protocol's ``update``: its ``EarlyStopState`` comes and goes apart from ``state``."""
        values = event.values
        step = state.progress.global_step
        if self.metric not in values:
            return slot, state, ()  # another evaluator's publication; a typo is the run's Advice to refuse
        _require_consistent(repr(self), self.metric, event)
        value = values[self.metric]
        if self._improves(value, slot.best):
            return EarlyStopState(value, 0), state, ()
        waited = slot.without_improvement + 1
        if waited != self.patience:  # emitted once, when the count reaches patience
            return EarlyStopState(slot.best, waited), state, ()
        reason = f"{self!r}: {self.metric} has not improved on {slot.best!r} for {waited} evaluation(s)"
        return EarlyStopState(slot.best, waited), state, (Stop(step, reason),)

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        extra = "" if self.mode == "max" else f", mode={self.mode!r}"
        extra += f", min_delta={self.min_delta!r}" if self.min_delta else ""
        return f"early_stop({self.metric!r}, patience={self.patience}{extra})"


@hook_factory
def early_stop(metric: str, *, patience: int, mode: str | None = None, min_delta: float = 0.0) -> _EarlyStop:
    """Stop training when ``metric`` has not improved for ``patience`` evaluations.

    Reacts to each publication of ``metric``: a value improves when it beats
    the best so far by more than ``min_delta`` (strictly; NaN and +/-inf never
    improve, and count as evaluations without improvement). When the
    count of evaluations without improvement reaches ``patience`` it requests
    a stop: the epoch in progress closes early (its ``AfterEpoch`` hooks
    run), then ``AfterTrain`` (the final save). ``plan``, ``simulate`` and
    the real loop all end at that step.

    Args:
        metric: the published metric name; it must be broadcast (the
            default of ``evaluate_every``), so every rank stops alike.
        patience: evaluations without improvement before stopping (>= 1).
        mode: ``"max"`` (higher is better) or ``"min"``; default ``"max"``,
            refused unsaid for a loss-like ``metric`` (as ``best_on``'s).
        min_delta: the margin (>= 0) a value must beat the best by.

    Emits:
        ``Stop(step, reason)`` (collective), once, when the count reaches
        ``patience``. (A ``metric`` no evaluator publishes is refused by the
        run once every evaluator has published: ``pimm_fn.runtime.errors``.)

    State:
        ``EarlyStopState(best, without_improvement)``.

    Raises:
        ValueError: a bad argument, at once; ``metric`` published as a
            rank-local value (``broadcast=False``).

    >>> from pimm_fn import evaluate_every, plan
    >>> def val(model): ...
    >>> scores = {2: {"acc": 0.5}, 4: {"acc": 0.6}, 6: {"acc": 0.6}, 8: {"acc": 0.55}}
    >>> hooks = [evaluate_every(2, val), early_stop("acc", patience=2)]
    >>> trace = plan(hooks, iters_per_epoch=5, max_epochs=4, metrics=scores)
    >>> trace[-1].effect
    Stop(step=8, reason="early_stop('acc', patience=2): acc has not improved on 0.6 for 2 evaluation(s)")
    >>> early_stop("loss", patience=0, mode="min")
    Traceback (most recent call last):
    ValueError: early_stop: 'patience' must be an int >= 1 (got 0)
    """
    if mode is None and isinstance(metric, str) and lower_is_better(metric):
        raise ValueError(
            f"early_stop({metric!r}) would wait for {metric!r} to rise (mode='max' by default), which a loss or an "
            f"error should not: pass early_stop({metric!r}, patience={patience!r}, mode='min'), or mode='max' if "
            f"higher is better"
        )
    return _EarlyStop(metric, patience, "max" if mode is None else mode, min_delta)


_INTERVAL_EVENTS = {"step": (ev.AfterStep,), "epoch": (ev.AfterEpoch,), None: (ev.MetricsPublished,)}


@attrs.frozen(repr=False)
class _StepScheduler:
    factory_name: ClassVar[str] = "step_scheduler"
    emits: ClassVar[tuple] = (StepScheduler, Log)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    interval: str | None = attrs.field(validator=attrs.validators.optional(one_of("step", "epoch")))
    on: str | None = attrs.field(default=None, validator=attrs.validators.optional(non_empty_str))

    def __attrs_post_init__(self):
        if (self.interval is None) == (self.on is None):
            raise ValueError(
                f"step_scheduler: pass an interval, 'step' or 'epoch', or on='<metric>' for a scheduler that "
                f"reads a metric (ReduceLROnPlateau), exactly one of them (got interval={self.interval!r}, "
                f"on={self.on!r})"
            )

    @property
    def events(self) -> tuple:
        """``AfterStep`` for ``"step"``, ``AfterEpoch`` for ``"epoch"``, ``MetricsPublished`` for ``on``."""
        return _INTERVAL_EVENTS[self.interval]

    @property
    def reads_metrics(self) -> tuple:
        return (self.on,) if self.on is not None else ()

    def update(self, slot, state, event):
        """The hook protocol's ``update`` (no slot): called so, it builds no ``State`` after a hook with one."""
        step = state.progress.global_step
        match event:
            case ev.AfterStep() if self.interval == "step":
                return slot, state, (StepScheduler(step),)
            case ev.AfterEpoch() if self.interval == "epoch":
                return slot, state, (StepScheduler(step),)
            case ev.MetricsPublished(values=values) if self.on is not None:
                if self.on not in values:
                    return slot, state, ()  # another evaluator's publication (a typo: the run's Advice)
                _require_consistent(repr(self), self.on, event)
                return slot, state, (StepScheduler(step, self.on, values[self.on]),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        return f"step_scheduler({self.interval!r})" if self.on is None else f"step_scheduler(on={self.on!r})"


@hook_factory
def step_scheduler(interval: str | None = None, *, on: str | None = None) -> _StepScheduler:
    """Step the learning-rate scheduler per step, per epoch, or on a published metric.

    ``step_scheduler("step")`` steps it after every training step,
    ``step_scheduler("epoch")`` at every epoch's end (an epoch a stop closes
    early included), and ``step_scheduler(on="val_loss")`` after every
    evaluation publishing ``val_loss``, passing its value
    (``ReduceLROnPlateau.step(value)``). With such a hook in the list the
    default train step no longer steps the scheduler itself, and ``loop``
    refuses to run it without a ``scheduler``.

    Order needs no care: a save runs after every other effect of its event,
    so a checkpoint holds the scheduler as that event stepped it, wherever
    the hooks stand.

    Args:
        interval: ``"step"`` or ``"epoch"``.
        on: instead of an interval, the metric whose every publication steps
            the scheduler with its value; it must be broadcast (the default
            of ``evaluate_every``), so every rank's scheduler steps alike.

    Emits:
        ``StepScheduler(step)``, or ``StepScheduler(step, metric, value)`` for
        ``on`` (each rank steps its own). (An ``on`` no evaluator publishes is
        refused by the run once every evaluator has published:
        ``pimm_fn.runtime.errors``.)

    Raises:
        ValueError: neither or both of ``interval`` and ``on``, an unknown
            interval, or ``on`` published as a rank-local value.
        TypeError: ``on`` not a non-empty str.

    >>> step_scheduler("epoch"), step_scheduler(on="val_loss")
    (step_scheduler('epoch'), step_scheduler(on='val_loss'))
    >>> from pimm_fn import plan
    >>> [e.effect for e in plan([step_scheduler("epoch")], iters_per_epoch=3, max_epochs=2)]
    [StepScheduler(step=3, metric=None, value=None), StepScheduler(step=6, metric=None, value=None)]
    >>> step_scheduler("val_loss")
    Traceback (most recent call last):
    ValueError: step_scheduler: 'interval' must be 'step' or 'epoch' (got 'val_loss'); to step on a metric, pass on='val_loss'
    """
    if isinstance(interval, str) and interval not in ("step", "epoch"):
        raise ValueError(
            f"step_scheduler: 'interval' must be 'step' or 'epoch' (got {interval!r}); "
            f"to step on a metric, pass on={interval!r}"
        )
    return _StepScheduler(interval, on)
