"""Hooks that decide when to save: a step cadence, and the best model so far.

Both are pure: they emit ``SaveCheckpoint`` / ``WriteBest`` requests and keep
their counters in their slot. ``save_every`` decides from the global step
alone, which is identical on every rank, so every rank requests the same
collective saves.
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, SaveCheckpoint, WriteBest
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.frozen import repr_unless_none
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import finite, int_at_least, is_bool, non_empty_str, number, one_of, optional
from pimm_fn.hooks.metric_names import lower_is_better

__all__ = ["save_every", "SaveEveryState", "best_on", "BestState"]


@register_slot_type
@attrs.frozen(repr=False)
class SaveEveryState:
    """``last_saved``: the step of the last save requested; ``deferred``: a save
    waiting for the end of the epoch's hooks; ``saved_at``: with ``minutes``,
    the run's clock (``Elapsed.seconds``) at the last save in this process."""

    last_saved: int = -1
    deferred: int | None = None
    saved_at: float | None = None

    __repr__ = repr_unless_none("saved_at")


def _steps(instance, attribute, value) -> None:
    if value is not None:  # None: a time cadence only (minutes)
        int_at_least(1)(instance, attribute, value)


def _one_cadence(instance, attribute, value) -> None:
    if instance.n is None and instance.minutes is None:
        raise ValueError("save_every: pass a step cadence 'n', 'minutes', or both (got neither)")


@attrs.frozen(repr=False)
class _SaveEvery:
    factory_name: ClassVar[str] = "save_every"
    emits: ClassVar[tuple] = (SaveCheckpoint,)
    rank_consistent: ClassVar[bool] = True  # decides from the global step and rank 0's clock, alike everywhere
    n: int | None = attrs.field(validator=_steps)
    snapshots: bool = attrs.field(default=False, validator=is_bool)
    async_save: bool = attrs.field(default=False, validator=is_bool)
    minutes: float | None = attrs.field(default=None, validator=[optional(number(above=0)), _one_cadence])

    def init(self) -> SaveEveryState:
        return SaveEveryState()

    @property
    def events(self) -> tuple:
        steps = (ev.AfterStep,) if self.n is not None else ()
        clock = (ev.BeforeTrain, ev.Elapsed) if self.minutes is not None else ()
        return (*steps, ev.AfterEpoch, ev.AfterTrain, *clock)

    @property
    def every(self) -> int:
        """Called for ``AfterStep(step)`` only when ``step % n == 0`` (the fold enforces it)."""
        return self.n or 1

    def _save(self, slot, state, step, *, final=False, deferred=False, at=None):
        new = SaveEveryState(last_saved=step, saved_at=at if at is not None else slot.saved_at)
        # The final save is synchronous: training ends only once it is published.
        effect = SaveCheckpoint(
            step, snapshot=self.snapshots, final=final, async_save=self.async_save and not final, deferred=deferred
        )
        return new, state, (effect,)

    def update(self, slot: SaveEveryState, state, event):
        """The hook protocol's ``update``: its ``SaveEveryState`` comes and goes apart from ``state`` (no copy of it)."""
        match event:
            case ev.AfterStep(step=step):
                if state.progress.at_epoch_end:
                    return attrs.evolve(slot, deferred=step), state, ()
                return self._save(slot, state, step)
            case ev.AfterEpoch() if slot.deferred is not None:
                return self._save(slot, state, slot.deferred, deferred=True)
            case ev.AfterTrain():
                step = state.progress.global_step
                if step > 0 and slot.last_saved != step:
                    return self._save(slot, state, step, final=True)
            case ev.BeforeTrain():  # the clock starts again in every process: so does the time cadence
                return attrs.evolve(slot, saved_at=0.0), state, ()
            case ev.Elapsed(step=step, seconds=seconds) if self.minutes is not None:  # subscribed only then
                since = seconds - (slot.saved_at or 0.0)
                if since >= self.minutes * 60 and slot.last_saved != step:
                    return self._save(slot, state, step, at=seconds)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        extra = (", snapshots=True" if self.snapshots else "") + (", async_save=True" if self.async_save else "")
        minutes = f"minutes={self.minutes!r}"
        cadence = repr(self.n) if self.minutes is None else (f"{self.n}, {minutes}" if self.n else minutes)
        return f"save_every({cadence}{extra})"


@hook_factory
def save_every(
    n: int | None = None, *, minutes: float | None = None, snapshots: bool = False, async_save: bool = False
) -> _SaveEvery:
    """Save a checkpoint every ``n`` global steps, and once after training.

    The cadence is ``global_step % n == 0``, so it continues from resumed
    progress. A save falling on the last step of an epoch is deferred to
    ``AfterEpoch``, after the epoch's evaluation, so the checkpoint records
    it. The final save is skipped when the last save already holds the final
    step. Wherever it stands in the hook list, a save executes after the
    other effects of its event (an evaluation, a new best, a stop).

    With ``minutes`` (instead of ``n``, or beside it) it also saves at the
    first step boundary at least that long after the last save (or the start
    of this process), on rank 0's clock, which every rank receives
    (``Elapsed``): every rank saves the same step. The clock is the run's,
    delivered only by the runtime (or ``plan``/``simulate``'s ``clock``); the
    hook reads none. A time cadence is not replayed step for step on resume.

    Args:
        n: steps between saves (>= 1), or ``None`` with ``minutes``.
        minutes: wall-clock minutes between saves (> 0), or ``None``.
        snapshots: also keep an ``iter_<step>`` copy of every save.
        async_save: write checkpoints in the background (standard format):
            the state is copied to CPU memory while the next step's forward
            and backward run, the loop waits for that copy before the
            optimizer changes any parameter, and the write and publish
            overlap training. One save is in flight at a time; the final
            save and the end of training wait for completion.

    Emits:
        ``SaveCheckpoint(step, snapshot, final, async_save)`` (collective);
        the final save is never asynchronous.

    State:
        ``SaveEveryState(last_saved, deferred, saved_at)``.

    >>> save_every(1000), save_every(minutes=30)
    (save_every(1000), save_every(minutes=30))
    >>> save_every(0)
    Traceback (most recent call last):
    ValueError: save_every: 'n' must be an int >= 1 (got 0)
    """
    return _SaveEvery(n, snapshots, async_save, minutes)


@register_slot_type
@attrs.frozen
class BestState:
    """The best value seen so far (``None`` before any) and its step."""

    value: float | None = None
    step: int = -1


def _improves(value, best, mode) -> bool:
    if not finite(value):
        return False  # NaN and +/-inf never improve: a diverged evaluation must not become model_best
    if best is None:
        return True
    return value > best if mode == "max" else value < best


def _mode(instance, attribute, mode) -> None:
    """``mode`` is ``"max"`` or ``"min"``; ``None`` (not given) is refused for a loss-like metric."""
    if mode is None:
        if lower_is_better(instance.metric):
            raise ValueError(
                f"best_on({instance.metric!r}) would keep the model with the highest {instance.metric!r} "
                f"(mode='max' by default), the worst one for a loss or an error: pass "
                f"best_on({instance.metric!r}, mode='min'), or mode='max' if higher is better"
            )
        return
    one_of("max", "min")(instance, attribute, mode)


@attrs.frozen(repr=False)
class _BestOn:
    factory_name: ClassVar[str] = "best_on"
    events: ClassVar[tuple] = (ev.MetricsPublished,)
    emits: ClassVar[tuple] = (WriteBest, Log)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    metric: str = attrs.field(validator=non_empty_str)
    mode: str | None = attrs.field(default=None, validator=_mode)  # as given: None is "max", unsaid

    @property
    def direction(self) -> str:
        """``"max"`` or ``"min"``: the mode given, ``"max"`` when none was (never for a loss-like metric)."""
        return self.mode or "max"

    def init(self) -> BestState:
        return BestState()

    @property
    def reads_metrics(self) -> tuple:
        return (self.metric,)

    def update(self, slot: BestState, state, event):
        """The hook protocol's ``update``: its ``BestState`` comes and goes apart from ``state``."""
        values = event.values
        if self.metric not in values:
            return slot, state, ()  # another evaluator's publication; a misspelt metric is the run's Advice to refuse
        value = values[self.metric]
        if not _improves(value, slot.value, self.direction):
            return slot, state, ()
        step = state.progress.global_step
        state = state.evolve(best=state.best.set(self.metric, value))
        return BestState(value, step), state, (WriteBest(self.metric, value, step, event.weights),)

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        mode = "" if self.mode is None else f", mode={self.mode!r}"
        return f"best_on({self.metric!r}{mode})"


@hook_factory
def best_on(metric: str, *, mode: str | None = None) -> _BestOn:
    """Track the best value of ``metric`` and write ``model_best`` when it improves.

    A loss-like metric (a word of its name is ``loss``, ``error``, ``err``,
    ``mse``, ``mae``, ``nll``, ``perplexity``...) needs an explicit ``mode``:
    the default ``"max"`` would keep its worst model, so
    ``best_on("val_loss")`` is refused with the fix, ``mode="min"``. One
    metric has one best tracker per run: ``loop()`` refuses two hooks
    writing the best weights of the same metric (``pimm_fn.runtime.engine.arguments``).

    Reacts to each ``MetricsPublished`` once: improvement is strict, NaN and
    +/-inf never improve (so ``model_best`` never holds a diverged model, and
    training goes on; the loop warns with a ``NonFiniteMetricWarning`` naming
    the metric and the step), and
    a later step never reuses an old value. The new best is in
    ``state.best`` before any later effect of the same event runs, so a
    checkpoint saved at an evaluation step records it. The decision feeds only
    ``WriteBest``, a main-rank effect, never a collective one.

    Args:
        metric: the published metric name (a ``loader_evaluator``'s are
            namespaced: ``"val/acc"``).
        mode: ``"max"`` or ``"min"``; default ``"max"``, refused unsaid for a
            loss-like metric.

    Emits:
        ``WriteBest(metric, value, step, weights)`` (main rank) on strict
        improvement; ``weights`` names the average that was evaluated
        (``evaluate_every(..., weights="ema")``), so ``model_best`` holds it.

    Raises:
        ValueError: a loss-like ``metric`` without ``mode``; a bad ``mode``.
            A ``metric`` no evaluator publishes (misspelt, or ``"acc"`` for a
            ``loader_evaluator``'s ``"val/acc"``) is refused by the run once
            every evaluator has published (``pimm_fn.runtime.errors``), and
            before the first step by the sanity check of its loader evaluators.

    >>> best_on("mIoU"), best_on("loss", mode="min")
    (best_on('mIoU'), best_on('loss', mode='min'))
    >>> best_on("val_loss")
    Traceback (most recent call last):
    ValueError: best_on('val_loss') would keep the model with the highest 'val_loss' (mode='max' by default), the worst one for a loss or an error: pass best_on('val_loss', mode='min'), or mode='max' if higher is better
    """
    if mode == "max" and isinstance(metric, str) and not lower_is_better(metric):
        mode = None  # the default said aloud: the same hook (identity, equality, repr) as best_on(metric)
    return _BestOn(metric, mode)
