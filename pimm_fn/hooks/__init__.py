"""Built-in hooks: pure, frozen, validated at construction."""

from pimm_fn.hooks.checkpointing import BestState, SaveEveryState, best_on, save_every
from pimm_fn.hooks.control import EarlyStopState, early_stop, step_scheduler
from pimm_fn.hooks.ema import ema
from pimm_fn.hooks.evaluation import evaluate_every
from pimm_fn.hooks.logs import LogState, log_every
from pimm_fn.hooks.model import model_hook
from pimm_fn.hooks.profiler import profile
from pimm_fn.hooks.warm_start import load_weights

__all__ = [
    "save_every",
    "SaveEveryState",
    "best_on",
    "BestState",
    "load_weights",
    "evaluate_every",
    "log_every",
    "LogState",
    "model_hook",
    "early_stop",
    "EarlyStopState",
    "step_scheduler",
    "ema",
    "profile",
]
