"""The hook protocol: what a hook is, what it may declare, and the one place that reads it.

A hook is any callable ``hook(state, event) -> (state, effects)``. Beyond
that it may declare, as attributes, what the loop, ``plan``, the simulator
and the agreement guard need to know about it. Every one is optional:

==================  =========================================================
``init()``          its initial slot (default: ``None``).
``update``          ``update(slot, state, event) -> (slot, state, effects)``,
                    called instead of ``hook(state, event)``: the slot passed
                    apart (as optax's states), so no ``State`` is built for
                    it; ``state.slot`` is then not its slot.
``events``          the event types it is called for (default: every event
                    but the opt-in ones, ``Elapsed``, which go only to hooks naming them).
``every``           its ``AfterStep`` cadence: called for ``AfterStep(step)``
                    only when ``step % every == 0`` (default 1). The fold
                    enforces it, as Ignite's ``every=`` filter does, so the
                    hook need not test the step again.
``accumulate``      ``accumulate(slot, outputs) -> slot``: folds the outputs
                    of an ``AfterStep`` its cadence skips into its slot
                    (a running loss sum); called only for non-empty outputs.
``accumulate_all``  ``(slot, outputs_seq) -> slot``: ``accumulate`` over each
                    in order, in one call (quiet steps' outputs, read at once).
``reads_outputs``   True when, called for ``AfterStep``, it reads the step's
                    outputs every time (a logger), or its slot's sums of them:
                    the loop then reads them up front, with the outputs of
                    the quiet steps before, in one transfer. Default: True for
                    a hook that declares ``accumulate``, else False, and the
                    outputs are read only if the hook asks for a value
                    (``pimm_fn.core.outputs``): a hook that never looks costs
                    no read off the device.
``rank_consistent`` True when its collective effects read nothing
                    rank-local, so the guard need not compare them per step.
``emits``           the effect types it may emit (default: unknown).
``reads_metrics``   the metric names it reacts to (``best_on("acc")``).
``evaluators()``    ``{name: fn}`` the interpreter runs for its ``Evaluate``.
``with_evaluator``  ``with_evaluator(name, fn) -> hook``: the same hook running
                    ``fn`` as evaluator ``name`` (a live run's fix).
``averages()``      ``{name: decay}`` of the weight averages it keeps
                    (``pimm_fn.ema``): the runtime holds one per name.
``weights``         the average an evaluator hook evaluates (``"ema"``), or ``None``.
``bind(model)``     the hook to use in a real run of ``model``.
``hook_key``        its stable identity, overriding the default below.
``duplicate_fix``   how to tell two of it apart, said when two share an
                    identity (``evaluate_every``: "give each its own name...").
``children``        the hooks of a composite (``chain``), walked by every
                    lookup, at any depth; ``with_children(hooks)``
                    rebuilds the composite around new children.
==================  =========================================================

An object that is not itself a hook (not callable) may stand in a hook list
when it declares ``as_hook()``, the hook to run in its place: a plug-in's
objects carry their own adapter (``pimm_fn.compat.HookBase`` declares one),
so the core keeps no list of adapters.

Identity (``key``): the ``hook_key`` it declares; else, for a function, its
module-qualified name; else its ``repr`` when that reads like a call
(``save_every(1000)``, an attrs class); else its class's qualified name.
Checkpoints key hook slots by it, and the guard compares it across ranks.

Nothing outside this module reads a hook's attributes, but
``pimm_fn.core.hook_list``, which reads a whole list: its checks (``as_hook``,
``duplicate_fix``, the ``hook_factory`` mark), what a composite of hooks
declares, and what the hooks provide together (evaluators, averages, ...).
"""

import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

__all__ = [
    "Declared",
    "declared",
    "key",
    "leaves",
    "children",
    "init_slot",
    "bind",
    "with_children",
    "with_evaluator",
]


def children(hook: Any) -> tuple[Any, ...] | None:
    """The hooks of a composite (``chain``), or ``None`` for a leaf."""
    found = getattr(hook, "children", None)
    return tuple(found) if found is not None else None


def leaves(hooks: Iterable[Any]) -> Iterator[Any]:
    """Every leaf hook of ``hooks``, depth first, through nested composites.

    >>> from pimm_fn.hooks import save_every, best_on
    >>> from pimm_fn.core.fold import chain
    >>> list(leaves([chain(save_every(2), chain(best_on("acc")))]))
    [save_every(2), best_on('acc')]
    """
    for hook in hooks:
        inner = children(hook)
        if inner is None:
            yield hook
        else:
            yield from leaves(inner)


def key(hook: Any) -> str:
    """The stable identity of ``hook``; see the module docstring.

    >>> from pimm_fn.hooks import save_every
    >>> key(save_every(1000))
    'save_every(1000)'
    >>> def progress(state, event): return state, ()
    >>> key(progress)
    'pimm_fn.core.hook.progress'
    """
    explicit = getattr(hook, "hook_key", None)
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit:
            raise TypeError(f"hook {hook!r:.80}: 'hook_key' must be a non-empty str (got {explicit!r})")
        return explicit
    if isinstance(hook, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"{hook.__module__}.{hook.__qualname__}"
    cls: type[object] = type(hook)  # not type[Any]: mypy reads that as the metaclass, binding __repr__ to it
    if cls.__repr__ is object.__repr__:
        return f"{cls.__module__}.{cls.__qualname__}"
    return repr(hook)


def init_slot(hook: Any) -> Any:
    """A hook's initial slot: ``hook.init()`` when it declares one, else ``None``."""
    init = getattr(hook, "init", None)
    return init() if callable(init) else None


@attrs.frozen
class Declared:
    """What a hook declares, read once and checked (see the module docstring).

    ``events`` is ``None`` for "every event", ``emits`` for "unknown".
    """

    key: str
    events: tuple[type, ...] | None
    every: int
    accumulate: Callable[[Any, Any], Any] | None
    rank_consistent: bool
    emits: tuple[type, ...] | None
    reads_metrics: tuple[str, ...]
    reads_outputs: bool = False
    update: Callable[[Any, Any, Any], Any] | None = (
        None  # ``update(slot, state, event)``, or ``None``: the hook is called as ``hook(state, event)``
    )
    accumulate_all: Callable[[Any, Sequence[Any]], Any] | None = (
        None  # ``accumulate_all(slot, outputs_seq)``, or ``None``: ``accumulate`` on each
    )

    def wants(self, event_type: type) -> bool:
        if self.events is None:
            return not getattr(event_type, "opt_in", False)
        return any(issubclass(event_type, t) for t in self.events)

    def may_emit(self, effect_type: type | tuple[type, ...]) -> bool:
        """Whether ``emits`` declares ``effect_type`` (or a subclass; a tuple of types: any). Undeclared: no."""
        return self.emits is not None and any(issubclass(t, effect_type) for t in self.emits)


def _every(hook: Any) -> int:
    every = getattr(hook, "every", 1)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"hook {hook!r:.80}: 'every' must be an int >= 1 (got {every!r})")
    return every


def _types(hook: Any, name: str) -> tuple[type, ...] | None:
    found = getattr(hook, name, None)
    if found is None:
        return None
    found = tuple(found)
    if not all(isinstance(t, type) for t in found):
        raise TypeError(f"hook {hook!r:.80}: '{name}' must be a tuple of classes (got {found!r:.120})")
    return found


def declared(hook: Any) -> Declared:
    """Read and check what ``hook`` declares.

    Raises:
        TypeError, ValueError: a declaration of the wrong type or range, naming it.
    """
    accumulate = getattr(hook, "accumulate", None)
    if accumulate is not None and not callable(accumulate):
        raise TypeError(f"hook {hook!r:.80}: 'accumulate' must be callable as accumulate(slot, outputs)")
    rank_consistent = getattr(hook, "rank_consistent", False)
    if not isinstance(rank_consistent, bool):
        raise TypeError(f"hook {hook!r:.80}: 'rank_consistent' must be a bool (got {rank_consistent!r})")
    reads = tuple(getattr(hook, "reads_metrics", ()))
    reads_outputs = getattr(hook, "reads_outputs", None)
    if reads_outputs is None:
        reads_outputs = accumulate is not None  # one that sums the outputs reads them; any other reads on demand
    if not isinstance(reads_outputs, bool):
        raise TypeError(f"hook {hook!r:.80}: 'reads_outputs' must be a bool (got {reads_outputs!r})")
    if not reads_outputs and accumulate is not None:
        raise TypeError(
            f"hook {hook!r:.80}: it declares reads_outputs=False but accumulates the step's outputs "
            f"('accumulate'): a hook that sums the outputs reads them; drop one of the two"
        )
    update, many = getattr(hook, "update", None), getattr(hook, "accumulate_all", None) if accumulate else None
    for name, fn, shape in (
        ("update", update, "(slot, state, event)"),
        ("accumulate_all", many, "(slot, outputs_seq)"),
    ):
        if fn is not None and not callable(fn):
            raise TypeError(f"hook {hook!r:.80}: '{name}' must be callable as {name}{shape} (got {fn!r:.80})")
    return Declared(
        key(hook),
        _types(hook, "events"),
        _every(hook),
        accumulate,
        rank_consistent,
        _types(hook, "emits"),
        reads,
        reads_outputs,
        update,
        many,
    )


def with_children(hook: Any, hooks: Iterable[Any]) -> Any:
    """The composite ``hook`` rebuilt around ``hooks`` (its name and kind kept)."""
    if children(hook) is None:
        raise TypeError(f"hook {hook!r:.80} is not a composite: it has no children to replace")
    return hook.with_children(tuple(hooks))


def with_evaluator(hook: Any, name: str, fn: Callable[..., Any]) -> Any:
    """``hook`` running ``fn`` as its evaluator ``name``, when it declares ``with_evaluator``.

    Raises:
        TypeError: the hook cannot swap its evaluator; replace the whole hook instead.
    """
    swap = getattr(hook, "with_evaluator", None)
    if not callable(swap):
        raise TypeError(
            f"hook {key(hook)!r} provides evaluator {name!r} but cannot swap it (no with_evaluator): "
            f"build its replacement and replace the whole hook"
        )
    return swap(name, fn)


def bind(hooks: Iterable[Any], model: Any) -> tuple[Any, ...]:
    """``hooks`` with every hook that declares ``bind`` bound to ``model``, at any depth."""
    bound = []
    for hook in hooks:
        inner = children(hook)
        if inner is not None:
            hook = with_children(hook, bind(inner, model))
        elif callable(getattr(hook, "bind", None)):
            hook = hook.bind(model)
        bound.append(hook)
    return tuple(bound)
