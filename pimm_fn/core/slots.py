"""Hook slots by identity: what a checkpoint keeps of each hook, and how a run takes it back.

``State.slots`` holds one slot per hook in list order, which is how the fold
reads them. A checkpoint must not depend on that order: resumed with the same
hooks in another order, with a hook added or one removed, every hook still
gets its own slot back. So a checkpoint keeps each slot under its hook's
identity (``pimm_fn.core.hook.key``), as optax's ``named_chain`` keys its
sub-states; a chain's slot is kept as its children's slots under *their*
keys, at any depth.

* ``keyed(hooks, slots)`` turns positional slots into a ``Keyed`` value;
* ``unkeyed(hooks, saved)`` gives them back in the order of ``hooks``: a hook
  the checkpoint does not know starts from its initial slot, a saved key no
  hook has is dropped (and reported), and a slot that no longer fits its hook
  is a ``SlotMismatch``;
* ``by_position(hooks, slots)`` reads the slots of a checkpoint written before
  slots were keyed;
* ``dumps`` / ``loads`` write a ``Keyed`` as JSON through
  ``pimm_fn.core.codec``, one slot at a time, so a slot that no longer decodes
  is reported for its own hook, and only when a hook still claims it.

>>> from pimm_fn.hooks import save_every, log_every, SaveEveryState
>>> saved = keyed([save_every(3), log_every(5)], (SaveEveryState(3), None))
>>> unkeyed([save_every(3)], loads(dumps(saved)))
((SaveEveryState(last_saved=3, deferred=None),), ('log_every(5)',))
"""

import json
import numbers
from collections.abc import Iterable
from typing import Any

import attrs

from pimm_fn.core import codec, untrusted_json
from pimm_fn.core import hook as protocol
from pimm_fn.core.hook_list import DuplicateHookError

__all__ = ["Keyed", "Undecodable", "SlotMismatch", "keyed", "unkeyed", "by_position", "dumps", "loads"]

_NESTED = "__keyed__"  # marks a chain's slots in the JSON; codec never writes this key
_PATH = " / "  # joins the keys of a slot inside chains, outermost first
_ANY = "any value"  # what a hook without an initial slot expects


class SlotMismatch(ValueError):
    """A saved slot cannot be handed to the hook that claims it.

    Attributes:
        key: the hook's identity (inside chains, their keys joined by ``' / '``).
        found: the type of the slot the checkpoint holds.
        expected: the type of the slot the hook starts from.
    """

    def __init__(self, message: str, *, key: str, found: str, expected: str) -> None:
        super().__init__(message)
        self.key, self.found, self.expected = key, found, expected


def _entries(entries: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    return tuple(entries)  # attrs' converter=tuple, with the type the checker reads


@attrs.frozen
class Keyed:
    """Slots by hook identity, in hook order: ``entries`` is ``((key, slot), ...)``.

    The slot of a chain is itself a ``Keyed`` of its children's slots.
    """

    entries: tuple[tuple[str, Any], ...] = attrs.field(converter=_entries)

    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.entries)


@attrs.frozen
class Undecodable:
    """A saved slot that no longer decodes: the type the checkpoint names for it, and why it failed."""

    type_name: str
    reason: str


# -- positional -> keyed --------------------------------------------------------------------------
def keyed(hooks: Iterable[Any], slots: Iterable[Any]) -> Keyed:
    """``slots`` (one per hook of ``hooks``, in order) keyed by each hook's identity.

    Raises:
        ValueError: ``slots`` has another length than ``hooks``.
        DuplicateHookError: two hooks of one level share an identity.
    """
    hooks, slots = tuple(hooks), tuple(slots)
    if len(hooks) != len(slots):
        raise ValueError(f"keyed: {len(hooks)} hook(s) but {len(slots)} slot(s); pass one slot per hook")
    keys = [protocol.key(h) for h in hooks]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise DuplicateHookError(
            f"keyed: several hooks have the identity {repeated[0]!r}, so their slots could not be told apart; "
            f"name one: pimm_fn.chain(hook, name='...')"
        )
    return Keyed(tuple((k, _keyed_slot(h, s)) for k, h, s in zip(keys, hooks, slots)))


def _keyed_slot(hook: Any, slot: Any) -> Any:
    inner = protocol.children(hook)
    if inner is None:
        return slot
    return keyed(inner, slot if slot is not None else protocol.init_slot(hook))


# -- keyed -> positional --------------------------------------------------------------------------
def unkeyed(hooks: Iterable[Any], saved: Keyed, _path: tuple[str, ...] = ()) -> tuple[tuple[Any, ...], tuple[str, ...]]:
    """The slots of ``hooks``, in their order, taken from ``saved`` by identity.

    A hook ``saved`` does not know starts from its initial slot; a key of
    ``saved`` that no hook has is dropped. Nested chains are matched the same
    way inside.

    Returns:
        ``(slots, dropped)``: one slot per hook, and the dropped keys (inside
        chains, their keys joined by ``' / '``).

    Raises:
        SlotMismatch: a hook's saved slot no longer decodes, or has another
            type than the slot the hook starts from (when that is not None).
    """
    if not isinstance(saved, Keyed):
        raise TypeError(f"unkeyed: 'saved' must be a Keyed value (got {type(saved).__name__})")
    remaining = dict(saved.entries)
    slots: list[Any] = []
    dropped: list[str] = []
    for hook in hooks:
        path = _path + (protocol.key(hook),)
        if path[-1] not in remaining:
            slots.append(protocol.init_slot(hook))
            continue
        slot, inner_dropped = _claim(hook, remaining.pop(path[-1]), path)
        slots.append(slot)
        dropped.extend(inner_dropped)
    gone = [_PATH.join(_path + (k,)) for k in remaining]
    return tuple(slots), tuple(gone + dropped)


def _claim(hook: Any, saved: Any, path: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    """``(slot, dropped)``: ``saved`` given to ``hook``, checked against what the hook starts from."""
    inner = protocol.children(hook)
    if inner is not None:
        if isinstance(saved, Keyed):
            return unkeyed(inner, saved, path)
        found = saved.type_name if isinstance(saved, Undecodable) else _type_name(saved)
        raise _mismatch(path, found, "the slots of a chain")
    return _checked(hook, saved, path), ()


def _checked(hook: Any, saved: Any, path: tuple[str, ...]) -> Any:
    """``saved`` when it fits the slot ``hook`` starts from, else a ``SlotMismatch``."""
    initial = protocol.init_slot(hook)
    expected = _type_name(initial) if initial is not None else _ANY
    if isinstance(saved, Undecodable):
        raise _mismatch(path, saved.type_name, expected, f"no longer decodes ({saved.reason})")
    if isinstance(saved, Keyed):
        raise _mismatch(path, "the slots of a chain", expected)
    if initial is not None and not _same_kind(saved, initial):
        raise _mismatch(path, _type_name(saved), expected)
    return saved


def _same_kind(saved: object, initial: object) -> bool:
    # A number slot may move between int and float (a running sum); bool is no number here.
    if type(saved) is type(initial):
        return True
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (saved, initial))


def _type_name(value: object) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _mismatch(path: tuple[str, ...], found: str, expected: str, undecodable: str = "") -> SlotMismatch:
    key = _PATH.join(path)
    if undecodable:
        what = f"its slot in the checkpoint, of type {found}, {undecodable}"
        what += f"; this hook starts from {_a(expected)}" if expected != _ANY else ""
    else:
        what = f"the checkpoint holds a slot of type {found}, but this hook's slot is {_a(expected)}"
    return SlotMismatch(
        f"hook {key!r}: {what}. The hook changed since the checkpoint was written: resume with the hook (and the "
        f"slot classes, registered with pimm_fn.register_slot_type) that wrote it, or give the new hook another identity "
        f"(pimm_fn.chain(hook, name='...')) so that it starts from a fresh slot",
        key=key,
        found=found,
        expected=expected,
    )


def _a(expected: str) -> str:
    return expected if expected.startswith("the ") or expected == _ANY else f"a {expected}"


# -- by position (checkpoints written before slots were keyed) -----------------------------------
def by_position(hooks: Iterable[Any], slots: object, _path: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """``slots`` matched to ``hooks`` by position, as checkpoints written before keyed slots need.

    Raises:
        SlotMismatch: another number of slots than hooks (at any chain
            level), or a slot of another type than its hook starts from.
    """
    hooks = tuple(hooks)
    if not isinstance(slots, tuple) or len(slots) != len(hooks):
        count = len(slots) if isinstance(slots, tuple) else 1
        where = f" inside {_PATH.join(_path)!r}" if _path else ""
        raise SlotMismatch(
            f"the checkpoint was written by a run with {count} hook(s){where}, this run has {len(hooks)}: resume "
            f"with the same hook list (this checkpoint keeps its slots by position, not by hook identity, so they "
            f"are matched by position)",
            key=_PATH.join(_path),
            found=f"{count} slot(s)",
            expected=f"{len(hooks)} slot(s)",
        )
    out: list[Any] = []
    for hook, slot in zip(hooks, slots):
        path = _path + (protocol.key(hook),)
        inner = protocol.children(hook)
        out.append(by_position(inner, slot, path) if inner is not None else _checked(hook, slot, path))
    return tuple(out)


# -- JSON -----------------------------------------------------------------------------------------
def dumps(saved: Keyed) -> str:
    """``saved`` as a JSON string, each slot encoded by ``pimm_fn.core.codec``.

    Raises:
        TypeError: a slot holds a value the codec cannot store (naming it).
    """
    return json.dumps(_encode(saved), sort_keys=True, allow_nan=False)


def _encode(saved: Keyed) -> dict[str, list[list[Any]]]:
    return {_NESTED: [[k, _encode(v) if isinstance(v, Keyed) else codec.encode(v)] for k, v in saved.entries]}


def loads(text: str) -> Keyed:
    """The ``Keyed`` value ``dumps`` wrote; a slot that no longer decodes comes back as ``Undecodable``.

    Raises:
        ValueError: ``text`` is not keyed slots written by ``dumps``.
    """
    try:
        data = untrusted_json.loads(text)
    except ValueError as exc:
        raise ValueError(f"keyed slots are not valid JSON ({exc})") from None
    if not _is_nested(data):
        raise ValueError(f"expected keyed slots written by pimm_fn.core.slots.dumps (got {text[:80]!r})")
    return _decode(data)


def _is_nested(data: object) -> bool:
    return isinstance(data, dict) and list(data) == [_NESTED] and isinstance(data[_NESTED], list)


def _decode(data: dict[str, Any]) -> Keyed:
    return Keyed(tuple((k, _decode(v) if _is_nested(v) else _decode_slot(v)) for k, v in data[_NESTED]))


def _decode_slot(data: Any) -> Any:
    try:
        return codec.decode(data)
    except Exception as exc:  # noqa: BLE001 - a changed slot class may fail in its own validators, any way
        return Undecodable(_saved_type(data), f"{type(exc).__name__}: {exc}")


def _saved_type(data: object) -> str:
    """The type the encoded ``data`` names, as ``module.Class`` (or the plain kind)."""
    if isinstance(data, dict):
        for tag in ("__attrs__", "__enum__"):
            name = data.get(tag)
            if isinstance(name, str):
                return name.replace(":", ".")
        for tag, kind in (
            ("__tuple__", "tuple"),
            ("__map__", "FrozenMap"),
            ("__dict__", "dict"),
            ("__float__", "float"),
        ):
            if tag in data:
                return kind
    return type(data).__name__
