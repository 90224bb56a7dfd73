"""pimm_fn: a functional, compositional training loop for PyTorch.

Hooks are pure functions ``(state, event) -> (state, effects)``; the loop
runs them in order and executes their effects in one deterministic pass, so
what every rank will do is a value you can plan, simulate and test.

    >>> import pimm_fn as pf
    >>> [e.step for e in pf.plan([pf.save_every(4)], iters_per_epoch=10, max_epochs=3)]
    [4, 8, 12, 16, 20, 24, 28, 30]

``import pimm_fn``, ``plan``, the hooks, events and effects need no torch;
``loop`` and the runtime import it on first use.
"""

import importlib

__version__ = "0.1.0"

from pimm_fn.core import effects, events
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Scope
from pimm_fn.core.fold import Chain, TraceEntry, chain
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import DuplicateHookError, hook_factory
from pimm_fn.core.outputs import StepOutputs, StepOutputsClosed
from pimm_fn.core.plan import plan
from pimm_fn.core.retention import any_of, keep_best, keep_every, keep_last
from pimm_fn.core.state import Progress, State
from pimm_fn.core.step_state import StepState
from pimm_fn.hooks import (
    BestState,
    EarlyStopState,
    LogState,
    SaveEveryState,
    best_on,
    early_stop,
    ema,
    evaluate_every,
    load_weights,
    log_every,
    model_hook,
    profile,
    save_every,
    step_scheduler,
)

_RUNTIME = {
    "loop": "pimm_fn.runtime.engine.loop",
    "Loop": "pimm_fn.runtime.engine.loop",
    "train_step": "pimm_fn.runtime.step.train_step",
    "EmaWeights": "pimm_fn.runtime.handlers.ema",
    "TrainStep": "pimm_fn.runtime.step.configurable",
    "CollectiveDivergenceError": "pimm_fn.runtime.errors",
    "ResumeError": "pimm_fn.runtime.errors",
    "CheckpointError": "pimm_fn.checkpoint.errors",
    "SaveDirLockError": "pimm_fn.checkpoint.errors",
    "ResumeNotExactWarning": "pimm_fn.runtime.errors",
    "MissingHandlerError": "pimm_fn.runtime.errors",
    "ConfigurationWarning": "pimm_fn.runtime.errors",
    "PeerFailureError": "pimm_fn.runtime.errors",
    "ReplicaError": "pimm_fn.runtime.errors",
    "NonFiniteLossError": "pimm_fn.runtime.errors",
    "NonFiniteLossWarning": "pimm_fn.runtime.errors",
    "History": "pimm_fn.runtime.logs.history",
    "JsonlLogger": "pimm_fn.runtime.logs.loggers",
    "CSVLogger": "pimm_fn.runtime.logs.loggers",
    "TensorBoardLogger": "pimm_fn.runtime.logs.trackers",
    "WandbLogger": "pimm_fn.runtime.logs.trackers",
    "MLFlowLogger": "pimm_fn.runtime.logs.trackers",
    "Saving": "pimm_fn.checkpoint.saving",
    "Resuming": "pimm_fn.runtime.engine.options",
    "Watching": "pimm_fn.runtime.engine.options",
    "Parallel": "pimm_fn.runtime.engine.options",
    "FaultTolerance": "pimm_fn.runtime.engine.options",
    "Training": "pimm_fn.runtime.engine.options",
    "loader_evaluator": "pimm_fn.runtime.evaluation.loader_evaluator",
    "LoaderEvaluator": "pimm_fn.runtime.evaluation.loader_evaluator",
    "Preemption": "pimm_fn.runtime.engine.options",
    "Preempted": "pimm_fn.runtime.errors",
}

__all__ = [
    "compat",
    "checkpoint",
    "effects",
    "events",
    "register_slot_type",
    "Scope",
    "Chain",
    "TraceEntry",
    "chain",
    "DuplicateHookError",
    "hook_factory",
    "FrozenMap",
    "StepOutputs",
    "StepOutputsClosed",
    "plan",
    "keep_last",
    "keep_every",
    "keep_best",
    "any_of",
    "Progress",
    "State",
    "StepState",
    "save_every",
    "SaveEveryState",
    "best_on",
    "BestState",
    "evaluate_every",
    "load_weights",
    "log_every",
    "LogState",
    "model_hook",
    "early_stop",
    "EarlyStopState",
    "step_scheduler",
    "ema",
    "profile",
    *_RUNTIME,
]


_SUBPACKAGES = ("compat", "checkpoint")  # ``pf.checkpoint.load_weights_file``: imported when first named


def __getattr__(name):
    """Import the torch-dependent runtime, ``checkpoint``, or the pimm plug-in ``compat``, only when first used."""
    if name in _SUBPACKAGES:  # compat, a plug-in, is never imported by pimm_fn itself
        value = importlib.import_module(f"pimm_fn.{name}")
        globals()[name] = value
        return value
    module = _RUNTIME.get(name)
    if module is None:
        raise AttributeError(f"module 'pimm_fn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
