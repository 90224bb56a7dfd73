"""pimm's checkpoint savers as pure hooks: ``CheckpointSaver``, ``CheckpointSaverIteration``.

The save decisions are pimm's, step for step (``PIMM.md`` 2.2): a save at
every global step ``s`` with ``s % save_freq == 0`` (and, for
``CheckpointSaver``, ``s % evaluator_every_n_steps == 0`` when evaluating);
a save falling on the last step of an epoch is deferred past the epoch's
hooks (``SaveCheckpoint(deferred=True)``, so the epoch's evaluation and logs
come first); an ``iter_<s>`` snapshot at each save with ``s % save_freq ==
0`` (``CheckpointSaver`` with ``save_freq`` set; ``CheckpointSaverIteration``
with ``save_iter_checkpoints``); a final save after training. Every decision
reads the global step alone, so every rank requests the same collective saves.

Where pimm is wrong, these hooks differ (``PIMM.md`` 6):

* no duplicate final save: pimm saves again after training even when the
  deferred save of the last epoch just wrote the same step;
* the best model follows the evaluation, not the save: pimm compares the
  evaluators' *latest* metric at its save steps (stale by up to an epoch,
  never at all for ``CheckpointSaver`` without ``evaluator_every_n_steps``,
  so pimm's default runtime writes no ``model_best``), and writes the
  *current* weights. Here the saver reacts to each published evaluation of
  its metric and writes the weights that were evaluated, at once;
* one agreed best value: the evaluations are broadcast, so every rank holds
  the same ``State.best`` (pimm keeps a per-rank ``best_metric_value``).

>>> import pimm_fn as pf
>>> trace = pf.plan([checkpoint_saver(save_freq=4)], iters_per_epoch=10, max_epochs=3)
>>> [(e.step, e.effect.snapshot) for e in trace if isinstance(e.effect, SaveCheckpoint)]
[(4, True), (8, True), (12, True), (16, True), (20, True), (24, True), (28, True), (30, False)]

pimm's checkpoint backends and the format a pimm config asks for, in pimm_fn's terms (``PIMM.md`` 3.1).
"""

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, SaveCheckpoint, WriteBest
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import finite, int_at_least, is_bool, non_empty_str, one_of, optional

__all__ = [
    "BACKENDS",
    "format_of",
    "checkpoint_format",
    "checkpoint_saver",
    "checkpoint_saver_iteration",
    "PimmSaveState",
    "PIMM_BEST",
]


# pimm's checkpoint backends (``CheckpointSaverIteration.backend``, ``cfg.checkpoint_format``) and their formats.
BACKENDS = {"standard": "standard", "dcp": "standard", "legacy": "legacy", "torch": "legacy"}


def format_of(value) -> str:
    """pimm_fn's ``checkpoint_format`` for pimm's ``checkpoint_format``/``backend`` value (``PIMM.md`` 3.1).

    >>> format_of("DCP"), format_of("torch")
    ('standard', 'legacy')
    """
    fmt = value.lower() if isinstance(value, str) else value
    if fmt not in BACKENDS:
        raise ValueError(
            f"checkpoint_format must be 'standard' or 'legacy' (or the deprecated 'dcp'/'torch'), got {value!r}"
        )
    return BACKENDS[fmt]


def checkpoint_format(cfg: Mapping[str, Any]) -> str:
    """The ``loop(saving=Saving(checkpoint_format=))`` of a pimm config, pimm's way (``PIMM.md`` 3.1).

    ``cfg["checkpoint_format"]`` when set, else the ``backend`` of its
    ``CheckpointSaverIteration``, else ``"standard"``; ``dcp`` and ``torch``
    are the deprecated names of ``standard`` and ``legacy``.

    >>> checkpoint_format({"hooks": [dict(type="CheckpointSaverIteration", save_freq=10, backend="torch")]})
    'legacy'
    >>> checkpoint_format({"checkpoint_format": "dcp", "hooks": []})
    'standard'
    """
    chosen = cfg.get("checkpoint_format")
    if chosen is None:
        backends = [
            h.get("backend")
            for h in cfg.get("hooks") or ()
            if isinstance(h, dict) and h.get("type") == "CheckpointSaverIteration" and h.get("backend") is not None
        ]
        chosen = backends[0] if backends else "standard"
    return format_of(chosen)


# ``State.best`` key of a best value translated from a pimm checkpoint, whose metric pimm does not name.
PIMM_BEST = "pimm.best_metric_value"


@register_slot_type
@attrs.frozen
class PimmSaveState:
    """``last_saved``: the step of the last save requested; ``deferred``: a save waiting for the epoch's end
    (``snapshot``: whether it keeps an ``iter_<step>`` copy)."""

    last_saved: int = -1
    deferred: int | None = None
    snapshot: bool = False


def _backend(instance, attribute, value):
    if value is not None:
        format_of(value)


def _message(step, text) -> Log:
    return Log(step, "info", FrozenMap({"message": text}))


@attrs.frozen(repr=False)
class _PimmSaver:
    """pimm's two savers; ``iteration`` tells ``CheckpointSaverIteration`` from ``CheckpointSaver``."""

    factory_name: ClassVar[str] = "checkpoint_saver"
    emits: ClassVar[tuple] = (SaveCheckpoint, WriteBest, Log)
    rank_consistent: ClassVar[bool] = True  # saves on the global step; best values come from broadcast metrics
    iteration: bool
    save_freq: int | None = attrs.field(validator=optional(int_at_least(1)))
    evaluator_every_n_steps: int | None = attrs.field(default=None, validator=optional(int_at_least(1)))
    save_iter_checkpoints: bool = attrs.field(default=False, validator=is_bool)
    backend: str | None = attrs.field(default=None, validator=_backend)
    evaluate: bool = attrs.field(default=True, validator=is_bool)
    metric: str | None = attrs.field(default=None, validator=optional(non_empty_str))
    mode: str = attrs.field(default="max", validator=one_of("max", "min"))

    def init(self) -> PimmSaveState:
        return PimmSaveState()

    @property
    def reads_metrics(self) -> tuple:
        """Its best metric: so ``loop()`` refuses a ``pf.best_on`` of the same one beside it (one best per metric)."""
        return (self.metric,) if self.metric else ()

    @property
    def _cadences(self) -> tuple:
        eval_n = self.evaluator_every_n_steps if self.evaluate and not self.iteration else None
        return tuple(n for n in (self.save_freq, eval_n) if n)

    @property
    def events(self) -> tuple:
        found = (ev.AfterStep,) if self._cadences else ()
        return (*found, ev.AfterEpoch, ev.AfterTrain) + ((ev.MetricsPublished,) if self.metric else ())

    @property
    def every(self) -> int:
        """Called for ``AfterStep(step)`` only on a step one of its cadences divides (the fold enforces the gcd)."""
        return math.gcd(*self._cadences) if self._cadences else 1

    def _snapshot(self, step) -> bool:
        on_freq = bool(self.save_freq) and step % self.save_freq == 0
        return on_freq and (self.save_iter_checkpoints or not self.iteration)

    def __call__(self, state, event):
        match event:
            case ev.AfterStep(step=step) if any(step % n == 0 for n in self._cadences):
                said = (_message(step, f"Saving checkpoint at global step {step}"),) if self.iteration else ()
                snapshot = self._snapshot(step)
                if state.progress.at_epoch_end:  # after the epoch's hooks, as pimm's _pending_epoch_save
                    return state.with_slot(attrs.evolve(state.slot, deferred=step, snapshot=snapshot)), said
                return state.with_slot(PimmSaveState(step)), (*said, SaveCheckpoint(step, snapshot=snapshot))
            case ev.AfterEpoch() if state.slot.deferred is not None:
                step, snapshot = state.slot.deferred, state.slot.snapshot
                return state.with_slot(PimmSaveState(step)), (SaveCheckpoint(step, snapshot=snapshot, deferred=True),)
            case ev.AfterTrain():
                step = state.progress.global_step
                if step > 0 and state.slot.last_saved != step:  # pimm saves again even then (PIMM.md 6.8)
                    save = SaveCheckpoint(step, snapshot=self._snapshot(step), final=True)
                    return state.with_slot(PimmSaveState(step)), (_message(step, "Saving final checkpoint"), save)
            case ev.MetricsPublished(values=values) if self.metric in values:
                return self._best(state, event, values[self.metric])
        return state, ()

    def _best(self, state, event, value):
        step = state.progress.global_step
        best = state.best.get(self.metric, state.best.get(PIMM_BEST))
        better = finite(value) and (best is None or (value > best if self.mode == "max" else value < best))
        effects = ()
        if better:
            best = value
            state = state.evolve(best=state.best.set(self.metric, value))
            effects = (
                WriteBest(self.metric, value, step, event.weights),
                _message(step, f"Best validation {self.metric} updated to: {value:.4f}"),
            )
        if best is None:
            return state, effects
        return state, (*effects, _message(step, f"Currently Best {self.metric}: {best:.4f}"))

    def __repr__(self):
        if self.iteration:
            name, args = (
                "checkpoint_saver_iteration",
                [("save_freq", None), ("save_iter_checkpoints", False), ("backend", None)],
            )
        else:
            name, args = (
                "checkpoint_saver",
                [("save_freq", None), ("evaluator_every_n_steps", None), ("evaluate", True)],
            )
        args += [("metric", None), ("mode", "max")]
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k, default in args if getattr(self, k) != default)
        return f"{name}({shown})"


@hook_factory
def checkpoint_saver(
    save_freq: int | None = None,
    evaluator_every_n_steps: int | None = None,
    *,
    evaluate: bool = True,
    metric: str | None = None,
    mode: str = "max",
) -> _PimmSaver:
    """pimm's ``CheckpointSaver``: save every ``save_freq`` global steps and at evaluation steps, and at the end.

    Args:
        save_freq: save every this many global steps, each with an
            ``iter_<step>`` snapshot; ``None`` (pimm's default): only the final save.
        evaluator_every_n_steps: also save every this many steps (pimm's
            "evaluation steps"), while ``evaluate``.
        evaluate: pimm's ``cfg.evaluate``.
        metric: the metric whose improvement writes ``model_best`` (the one
            pimm's evaluator before the saver publishes as its current metric;
            ``build_hooks`` fills it in), ``None``: none.
        mode: ``"max"`` (a higher ``metric`` is better) or ``"min"``;
            ``build_hooks`` fills it in with ``metric``.

    Emits:
        ``SaveCheckpoint`` (collective; deferred at an epoch's last step;
        final after training unless the last save holds the last step);
        on each published ``metric`` that improves strictly: ``WriteBest``;
        pimm's log lines as ``Log(step, "info", {"message": ...})``.

    State:
        ``PimmSaveState(last_saved, deferred, snapshot)``.

    >>> checkpoint_saver(save_freq=1000, evaluator_every_n_steps=500, metric="mIoU")
    checkpoint_saver(save_freq=1000, evaluator_every_n_steps=500, metric='mIoU')
    """
    return _PimmSaver(False, save_freq, evaluator_every_n_steps, False, None, evaluate, metric, mode)


@hook_factory
def checkpoint_saver_iteration(
    save_freq: int | None = None,
    save_iter_checkpoints: bool = False,
    backend: str | None = None,
    *,
    metric: str | None = None,
    mode: str = "max",
) -> _PimmSaver:
    """pimm's ``CheckpointSaverIteration``: save every ``save_freq`` global steps, and at the end.

    Args:
        save_freq: save every this many global steps; ``None`` (pimm's default): only the final save.
        save_iter_checkpoints: keep an ``iter_<step>`` snapshot of each of them.
        backend: pimm's checkpoint backend (``"dcp"``/``"standard"``, ``"torch"``/``"legacy"``),
            checked here; the format a run writes is ``loop(saving=Saving(checkpoint_format=))``, which
            ``pimm_fn.compat.checkpoint_format(cfg)`` resolves pimm's way.
        metric: as ``checkpoint_saver``'s.
        mode: as ``checkpoint_saver``'s.

    >>> checkpoint_saver_iteration(1000, backend="dcp")
    checkpoint_saver_iteration(save_freq=1000, backend='dcp')
    >>> checkpoint_saver_iteration(10, backend="zip")
    Traceback (most recent call last):
    ValueError: checkpoint_format must be 'standard' or 'legacy' (or the deprecated 'dcp'/'torch'), got 'zip'
    """
    return _PimmSaver(True, save_freq, None, save_iter_checkpoints, backend, True, metric, mode)
