"""pimm users move over with their configs, class-based hooks and checkpoints.

* ``build_hooks`` turns pimm's ``hooks=[dict(type=...), ...]`` into pimm_fn
  hooks with pimm's semantics (``pimm_fn.compat.build`` lists every type),
  after pimm's ``hooks_override`` and ``--options`` (``apply_options`` for a
  whole config);
* hooks needing the model, optimizer or clock emit the effects of
  ``pimm_fn.compat.effects``, carried out by ``HANDLERS``:
  ``pf.loop(..., handlers=compat.HANDLERS)``;
* a class-based hook (pimm's ``HookBase``) runs through ``adapt``; ``pf.loop``
  and ``build_hooks`` accept one directly (a ``HookBase`` carries its adapter,
  ``as_hook()``: nothing in pimm_fn's core is filled when this package is imported);
* pimm's checkpoints (``last/`` with ``weights.pth`` + ``trainer.dcp/``,
  ``model_last.pth``) resume with ``pf.loop(resume=<path or "auto">,
  handlers=HANDLERS)`` (its ``LoadWeights`` handler is their reader,
  ``pimm_fn.checkpoint.discovery``) and warm-start with ``CheckpointLoader``
  (``pimm_fn.compat.checkpoints``).

    >>> import pimm_fn as pf
    >>> from pimm_fn.compat import build_hooks
    >>> hooks = build_hooks([dict(type="IterationTimer", warmup_iter=2), dict(type="CheckpointSaver", save_freq=4)])
    >>> hooks
    [iteration_timer(2), checkpoint_saver(save_freq=4)]
    >>> [(e.step, type(e.event).__name__) for e in pf.plan(hooks[1:], iters_per_epoch=10, max_epochs=3)][:4]
    [(4, 'AfterStep'), (8, 'AfterStep'), (12, 'AfterStep'), (16, 'AfterStep')]

The torch-dependent parts (``HANDLERS``, ``split_weight_decay``,
``translate``, ``read_pimm_checkpoint`` ...) are imported on first use.
"""

import importlib

from pimm_fn.compat.build import DEFAULT_REGISTRY, HookRegistry, build_hooks, register_hook
from pimm_fn.compat.evaluators import final_evaluator, pimm_evaluator
from pimm_fn.compat.hookbase import HookBase, TrainerView, adapt, adapted
from pimm_fn.compat.logs import WriterState, information_writer, iteration_timer, wandb_namer
from pimm_fn.compat.model_hooks import (
    attention_mask_annealing,
    dtype_overrider,
    garbage_handler,
    gradient_norm_logger,
    parameter_counter,
    pimm_model_hook,
)
from pimm_fn.compat.monitors import ProfilerState, push_to_hub, resource_utilization_logger, runtime_profiler
from pimm_fn.compat.options import apply_options, override_hooks, parse_options
from pimm_fn.compat.saving import (
    PIMM_BEST,
    PimmSaveState,
    checkpoint_format,
    checkpoint_saver,
    checkpoint_saver_iteration,
)
from pimm_fn.compat.type_factories import REFUSED
from pimm_fn.compat.warm_start import checkpoint_loader
from pimm_fn.compat.weight_decay import weight_decay_exclusion, weight_decay_scheduler

_RUNTIME = {
    "HANDLERS": "pimm_fn.compat.handlers",
    "split_weight_decay": "pimm_fn.compat.weight_decay",
    "translate": "pimm_fn.compat.checkpoints",
    "read_pimm_checkpoint": "pimm_fn.compat.reading",
    "latest_pimm_checkpoint": "pimm_fn.compat.reading",
    "load_pimm_weights": "pimm_fn.compat.warm_start",
    "PimmCheckpointError": "pimm_fn.compat.reading",
}

__all__ = [
    "build_hooks",
    "HookRegistry",
    "DEFAULT_REGISTRY",
    "REFUSED",
    "register_hook",
    "apply_options",
    "override_hooks",
    "parse_options",
    "checkpoint_format",
    "HookBase",
    "TrainerView",
    "adapt",
    "adapted",
    "checkpoint_saver",
    "checkpoint_saver_iteration",
    "checkpoint_loader",
    "PimmSaveState",
    "PIMM_BEST",
    "pimm_evaluator",
    "final_evaluator",
    "information_writer",
    "WriterState",
    "iteration_timer",
    "wandb_namer",
    "gradient_norm_logger",
    "parameter_counter",
    "weight_decay_exclusion",
    "weight_decay_scheduler",
    "attention_mask_annealing",
    "dtype_overrider",
    "garbage_handler",
    "pimm_model_hook",
    "resource_utilization_logger",
    "runtime_profiler",
    "ProfilerState",
    "push_to_hub",
    *_RUNTIME,
]


def __getattr__(name):
    """Import the torch-dependent parts only when one of their names is used."""
    module = _RUNTIME.get(name)
    if module is None:
        raise AttributeError(f"module 'pimm_fn.compat' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
