"""Adapters that keep pimm configs and class-based hooks usable in pimm_fn.

* ``save_every_epoch`` is the epoch cadence of pimm's ``CheckpointSaver``.
"""

from pimm_fn.compat.saving import EpochSaveState, save_every_epoch

__all__ = ["save_every_epoch", "EpochSaveState"]
