"""A hook that lets the model itself take part in the loop."""

from typing import ClassVar

import attrs

from pimm_fn.core.effects import NotifyModel

__all__ = ["model_hook"]


@attrs.frozen(repr=False)
class _ModelHook:
    factory_name: ClassVar[str] = "model_hook"

    def __call__(self, state, event):
        return state, (NotifyModel(event),)

    def __repr__(self):
        return "model_hook()"


def model_hook():
    """Deliver every event to the model's ``on_event(state, event)`` method.

    The model (unwrapped from DDP) may define ``on_event``; what it returns,
    ``None`` or a tuple of effects, is executed right after. A model without
    ``on_event`` is left alone. The call is a rank-local effect, so the
    model's own code stays at the impure edge, where it belongs.

    Emits:
        ``NotifyModel(event)`` (local) for every event.

    >>> model_hook()
    model_hook()
    """
    return _ModelHook()
