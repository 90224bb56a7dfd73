"""What an adapted pimm hook sees as ``self.trainer``: a read-only ``TrainerView`` of the state.

Progress, metrics and the step's scalar outputs, no model, optimizer or
config: setting or deleting anything raises with what to do instead
(return effects). ``pimm_fn.compat.hookbase`` sets it while a method runs.
"""

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.frozen import FrozenMap, freeze

__all__ = ["TrainerView"]

_READ_ONLY = (
    "an adapted hook cannot change training through self.trainer: return a tuple of effects from the method "
    "(e.g. (SaveCheckpoint(self.trainer.global_step),)) or rewrite it as a pure hook (state, event) -> (state, effects)"
)


@attrs.frozen
class TrainerView:
    """What an adapted hook sees as ``self.trainer``: a read-only view of the state.

    Attributes:
        epoch, max_epoch: the current epoch (0-based) and the number of epochs.
        iter: pimm's ``comm_info["iter"]``: the 0-based index in the epoch of
            the step running (``before_step``/``after_step``) or last run.
        global_step: optimizer steps completed (``after_step`` of the first
            step sees 1, its ``before_step`` 0).
        iters_per_epoch, rank, world_size: the schedule and this process.
        metrics, best: the latest published metrics and the best values.
        comm_info: the step's scalar outputs at ``after_step``, else empty.
    """

    epoch: int
    max_epoch: int
    iter: int
    global_step: int
    iters_per_epoch: int
    rank: int
    world_size: int
    metrics: FrozenMap = attrs.field(converter=freeze)
    best: FrozenMap = attrs.field(converter=freeze)
    comm_info: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)

    def __getattr__(self, name):
        # Only reached for names the view lacks (model, optimizer, cfg, storage ...).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"TrainerView has no {name!r}: an adapted hook sees progress, metrics and step outputs only; "
            f"request work on the model as effects (Evaluate, SaveCheckpoint, Log), or let the model "
            f"take part itself with model_hook()"
        )

    @classmethod
    def of(cls, state, event) -> "TrainerView":
        """The view of ``state`` while ``event`` is handled."""
        p = state.progress
        # pimm's iter is the index of the step in hand: before it runs, the steps done so far.
        index = p.iter_in_epoch if isinstance(event, ev.BeforeStep) else max(p.iter_in_epoch - 1, 0)
        outputs = event.outputs if isinstance(event, ev.AfterStep) else FrozenMap()
        return cls(p.epoch, p.max_epochs, index, p.global_step, p.iters_per_epoch, state.rank, state.world_size,
                   state.metrics, state.best, outputs)


def _refuse(self, name, value):
    raise AttributeError(f"TrainerView is read-only: cannot set {name!r}; {_READ_ONLY}")


def _refuse_delete(self, name):
    raise AttributeError(f"TrainerView is read-only: cannot delete {name!r}; {_READ_ONLY}")


# Replaces attrs' generic FrozenInstanceError with a message that says what to do instead.
TrainerView.__setattr__ = _refuse
TrainerView.__delattr__ = _refuse_delete
