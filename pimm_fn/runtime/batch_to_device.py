"""A batch moved to a device: every tensor inside, each container rebuilt in its own type.

What ``TrainStep(device=...)`` does to each batch before the forward, and
the loader evaluator and ``Loop.predict`` before theirs.
"""

import dataclasses
from collections.abc import Mapping

import torch

__all__ = ["to_device"]


def to_device(batch, device):
    """``batch`` with every tensor inside moved to ``device`` (``non_blocking``); other values pass through.

    Looks inside dicts (and other mappings), lists, tuples, namedtuples and
    dataclass instances, at any depth, rebuilding each container's type.

    >>> to_device({"x": [torch.zeros(2)], "name": "a"}, "cpu")["x"][0].device
    device(type='cpu')
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return _mapping(batch, {key: to_device(value, device) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple: its fields are positional
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **fields)
    return batch


def _mapping(original, moved: dict):
    """``moved`` in the mapping type of ``original`` (a plain dict when that type cannot be rebuilt)."""
    if type(original) is dict:
        return moved
    if isinstance(original, dict):  # OrderedDict, defaultdict: a copy keeps their extra attributes
        copy = original.copy()
        copy.update(moved)
        return copy
    try:
        return type(original)(moved)
    except TypeError:
        return moved
