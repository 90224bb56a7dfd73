"""Swapping one hook of a live run for another, found by its place in nested chains: fix a hook and continue.

A run's hooks are fixed when ``loop()`` builds it: the hook list is bound to
the model, and what it implies (the evaluators, the identities the checkpoint
handler keys slots by, which events the driver processes: one frozen
``Implied``, ``pimm_fn.runtime.engine.implied``) is derived from it once.
``Loop.replace`` (built on ``replace`` here) changes one hook, at any depth
of nested chains, and derives that value again from the new hook list, so
the run goes on as if it had been built with it, from the current step.

Exactness is kept: the new hook takes over the old one's slot, so it is
refused when that slot does not fit the new hook (see ``carried_slot``). It
is refused in a run with a process group, where every rank would have to
swap at the same point of its collective sequence: rebuild the loop with the
new hook list there and resume from the last checkpoint.

A hook's place in nested chains: found by object, identity or identity path, and the lists rebuilt at it.

A place is an index path, outermost first (``(1, 0)``: the first child of
the second hook); an identity path joins the identities on the way with
``" / "`` as checkpoints do (``"logs / log_every(5)"``). ``Loop.replace``
(``pimm_fn.runtime.engine.swap``) swaps a hook there, and its slot with it.

>>> from pimm_fn.hooks import save_every, log_every
>>> from pimm_fn.core.fold import chain
>>> locate([save_every(3), chain(log_every(5), name="logs")], "log_every(5)")
(1, 0)
>>> locate([save_every(3), chain(log_every(5), name="logs")], "logs / log_every(5)")
(1, 0)
"""

from attrs import evolve

from pimm_fn import dist
from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core import slots as keyed_slots
from pimm_fn.core.hook_list import DuplicateHookError, check_hooks
from pimm_fn.runtime.engine import arguments
from pimm_fn.runtime.engine.arguments import check_save_dir
from pimm_fn.runtime.engine.implied import Implied
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.errors import Advice
from pimm_fn.runtime.handlers.checkpointing import prewarm_staging
from pimm_fn.runtime.handlers.control import check_scheduler_hooks
from pimm_fn.runtime.handlers.ema import EmaWeights
from pimm_fn.runtime.step import stateful_objects

__all__ = [
    "entries",
    "identity_path",
    "locate",
    "with_hook",
    "slot_at",
    "with_slot",
    "siblings",
    "replace",
    "replace_evaluator",
    "carried_slot",
]


_PATH = " / "  # joins the identities of a hook inside chains, outermost first (as checkpoints do)


def identity_path(keys) -> str:
    """The identities ``keys`` (outermost first) as one path: ``"logs / log_every(5)"``."""
    return _PATH.join(keys)


def entries(hooks, at: tuple = (), names: tuple = ()):
    """``(index path, identity path, hook)`` of every hook, composites included, depth first."""
    for i, hook in enumerate(hooks):
        path, keys = at + (i,), names + (protocol.key(hook),)
        yield path, keys, hook
        inner = protocol.children(hook)
        if inner is not None:
            yield from entries(inner, path, keys)


def locate(hooks, old) -> tuple:
    """The index path of ``old`` in ``hooks``, at any depth of nested chains.

    ``old`` is a hook (matched as that very object, else by identity), its
    identity (``pimm_fn.core.hook.key``), or its identity path inside chains
    (``'logs / log_every(5)'``).

    Raises:
        ValueError: no hook matches (listing the hooks there are), or several
            do (listing their paths).
    """
    listed = list(entries(hooks))
    if isinstance(old, str):
        wanted = old
        found = [(p, k) for p, k, _ in listed if k[-1] == wanted or _PATH.join(k) == wanted]
    else:
        wanted = protocol.key(old)
        found = [(p, k) for p, k, h in listed if h is old] or [(p, k) for p, k, _ in listed if k[-1] == wanted]
    if len(found) == 1:
        return found[0][0]
    if not found:
        there = ", ".join(repr(_PATH.join(k)) for _, k, _ in listed) or "none"
        raise ValueError(
            f"replace: this run has no hook {wanted!r}; its hooks are: {there}. Pass a hook of the run, its "
            f"identity (pimm_fn.core.hook.key(hook)) or its path inside chains ('outer / inner')"
        )
    places = ", ".join(repr(_PATH.join(k)) for _, k in found)
    raise ValueError(
        f"replace: the run has a hook {wanted!r} at several places ({places}): pass the path of the one to "
        f"replace, e.g. run.replace({_PATH.join(found[0][1])!r}, new)"
    )


def _inner(hook) -> tuple:
    """The children of ``hook``, a composite: an index path steps into composites only."""
    return protocol.children(hook) or ()


def with_hook(hooks: tuple, path: tuple, new) -> tuple:
    """``hooks`` with ``new`` at index path ``path``, each chain on the way rebuilt around its new children."""
    i, rest = path[0], path[1:]
    # A composite rebuilt around its new children, as pimm_fn.core.hook.bind rebuilds it.
    hook = new if not rest else protocol.with_children(hooks[i], with_hook(_inner(hooks[i]), rest, new))
    return hooks[:i] + (hook,) + hooks[i + 1 :]


def slot_at(slots: tuple, hooks: tuple, path: tuple):
    """The slot of the hook at index path ``path``, through its chains' slots."""
    i, rest = path[0], path[1:]
    if not rest:
        return slots[i]
    inner = slots[i] if slots[i] is not None else protocol.init_slot(hooks[i])
    return slot_at(tuple(inner), _inner(hooks[i]), rest)


def with_slot(slots: tuple, hooks: tuple, path: tuple, slot) -> tuple:
    """``slots`` with ``slot`` for the hook at index path ``path``, its chains' slots rebuilt around it."""
    i, rest = path[0], path[1:]
    if rest:
        inner = slots[i] if slots[i] is not None else protocol.init_slot(hooks[i])
        slot = with_slot(tuple(inner), _inner(hooks[i]), rest, slot)
    return slots[:i] + (slot,) + slots[i + 1 :]


def siblings(hooks: tuple, path: tuple) -> tuple:
    """The hooks beside the one at index path ``path``: its chain's children, or the top list."""
    for i in path[:-1]:
        hooks = _inner(hooks[i])
    return hooks


# -- the slot taken over --------------------------------------------------------------------------
def _type_name(value) -> str:
    if value is None:
        return "None"
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def carried_slot(old, new, slot, *, fresh: bool = False):
    """The slot ``new`` continues from, taking over ``slot``, the current slot of ``old``.

    A leaf takes ``slot`` as it is when its initial slot has the same type
    (both ``None`` included), or when neither hook declares an initial slot
    (a hook without ``init`` takes any slot, as on a resume). A chain
    replacing a chain takes its children's slots by identity, as a resume
    does: a child the old chain lacks starts from its initial slot.
    With ``fresh`` the new hook starts from its initial slot instead.

    Raises:
        TypeError: the slot does not fit the new hook, naming both hooks, the
            type found and the type expected, and what to do.
    """
    initial = protocol.init_slot(new)
    if fresh:
        return initial
    old_inner, new_inner = protocol.children(old), protocol.children(new)
    if old_inner is not None and new_inner is not None:
        try:
            saved = keyed_slots.keyed(old_inner, slot if slot is not None else protocol.init_slot(old))
            return keyed_slots.unkeyed(new_inner, saved)[0]
        except keyed_slots.SlotMismatch as exc:
            raise _mismatch(old, new, exc.found, exc.expected, f" (its child {exc.key!r})") from None
    if initial is None and protocol.init_slot(old) is None:
        return slot
    if type(initial) is type(slot):
        return slot
    raise _mismatch(old, new, _type_name(slot), _type_name(initial))


def _mismatch(old, new, found: str, expected: str, where: str = "") -> TypeError:
    return TypeError(
        f"replace: {protocol.key(old)!r} cannot be replaced by {protocol.key(new)!r}{where}: the old hook's slot is "
        f"of type {found}, the new hook's initial slot of type {expected}, so the new hook could not take it over. "
        f"Keep the slot class in the new version of the hook, pass fresh=True to start it from its initial slot, "
        f"or rebuild the loop with the new hook list"
    )


def _refuse_collision(level: tuple, index: int, old, new) -> None:
    name = protocol.key(new)
    for position, other in enumerate(level):
        if position != index and protocol.key(other) == name:
            raise DuplicateHookError(
                f"replace: the new hook {name!r} replacing {protocol.key(old)!r} has the identity of another hook "
                f"beside it (position {position}): checkpoints keep hook slots by identity, so each needs its own. "
                f"Name the new hook: pimm_fn.chain(hook, name='...')"
            )


def _refuse_process_group(run, old, new) -> None:
    if dist.is_initialized() or getattr(run._interpreter, "guard", None) is not None:
        raise RuntimeError(
            f"replace: cannot swap {protocol.key(old) if not isinstance(old, str) else old!r} for "
            f"{protocol.key(new)!r} in a run with a process group: every rank would have to swap at the same "
            f"point of its collective sequence. Rebuild the loop on every rank with the new hook list and "
            f"resume='auto' (or a checkpoint path)"
        )


def replace(run, old, new, *, fresh: bool = False) -> None:
    """Swap hook ``old`` for ``new`` in ``run`` (a ``Loop``), which continues without rebuilding (``Loop.replace``).

    For fixing a hook, or an evaluator function, between steps (after a
    ``step()``/``run(steps=n)``, or after one raised): redefine it, swap
    it in, call ``run()`` again. ``old`` is found at any depth of nested
    chains. The new hook is bound to the model (``model_hook``), and
    everything built from the hooks is rebuilt from the new list: the
    evaluators (an ``Evaluate`` runs the new function), the hook
    identities the next checkpoint keys slots by, the run's advice and
    which events the loop processes. The new hook takes over the old
    one's slot (counters keep counting); its subscription (``events``,
    ``every``) may differ, by design: it decides what happens from now
    on, and the steps already trained are not revisited.

    A checkpoint written after the swap keeps the new hook's slot under
    the new hook's identity: resume from it with the new hook list (with
    the old list, the old hook would start from its initial slot).

    Weight averages follow the hooks as ``loop()`` makes them: an ``ema``
    swapped in gets its average (a copy of the weights at its first
    update), an ``ema`` in both versions keeps its average, and the average
    of an ``ema`` swapped out is dropped from the run's extra state.

    Args:
        old: a hook of the run, its identity (``pimm_fn.core.hook.key``,
            e.g. ``"log_every(5)"``), or its identity path inside chains
            (``"logs / log_every(5)"``).
        new: the hook that takes its place.
        fresh: start ``new`` from its initial slot instead of taking over
            the old one's.

    Everything is checked before anything changes: a refused swap leaves
    the run as it was.

    Raises:
        ValueError: no hook ``old`` (the message lists the hooks there
            are), or several at different depths (pass its path).
        TypeError: ``new`` is not a hook, or the old hook's slot does not
            fit ``new`` (its initial slot has another type): the message
            names both hooks and both types.
        DuplicateHookError: ``new``'s identity is another hook's beside it.
        ValueError: the new hooks break a rule ``loop()`` checks for averages
            (an ``evaluate_every(weights=)`` no ``ema`` keeps, an ``ema`` after
            a saver, an ``ema`` of a sharded model, a name ``extra_state`` takes).
        RuntimeError: a process group is initialized: rebuild the loop
            with the new hook list on every rank and resume instead.

    >>> run.replace(pf.evaluate_every(4, broken, name="val"),
    ...             pf.evaluate_every(4, fixed, name="val")).run()  # doctest: +SKIP
    """
    _refuse_process_group(run, old, new)
    check_hooks([new], "replace")
    protocol.declared(new)  # a malformed declaration fails here, not at the next event
    top = run.hooks.hooks
    path = locate(top, old)
    level = siblings(top, path)
    current = level[path[-1]]
    bound = protocol.bind([new], unwrap(run.ctx.model))[0]
    _refuse_collision(level, path[-1], current, bound)
    slot = carried_slot(current, bound, slot_at(run.state.slots, top, path), fresh=fresh)
    hooks = run.hooks.with_children(with_hook(top, path, bound))
    ctx = run.ctx
    implied = Implied.of(hooks, guarded=ctx.implied.guarded)  # everything the new list implies, as loop() derives it
    check_save_dir(hooks.hooks, ctx.save_dir)
    arguments.check_best_trackers(hooks.hooks)
    check_scheduler_hooks(hooks.hooks, ctx.scheduler)
    extra = _extra_state(ctx, top, hooks.hooks)
    state = evolve(run.state, slots=with_slot(run.state.slots, top, path, slot))
    _commit(run, implied, state, extra)


def _extra_state(ctx, old: tuple, new: tuple) -> dict:
    """The run's extra state under the new hooks: an average each ``ema`` keeps, as ``loop()`` makes them.

    An average both hook lists keep goes on (the same ``EmaWeights``); a new
    ``ema``'s starts empty (a copy of the weights at its first update); an
    average no hook keeps any more is dropped, so the next checkpoint holds
    only what a run built with the new hooks holds. ``loop()``'s checks
    apply: no ``ema`` of a sharded model, no name taken by ``extra_state``,
    each ``weights=`` evaluated is kept, the ``ema`` before its evaluators.
    """
    before = hook_list.averages(old)
    given = {name: obj for name, obj in ctx.extra_state.items() if name not in before}
    try:
        extra = stateful_objects.extra_state(given or None, new, sharded=ctx.sharded)
    except ValueError as error:
        raise ValueError(f"replace: {str(error).removeprefix('loop: ')}") from None
    for name, obj in ctx.extra_state.items():
        if name in before and isinstance(extra.get(name), EmaWeights):
            extra[name] = obj  # the average an ema kept, kept on by its new version
    return extra


def _commit(run, implied, state, extra: dict) -> None:
    """Run on with the hooks of ``implied``, as ``loop()`` builds a run: advice, state, the loop's reading of them."""
    ctx = run.ctx
    ctx.extra_state = extra  # the averages the new hooks keep (``_extra_state``), before the next UpdateEma
    said = ctx.advice.said if ctx.advice is not None else set()
    ctx.advice = Advice(implied, world_size=ctx.world_size)
    ctx.advice.said = said  # a warning already given is not given again
    run.state = state
    run._use(implied)  # the next checkpoint keys the new hook's slot by its identity; the evaluators are its
    if ctx.stopping is not None:
        ctx.stopping.listen(implied.ticks)  # a save_every(minutes=...) swapped in hears the clock from now on
    prewarm_staging(ctx)  # a no-op unless the new hook is the first to save in the background


def replace_evaluator(run, name: str, fn) -> None:
    """Swap the function of the ``evaluate_every`` hook whose evaluator is ``name``; see ``Loop.replace_evaluator``.

    Raises:
        ValueError: no hook provides an evaluator ``name`` (listing those there are).
        TypeError: the hook providing it is not an ``evaluate_every`` hook.
    """
    found = [
        (p, k, h)
        for p, k, h in entries(run.hooks.hooks)
        if protocol.children(h) is None and name in hook_list.evaluators([h])
    ]
    if not found:
        raise ValueError(
            f"replace_evaluator: no evaluator named {name!r} in this run (known: {sorted(run.ctx.evaluators)})"
        )
    path, keys, hook = found[0]
    try:
        new = protocol.with_evaluator(hook, name, fn)  # the same cadence, name and broadcast; validated again
    except TypeError as error:
        raise TypeError(f"replace_evaluator: {error}; call run.replace({identity_path(keys)!r}, new_hook)") from None
    replace(run, identity_path(keys), new)
