"""A hook that lets the model itself take part in the loop."""

from typing import Any, ClassVar

import attrs

from pimm_fn.core.hook_list import hook_factory

__all__ = ["model_hook"]


@attrs.frozen(repr=False)
class _ModelHook:
    """Unbound: emits nothing. ``loop`` binds it to the run's model."""

    factory_name: ClassVar[str] = "model_hook"

    def __call__(self, state, event):
        return state, ()

    def bind(self, model) -> "_BoundModelHook":
        return _BoundModelHook(model)

    def __repr__(self):
        return "model_hook()"


@attrs.frozen(repr=False, eq=False)
class _BoundModelHook:
    model: Any

    def __call__(self, state, event):
        on_event = getattr(self.model, "on_event", None)
        result = on_event(state, event) if callable(on_event) else None
        return (state, ()) if result is None else result

    def __repr__(self):
        return "model_hook()"


@hook_factory
def model_hook() -> _ModelHook:
    """Let a model that implements the hook protocol take part in the loop.

    ``loop`` binds this hook to its model (unwrapped from DDP): at every event
    it calls ``model.on_event(state, event)``, which returns ``None`` (nothing
    to do) or ``(state, effects)`` like any hook, the model's slot being
    ``state.slot``. A model without ``on_event`` is left alone. In ``plan``
    and the simulator, where there is no model, it emits nothing.

    >>> model_hook()
    model_hook()
    """
    return _ModelHook()
