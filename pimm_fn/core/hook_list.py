"""A list of hooks as a whole: checked before anything runs it, and what its hooks declare and provide together.

``loop(hooks=)``, ``chain(...)`` and ``Loop.replace`` pass their hooks
through ``check_hooks``: an object declaring ``as_hook()`` is replaced by the
hook it stands for, an uncalled factory (marked by ``hook_factory``) or a
non-callable is refused with advice, and two hooks with one identity
(``pimm_fn.core.hook.key``) are a ``DuplicateHookError``, since checkpoints
keep hook slots by identity.

What a list declares as one hook (a ``chain``'s subscription: ``union_events``,
``common_every``, ``union_emits``, from its parts' ``Declared`` values), and
what its hooks provide at any depth (``evaluators``, ``averages``,
``evaluated_averages``, ``saves_in_background``, ``emits_any``), read as
``pimm_fn.core.hook`` reads one hook.

>>> from pimm_fn.hooks import save_every
>>> check_hooks([save_every(2)])
(save_every(2),)
>>> check_hooks([save_every(2), save_every(2)])
Traceback (most recent call last):
...
pimm_fn.core.hook_list.DuplicateHookError: 'hooks' holds two hooks with the identity 'save_every(2)' ...
"""

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from pimm_fn.core.hook import Declared, declared, key, leaves

__all__ = [
    "check_hooks",
    "hook_factory",
    "DuplicateHookError",
    "union_events",
    "common_every",
    "union_emits",
    "evaluators",
    "averages",
    "evaluated_averages",
    "saves_in_background",
    "emits_any",
]

_F = TypeVar("_F", bound=Callable[..., Any])


class DuplicateHookError(ValueError):
    """Two hooks of one list share an identity, so their checkpointed slots could not be told apart."""


def hook_factory(fn: _F) -> _F:
    """Mark ``fn`` as a factory of hooks, so a hook list holding ``fn`` itself is refused with advice.

    >>> @hook_factory
    ... def every_other(): ...
    >>> every_other.hook_factory
    True
    """
    setattr(fn, "hook_factory", True)  # a mark on any callable, which its type does not declare
    return fn


def check_hooks(hooks: object, where: str = "hooks") -> tuple[Any, ...]:
    """``hooks`` as a tuple, refused with advice when it is not a list of hooks.

    An object declaring ``as_hook()`` (not callable itself) is replaced by the hook it declares.

    Raises:
        TypeError: not a list or tuple, an uncalled factory, or a non-callable.
        DuplicateHookError: two hooks with the same identity.
    """
    if not isinstance(hooks, (list, tuple)):
        single = " (a single hook: wrap it in a list, [hook])" if callable(hooks) else ""
        raise TypeError(
            f"'{where}' must be a list or tuple of hooks, run in that order (got {type(hooks).__name__}{single})"
        )
    hooks = tuple(_as_hook(h) for h in hooks)
    for position, hook in enumerate(hooks):
        if getattr(hook, "hook_factory", False) is True:
            name = getattr(hook, "__name__", repr(hook))
            raise TypeError(f"'{where}' holds the hook factory {name} itself: call it to make a hook, e.g. {name}(...)")
        if not callable(hook):
            raise TypeError(
                f"'{where}' position {position}: a hook must be callable as hook(state, event) (got {hook!r:.80})"
            )
    _refuse_duplicates(hooks, where)
    return tuple(hooks)


def _as_hook(item: Any) -> Any:
    """``item``, or the hook it declares it stands for (``as_hook()``) when it is not callable itself."""
    convert = getattr(item, "as_hook", None)
    return convert() if not callable(item) and callable(convert) else item


def _refuse_duplicates(hooks: Iterable[Any], where: str) -> None:
    seen: dict[str, int] = {}
    for position, hook in enumerate(hooks):
        name = key(hook)
        if name in seen:
            fix = getattr(hook, "duplicate_fix", None)
            raise DuplicateHookError(
                f"'{where}' holds two hooks with the identity {name!r} (positions {seen[name]} and {position}): "
                f"checkpoints keep hook slots by identity, so each needs its own. Drop the repeat, or "
                + (fix if isinstance(fix, str) else "name one: pimm_fn.chain(hook, name='...')")
            )
        seen[name] = position


# -- what the list declares as one hook (a chain) ------------------------------------------------
def union_events(parts: Sequence[Declared]) -> tuple[type, ...] | None:
    """The events a composite of ``parts`` (``Declared`` values) is called for; ``(object,)``: every one, opt-in too."""
    if any(d.events is None for d in parts):
        named_opt_in = any(getattr(t, "opt_in", False) for d in parts for t in d.events or ())
        return (object,) if named_opt_in else None
    return tuple(dict.fromkeys(t for d in parts for t in d.events or ()))  # every part's is a tuple here


def common_every(parts: Iterable[Declared], after_step: type) -> int:
    """The cadence a composite needs so that each part's ``AfterStep`` cadence still fires.

    ``after_step`` is the ``AfterStep`` event class (passed in to keep this module event-free).
    """
    cadences = [d.every for d in parts if d.wants(after_step)]
    return math.gcd(*cadences) if cadences else 1


def union_emits(parts: Sequence[Declared]) -> tuple[type, ...] | None:
    """The effects a composite of ``parts`` may emit; ``None``: unknown, when a part's are."""
    if any(d.emits is None for d in parts):
        return None
    return tuple(dict.fromkeys(t for d in parts for t in d.emits or ()))  # every part's is a tuple here


# -- what its hooks provide, at any depth ---------------------------------------------------------
def evaluators(hooks: Iterable[Any]) -> dict[str, Callable[..., Any]]:
    """``{name: fn}`` of every evaluator the hooks provide, nested chains included.

    Raises:
        ValueError: two different callables share a name.
    """
    found: dict[str, Callable[..., Any]] = {}
    for hook in leaves(hooks):
        provide = getattr(hook, "evaluators", None)
        for name, fn in (provide() if callable(provide) else {}).items():
            if name in found and found[name] is not fn:
                raise ValueError(
                    f"two evaluators are named {name!r}, so their metrics and effects could not be told apart: "
                    f"give each its own name, evaluate_every(n, fn, name='...')"
                )
            found[name] = fn
    return found


def averages(hooks: Iterable[Any]) -> dict[str, float]:
    """``{name: decay}`` of every weight average the hooks keep, nested chains included.

    Raises:
        ValueError: two hooks keep an average of the same name.
    """
    found: dict[str, float] = {}
    for hook in leaves(hooks):
        provide = getattr(hook, "averages", None)
        for name, decay in (provide() if callable(provide) else {}).items():
            if name in found:
                raise ValueError(
                    f"two hooks keep a weight average named {name!r}: give each ema(..., name=...) its own"
                )
            found[name] = decay
    return found


def evaluated_averages(hooks: Iterable[Any]) -> list[tuple[str, str]]:
    """``(hook key, average name)`` for each hook evaluating an average's weights (``weights=``), in order."""
    return [(key(h), h.weights) for h in leaves(hooks) if isinstance(getattr(h, "weights", None), str)]


def saves_in_background(hooks: Iterable[Any]) -> bool:
    """Whether some hook, at any depth, declares that it saves asynchronously (``async_save``)."""
    return any(getattr(h, "async_save", False) is True for h in leaves(hooks))


def emits_any(hooks: Iterable[Any], effect_type: type | tuple[type, ...]) -> bool:
    """Whether some hook, at any depth, declares in ``emits`` that it may emit ``effect_type`` (or a subclass).

    A hook whose ``emits`` is unknown (not declared) counts as not emitting it.

    >>> from pimm_fn.hooks import save_every
    >>> from pimm_fn.core.effects import SaveCheckpoint, WriteBest
    >>> emits_any([save_every(2)], SaveCheckpoint), emits_any([save_every(2)], WriteBest)
    (True, False)
    """
    for hook in leaves(hooks):
        if declared(hook).may_emit(effect_type):
            return True
    return False
