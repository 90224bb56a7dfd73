"""A checkpoint cadence counted in epochs, as pimm's ``CheckpointSaver`` keeps.

pimm saves ``last`` at the end of every epoch and keeps an extra copy every
``save_freq`` epochs. ``save_every_epoch`` requests the same saves as pure
effects. It decides from the epoch number alone, which is identical on every
rank, so every rank requests the same collective saves.
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.codec import register
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.hook import hook_factory
from pimm_fn.hooks._validate import int_at_least

__all__ = ["save_every_epoch", "EpochSaveState"]


@register
@attrs.frozen
class EpochSaveState:
    """``last_saved``: the global step of the last save requested (-1 before any)."""

    last_saved: int = -1


def _optional_int_at_least_1(instance, attribute, value):
    if value is not None:
        int_at_least(1)(instance, attribute, value)


@attrs.frozen(repr=False)
class _SaveEveryEpoch:
    factory_name: ClassVar[str] = "save_every_epoch"
    events: ClassVar[tuple] = (ev.AfterEpoch, ev.AfterTrain)
    emits: ClassVar[tuple] = (SaveCheckpoint,)
    rank_consistent: ClassVar[bool] = True  # decides from the epoch number alone
    every_epochs: int = attrs.field(alias="every", validator=int_at_least(1))  # not the AfterStep 'every'
    snapshot_every: int | None = attrs.field(default=None, validator=_optional_int_at_least_1)

    def __attrs_post_init__(self):
        # A snapshot is a copy of a save, so it can only fall on a save epoch.
        if self.snapshot_every is not None and self.snapshot_every % self.every_epochs:
            raise ValueError(
                f"save_every_epoch: 'snapshot_every' must be a multiple of 'every'={self.every_epochs} "
                f"(got {self.snapshot_every})"
            )

    def init(self) -> EpochSaveState:
        return EpochSaveState()

    def _save(self, state, *, snapshot=False, final=False):
        step = state.progress.global_step
        # An epoch-end save runs after the epoch's other effects (evaluation, logs), as save_every's does.
        effect = SaveCheckpoint(step, snapshot=snapshot, final=final, deferred=not final)
        return state.with_slot(EpochSaveState(step)), (effect,)

    def __call__(self, state, event):
        match event:
            case ev.AfterEpoch(epoch=epoch) if (epoch + 1) % self.every_epochs == 0:
                snapshot = self.snapshot_every is not None and (epoch + 1) % self.snapshot_every == 0
                return self._save(state, snapshot=snapshot)
            case ev.AfterTrain():
                step = state.progress.global_step
                if step > 0 and state.slot.last_saved != step:
                    return self._save(state, final=True)
        return state, ()

    def __repr__(self):
        extra = f", snapshot_every={self.snapshot_every}" if self.snapshot_every is not None else ""
        return f"save_every_epoch({self.every_epochs}{extra})"


@hook_factory
def save_every_epoch(every: int = 1, *, snapshot_every: int | None = None):
    """Save a checkpoint at the end of every ``every``-th epoch, and once after training.

    The save is requested at ``AfterEpoch``, so it executes after the
    epoch's evaluation (when the evaluator comes first in the hook list) and
    records it. Epochs count from 0, so ``every=2`` saves after epochs 1, 3,
    5 ... The final save is skipped when the last save already holds the
    final step, so no step is saved twice. With ``iters_per_epoch`` steps per
    epoch and no snapshots, it plans exactly as
    ``save_every(every * iters_per_epoch)``.

    Args:
        every: epochs between saves (>= 1).
        snapshot_every: also keep an ``iter_<step>`` copy every this many
            epochs (a multiple of ``every``); ``None`` keeps none. pimm's
            ``CheckpointSaver(save_freq=N)`` is ``save_every_epoch(1, snapshot_every=N)``.

    Emits:
        ``SaveCheckpoint(step, snapshot, final)`` (collective).

    State:
        ``EpochSaveState(last_saved)``.

    >>> save_every_epoch(), save_every_epoch(1, snapshot_every=5)
    (save_every_epoch(1), save_every_epoch(1, snapshot_every=5))
    >>> save_every_epoch(2, snapshot_every=3)
    Traceback (most recent call last):
    ValueError: save_every_epoch: 'snapshot_every' must be a multiple of 'every'=2 (got 3)
    """
    return _SaveEveryEpoch(every, snapshot_every)
