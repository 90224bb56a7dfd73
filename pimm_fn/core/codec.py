"""State to JSON-ready data and back, with no pickle and no code execution.

Checkpoints store ``State`` (hook slots included) as JSON. Only plain values
and attrs classes registered with ``register_slot_type`` can be decoded, so loading a
checkpoint never runs arbitrary code. Floats keep NaN and infinities.
"""

import enum
import json
import math
from typing import Any, TypeVar

import attrs

from pimm_fn.core import untrusted_json
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.outputs import StepOutputs

__all__ = ["register_slot_type", "encode", "decode", "dumps", "loads"]

_REGISTRY: dict[str, Any] = {}  # an attrs class or an Enum subclass, by _name

_T = TypeVar("_T", bound=type)


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def register_slot_type(cls: _T) -> _T:
    """Allow an attrs class or Enum that a hook keeps in its slot (or an event, an effect) in checkpoints.

    Use as a class decorator on the frozen attrs class a custom hook keeps in
    its slot: the checkpoint codec decodes only registered types, so loading
    never runs code. Returns the class unchanged.
    """
    if not (attrs.has(cls) or issubclass(cls, enum.Enum)):
        raise TypeError(f"register_slot_type: register() takes an attrs class or an Enum (got {cls!r})")
    _REGISTRY[_name(cls)] = cls
    return cls


def encode(value: Any) -> Any:
    """``value`` as JSON-compatible data; raises ``TypeError`` on anything unknown."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, (FrozenMap, StepOutputs)):  # a step's outputs kept by a hook: their values, as a FrozenMap
        return {"__map__": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, dict):
        return {"__dict__": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, enum.Enum) and _name(type(value)) in _REGISTRY:
        return {"__enum__": _name(type(value)), "name": value.name}
    if attrs.has(type(value)) and _name(type(value)) in _REGISTRY:
        fields = {f.name: encode(getattr(value, f.name)) for f in attrs.fields(type(value)) if f.init}
        return {"__attrs__": _name(type(value)), "fields": fields}
    raise TypeError(
        f"cannot store {type(value).__name__} value {value!r:.100} in a checkpoint: use plain values "
        f"(numbers, strings, tuples, lists, dicts) or an attrs class decorated with pimm_fn.register_slot_type"
    )


def decode(data: Any) -> Any:
    """The value ``encode`` turned into ``data``."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__float__" in data:
        return float(data["__float__"])
    if "__tuple__" in data:
        return tuple(decode(v) for v in data["__tuple__"])
    if "__map__" in data:
        return FrozenMap((decode(k), decode(v)) for k, v in data["__map__"])
    if "__dict__" in data:
        return {decode(k): decode(v) for k, v in data["__dict__"]}
    kind = "__attrs__" if "__attrs__" in data else "__enum__"
    name: Any = data.get(kind)  # whatever the checkpoint holds: a name not registered finds no class
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(
            f"checkpoint holds a value of type {name!r}, which is not registered: import the module that "
            f"defines it (and decorate the class with pimm_fn.register_slot_type) before loading"
        )
    if kind == "__enum__":
        return cls[data["name"]]
    return cls(**{k: decode(v) for k, v in data["fields"].items()})


def dumps(value: Any) -> str:
    """``value`` as a JSON string (keys in a fixed order)."""
    return json.dumps(encode(value), sort_keys=True, allow_nan=False)


def loads(text: str) -> Any:
    return decode(untrusted_json.loads(text))
