"""A hook's place in nested chains: found by object, identity or identity path, and the lists rebuilt at it.

A place is an index path, outermost first (``(1, 0)``: the first child of
the second hook); an identity path joins the identities on the way with
``" / "`` as checkpoints do (``"logs / log_every(5)"``). ``Loop.replace``
(``pimm_fn.runtime.swap``) swaps a hook there, and its slot with it.

>>> from pimm_fn.hooks import save_every, log_every
>>> from pimm_fn.core.fold import chain
>>> locate([save_every(3), chain(log_every(5), name="logs")], "log_every(5)")
(1, 0)
>>> locate([save_every(3), chain(log_every(5), name="logs")], "logs / log_every(5)")
(1, 0)
"""

from pimm_fn.core import hook as protocol

__all__ = ["entries", "identity_path", "locate", "with_hook", "slot_at", "with_slot", "siblings"]

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


def with_hook(hooks: tuple, path: tuple, new) -> tuple:
    """``hooks`` with ``new`` at index path ``path``, each chain on the way rebuilt around its new children."""
    i, rest = path[0], path[1:]
    # A composite rebuilt around its new children, as pimm_fn.core.hook.bind rebuilds it.
    hook = new if not rest else protocol.with_children(hooks[i], with_hook(protocol.children(hooks[i]), rest, new))
    return hooks[:i] + (hook,) + hooks[i + 1:]


def slot_at(slots: tuple, hooks: tuple, path: tuple):
    """The slot of the hook at index path ``path``, through its chains' slots."""
    i, rest = path[0], path[1:]
    if not rest:
        return slots[i]
    inner = slots[i] if slots[i] is not None else protocol.init_slot(hooks[i])
    return slot_at(tuple(inner), protocol.children(hooks[i]), rest)


def with_slot(slots: tuple, hooks: tuple, path: tuple, slot) -> tuple:
    """``slots`` with ``slot`` for the hook at index path ``path``, its chains' slots rebuilt around it."""
    i, rest = path[0], path[1:]
    if rest:
        inner = slots[i] if slots[i] is not None else protocol.init_slot(hooks[i])
        slot = with_slot(tuple(inner), protocol.children(hooks[i]), rest, slot)
    return slots[:i] + (slot,) + slots[i + 1:]


def siblings(hooks: tuple, path: tuple) -> tuple:
    """The hooks beside the one at index path ``path``: its chain's children, or the top list."""
    for i in path[:-1]:
        hooks = protocol.children(hooks[i])
    return hooks
