"""An immutable, hashable mapping for metrics, best values and step outputs.

A plain ``dict`` inside a frozen value could still be mutated in place and
shared between hooks; ``FrozenMap`` cannot, so a ``State`` really is a value.
"""

from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, cast

__all__ = ["FrozenMap", "repr_unless_none"]


class FrozenMap(Mapping[Any, Any]):
    """A read-only mapping that compares, hashes and pickles by value.

    >>> m = FrozenMap({"mIoU": 0.5})
    >>> m.set("loss", 1.0)
    FrozenMap({'mIoU': 0.5, 'loss': 1.0})
    >>> m["mIoU"], len(m), m == {"mIoU": 0.5}
    (0.5, 1, True)
    """

    __slots__ = ("_data", "_hash")
    _data: dict[Any, Any]
    _hash: int | None

    def __init__(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = ()) -> None:
        object.__setattr__(self, "_data", dict(items))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: Any, default: Any = None) -> Any:
        return self._data.get(key, default)

    # Read-only views of the dict itself: faster than the Mapping mixins'.
    def keys(self) -> KeysView[Any]:
        return self._data.keys()

    def values(self) -> ValuesView[Any]:
        return self._data.values()

    def items(self) -> ItemsView[Any, Any]:
        return self._data.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return cast(int, self._hash)  # set just above: object.__setattr__ is past mypy's narrowing

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is immutable: use .set() or .merge() for a new one")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("FrozenMap is immutable: use .set() or .merge() for a new one")

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[type["FrozenMap"], tuple[dict[Any, Any]]]:
        return (FrozenMap, (self._data,))

    def set(self, key: Any, value: Any) -> "FrozenMap":
        """A new map with ``key`` bound to ``value``."""
        data = dict(self._data)
        data[key] = value
        return FrozenMap(data)

    def plus(self, other: Mapping[Any, Any]) -> "FrozenMap | None":
        """A new map of ``self[k] + other[k]`` when ``other`` has exactly these keys, else ``None``.

        The running sum of a stream of mappings (a step's outputs), in one pass.

        >>> FrozenMap({"loss": 1.0}).plus({"loss": 0.5}), FrozenMap({"loss": 1.0}).plus({"acc": 0.5})
        (FrozenMap({'loss': 1.5}), None)
        """
        data = self._data
        other = other._data if other.__class__ is FrozenMap else other
        if data.keys() != other.keys():
            return None
        return FrozenMap({k: v + other[k] for k, v in data.items()})

    def merge(self, other: Mapping[Any, Any]) -> "FrozenMap":
        """A new map with ``other``'s entries over this one's."""
        if not other:
            return self
        data = dict(self._data)
        data.update(other)
        return FrozenMap(data)


def freeze(mapping: Mapping[Any, Any] | None) -> FrozenMap:
    """``mapping`` as a ``FrozenMap`` (``None`` gives an empty one)."""
    if isinstance(mapping, FrozenMap):
        return mapping
    return FrozenMap(mapping or ())


def repr_unless_none(*names: str) -> Callable[[Any], str]:
    """A ``__repr__`` for an attrs class that leaves out ``names`` while they are ``None``.

    A field added later with a ``None`` default keeps the older values' repr
    (what traces and messages print) unchanged.
    """

    def __repr__(self: Any) -> str:
        shown = (
            f for f in type(self).__attrs_attrs__ if f.repr and not (f.name in names and getattr(self, f.name) is None)
        )
        return f"{type(self).__name__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    return __repr__
