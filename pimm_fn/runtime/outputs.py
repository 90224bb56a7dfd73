"""Step outputs kept on their device until a hook reads them: no host sync on quiet steps.

Reading a tensor's value (``item()``, ``float()``, ``.cpu()``) makes the
host wait for the device. A step's outputs are read only where a hook that
reads them is called for its ``AfterStep`` (its cadence fires,
``reads_outputs``), at each epoch's end, and at the end of every
``WAIT_AT_MOST``-th step (1 000: one read where an epoch is long and no hook
reads them, so what waits stays bounded and a NaN loss is seen within as
many steps). The outputs of the steps in between wait, untouched, in an
:class:`Unread` batch; at the next read all of them are converted in one
transfer and handed, in step order, to the hooks that accumulate them
(``log_every``'s epoch sums) and to the NaN check, exactly as if each had
been read on its own step: the same floats, added in the same order. A
quiet step does no per-hook work at all.
"""

from collections.abc import Mapping

import torch

__all__ = ["device_outputs", "Unread", "WAIT_AT_MOST"]

_Tensor = torch.Tensor
# Steps whose outputs may wait unread: each one's (~0.75 KB of host memory, and a tensor on its device) is held until
# read, so a long epoch no hook reads the outputs of is read at the end of every such step (alike on every rank).
WAIT_AT_MOST = 1_000


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
                if value.requires_grad:  # kept, it must not hold the step's graph
                    value = value.detach()
                kept[name] = value if not value.ndim else value.reshape(())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            kept[name] = float(value)
    return kept


class Unread:
    """The outputs of the steps no hook has read yet, in step order, left on their device."""

    def __init__(self):
        self.steps: list = []  # [(global step, outputs)]

    def __bool__(self) -> bool:
        return bool(self.steps)

    def add(self, step: int, outputs: dict) -> None:
        self.steps.append((step, outputs))

    def read(self, current: dict | None = None) -> tuple[list, dict | None]:
        """``([(step, float outputs)], current as floats)``: every waiting output read in one transfer.

        The batch is kept until :meth:`clear`: a reader that fails reads it again.
        """
        if not self.steps and current is not None:  # a step whose hooks read it, nothing else waiting
            values = iter(_floats([v for v in current.values() if v.__class__ is not float]))
            return [], {k: v if v.__class__ is float else next(values) for k, v in current.items()}
        pending = self.steps + ([(None, current)] if current is not None else [])
        tensors = [v for _, outputs in pending for v in outputs.values() if v.__class__ is not float]
        values = iter(_floats(tensors))
        read = [(step, {k: v if v.__class__ is float else next(values) for k, v in outputs.items()})
                for step, outputs in pending]
        if current is not None:
            return read[:-1], read[-1][1]
        return read, None

    def clear(self) -> None:
        self.steps = []


def _floats(tensors: list) -> list:
    """The values of 0-dimensional ``tensors`` as floats, each exactly as its ``item()``: one transfer per dtype and device."""
    if len(tensors) == 1:
        return [float(tensors[0].item())]
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    values = [0.0] * len(tensors)
    for indices in groups.values():
        for i, v in zip(indices, torch.stack([tensors[i] for i in indices]).tolist()):
            values[i] = float(v)
    return values
