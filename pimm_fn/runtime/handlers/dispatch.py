"""Which handler executes each built-in effect: the default table, a run's own handlers over it, and ``Call``'s.

``loop(handlers={EffectType: fn})`` replaces or adds a handler; a ``Log``
handler of the user's is wrapped in ``RecordedLog`` so the run still keeps
each record. ``Call`` names a function of the user's (``"module:qualname"``),
imported when the effect runs.
"""

import importlib
from collections.abc import Callable
from typing import Any

from pimm_fn.core.effects import Call, Effect, Evaluate, LoadWeights, Log, SaveCheckpoint, WriteBest
from pimm_fn.hooks.progress import ShowProgress
from pimm_fn.runtime.handlers.checkpointing import save_checkpoint, write_best
from pimm_fn.runtime.handlers.control import CONTROL_HANDLERS
from pimm_fn.runtime.handlers.ema import EMA_HANDLERS
from pimm_fn.runtime.handlers.evaluation import evaluate
from pimm_fn.runtime.handlers.logs import RecordedLog, log
from pimm_fn.runtime.handlers.profiler import profiler_handlers
from pimm_fn.runtime.handlers.progress import show_progress
from pimm_fn.runtime.handlers.warm_start import load_weights

__all__ = [
    "DEFAULT_HANDLERS",
    "run_handlers",
    "save_checkpoint",
    "write_best",
    "evaluate",
    "log",
    "RecordedLog",
    "load_weights",
    "call",
    "resolve",
]


_MISSING = object()


def resolve(effect: Call) -> Callable[..., Any]:
    """The callable ``effect.function`` names (``"module:qualname"``), its module imported if need be.

    Raises:
        LookupError: the module cannot be imported, holds no such name, or
            the name is not callable; saying which, and the fix.
    """
    module, _, qualname = effect.function.partition(":")
    fix = "name a function defined at the top level of a module; Call.of(fn, step) writes its name"
    try:
        found: object = importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise LookupError(f"{effect!r}: module {module!r} cannot be imported ({error}): {fix}") from None
    for name in qualname.split("."):
        inner = getattr(found, name, _MISSING)
        if inner is _MISSING:
            raise LookupError(
                f"{effect!r}: {getattr(found, '__name__', found)!r} has no attribute {name!r}, so "
                f"{effect.function!r} names nothing: {fix}"
            )
        found = inner
    if not callable(found):
        raise LookupError(
            f"{effect!r}: {effect.function!r} names {found!r:.60} ({type(found).__name__}), not a function: {fix}"
        )
    return found


def call(effect: Call, state, ctx) -> tuple:
    """``fn(state, ctx, *args, **kwargs)`` of the function ``effect`` names; what it returns is not used (see ``Call``)."""
    resolve(effect)(state, ctx, *effect.args, **effect.kwargs)
    return ()


DEFAULT_HANDLERS: dict[type[Effect], Callable[..., Any]] = {
    SaveCheckpoint: save_checkpoint,
    WriteBest: write_best,
    Evaluate: evaluate,
    Log: log,
    LoadWeights: load_weights,
    Call: call,
    **CONTROL_HANDLERS,
    **EMA_HANDLERS,
    ShowProgress: show_progress,
}


def run_handlers(given) -> dict:
    """The run's handlers: the defaults, overridden or added to by ``given`` (a user's ``Log`` handler recorded)."""
    given = dict(given or {})
    if Log in given and given[Log] is not log and not isinstance(given[Log], RecordedLog):
        given[Log] = RecordedLog(given[Log])
    return {**DEFAULT_HANDLERS, **profiler_handlers(), **given}  # a profiler of its own for each run
