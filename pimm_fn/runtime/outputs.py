"""Step outputs kept on their device until a hook reads them: no host sync on quiet steps.

Reading a tensor's value (``item()``, ``float()``, ``.cpu()``) makes the
host wait for the device. The loop reads the step's outputs only on a step
where some hook is called for ``AfterStep`` (its cadence fires): there
:func:`to_floats` converts them, in one transfer. On the other steps the
outputs stay device tensors (detached, 0-dimensional), and the hooks that
accumulate them (``log_every``'s epoch sums) add them on the device. Before a
hook is called, and before a checkpoint keeps the state, :func:`materialized`
turns the tensors the state holds into floats, once.

Values are kept as float64 tensors: summed on the device they give the
sums Python floats give, bit for bit, whichever steps a hook happens to read
and whether the run was resumed from a checkpoint (where they are floats).
"""

from collections.abc import Mapping

import attrs
import torch

from pimm_fn.core.frozen import FrozenMap

__all__ = ["device_outputs", "to_floats", "materialized"]

_Tensor = torch.Tensor
_F64 = torch.float64


def device_outputs(outputs) -> dict:
    """The step's numeric scalars, tensors left where they are (detached); other outputs dropped. No sync."""
    if outputs is None:
        return {}
    if not (outputs.__class__ is dict or isinstance(outputs, Mapping)):
        outputs = {"loss": outputs}
    kept = {}
    for name, value in outputs.items():
        if value.__class__ is float:
            kept[name] = value
        elif isinstance(value, _Tensor):
            if value.numel() == 1 and not value.dtype.is_complex:
                kept[name] = value.detach().reshape(()).to(_F64)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            kept[name] = float(value)
    return kept


def to_floats(outputs: dict) -> dict:
    """``outputs`` with every tensor read as a float, in one transfer from the device."""
    tensors = [k for k, v in outputs.items() if v.__class__ is not float]
    if not tensors:
        return outputs
    values = torch.stack([outputs[k].to(_F64) for k in tensors]).tolist() if len(tensors) > 1 else [
        outputs[tensors[0]].item()]
    floats = dict(outputs)
    for name, value in zip(tensors, values):
        floats[name] = float(value)
    return floats


def materialized(value):
    """``value`` (a State, slot, map or tuple) with each tensor inside read as a float; itself when it holds none."""
    cls = value.__class__
    if cls is float or cls is int or cls is str or value is None or cls is bool:
        return value
    if isinstance(value, _Tensor):
        return float(value.item())
    if isinstance(value, FrozenMap):
        found = {k: materialized(v) for k, v in value.items()}
        return value if all(found[k] is v for k, v in value.items()) else FrozenMap(found)
    if cls is tuple:
        found = tuple(materialized(v) for v in value)
        return value if all(a is b for a, b in zip(found, value)) else found
    if attrs.has(cls):
        changes = {}
        for field in attrs.fields(cls):
            old = getattr(value, field.name)
            new = materialized(old)
            if new is not old:
                changes[field.name] = new
        return attrs.evolve(value, **changes) if changes else value
    return value
