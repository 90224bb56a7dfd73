"""Hooks for the kit's own tests, including one broken on purpose."""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint


@attrs.frozen(repr=False)
class SaveOnImprovement:
    """BROKEN on purpose: a collective save decided from this rank's own metrics.

    With ``evaluate_every(..., broadcast=False)`` each rank publishes what it
    computed itself, so ranks disagree on whether to save.
    """

    events: ClassVar[tuple] = (ev.MetricsPublished,)
    metric: str = "mIoU"

    def init(self):
        return None  # the best value this rank has seen

    def __call__(self, state, event):
        value = event.values.get(self.metric)
        if value is None or (state.slot is not None and not value > state.slot):
            return state, ()
        return state.with_slot(value), (SaveCheckpoint(state.progress.global_step),)

    def __repr__(self):
        return f"save_on_improvement({self.metric!r})"


def miou(model):
    return None
