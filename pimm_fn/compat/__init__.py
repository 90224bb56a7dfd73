"""Adapters that keep pimm configs and class-based hooks usable in pimm_fn.

* ``build_hooks`` turns pimm's ``hooks=[dict(type=...), ...]`` list into
  pimm_fn hooks through an immutable ``HookRegistry``;
* ``adapt`` runs a ``HookBase`` subclass's methods at their events with a
  read-only ``TrainerView`` as ``self.trainer``;
* ``save_every_epoch`` is the epoch cadence of pimm's ``CheckpointSaver``.

    >>> import pimm_fn as pf
    >>> from pimm_fn.compat import build_hooks
    >>> hooks = build_hooks([dict(type="IterationTimer", warmup_iter=2), dict(type="CheckpointSaver")])
    >>> hooks
    [ignored('IterationTimer', warmup_iter=2), save_every_epoch(1)]
    >>> [e.step for e in pf.plan(hooks, iters_per_epoch=10, max_epochs=3)]
    [10, 20, 30]
"""

from pimm_fn.compat.hookbase import HookBase, TrainerView, adapt
from pimm_fn.compat.registry import DEFAULT_REGISTRY, HookRegistry, build_hooks, ignored, register_hook
from pimm_fn.compat.saving import EpochSaveState, save_every_epoch

__all__ = [
    "build_hooks",
    "HookRegistry",
    "DEFAULT_REGISTRY",
    "register_hook",
    "ignored",
    "HookBase",
    "TrainerView",
    "adapt",
    "save_every_epoch",
    "EpochSaveState",
]
