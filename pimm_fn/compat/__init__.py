"""Adapters that keep pimm configs and class-based hooks usable in pimm_fn.

* ``adapt`` runs a ``HookBase`` subclass's methods at their events with a
  read-only ``TrainerView`` as ``self.trainer``;
* ``save_every_epoch`` is the epoch cadence of pimm's ``CheckpointSaver``.
"""

from pimm_fn.compat.hookbase import HookBase, TrainerView, adapt
from pimm_fn.compat.saving import EpochSaveState, save_every_epoch

__all__ = ["HookBase", "TrainerView", "adapt", "save_every_epoch", "EpochSaveState"]
