"""What a hook returns, checked: ``(State, effects)`` from a call, ``(slot, State, effects)`` from ``update``.

The fold checks the common answer (the state unchanged, no effects) inline
and hands anything else here, so a hook returning the wrong shape fails at
once with an error naming the hook and what came back.

>>> from pimm_fn.core.state import Progress, State
>>> checked_result("my_hook", (State(Progress(2, 1)), ()))[1]
()
>>> checked_result("my_hook", None)
Traceback (most recent call last):
...
TypeError: hook 'my_hook' must return (State, tuple_of_effects) (got NoneType: None)
"""

from typing import Any

from pimm_fn.core.effects import Effect
from pimm_fn.core.state import State
from pimm_fn.core.step_state import StepState

__all__ = ["checked_result", "checked_update"]


def checked_result(hook: Any, result: Any) -> tuple[State, tuple[Effect, ...]]:
    """``result`` of ``hook(state, event)``, checked: ``(State, tuple_of_effects)``."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], (State, StepState))):
        raise TypeError(
            f"hook {hook!r} must return (State, tuple_of_effects) (got {type(result).__name__}: {result!r:.200})"
        )
    _check_effects(hook, result[1], " must return")
    return result


def checked_update(hook: Any, result: Any) -> tuple[Any, State, tuple[Effect, ...]]:
    """``result`` of ``hook.update``, checked: ``(slot, State, tuple_of_effects)``."""
    if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[1], (State, StepState))):
        raise TypeError(
            f"hook {hook!r}: update(slot, state, event) must return (slot, State, tuple_of_effects) "
            f"(got {type(result).__name__}: {result!r:.200})"
        )
    _check_effects(hook, result[2], ": update must return")
    return result


def _check_effects(hook: Any, effects: Any, must: str) -> None:
    if not isinstance(effects, tuple) or not all(isinstance(e, Effect) for e in effects):
        raise TypeError(f"hook {hook!r}{must} a tuple of Effect values as effects (got {effects!r:.200})")
