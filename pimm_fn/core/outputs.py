"""A step's outputs as hooks see them in a real run: named at once, read off the device only when asked.

Reading a value that lives on an accelerator stalls the host until the
device catches up, so the loop hands each ``AfterStep`` a ``StepOutputs``
view instead of the values: its names (``"loss" in event.outputs``,
``list(event.outputs)``) cost nothing; the first value asked for reads all
of the step's values in one transfer, and they stay for the rest of the
step. A hook that never asks costs no read at all, whatever it is.

The view closes when the step's hooks and effects are done. Values read by
then stay readable; asking for the first time after that raises
``StepOutputsClosed``, which says how to keep a value: the alternative, a
silent read whenever an old event is looked at, would put a host sync where
nobody can see it. ``plan`` and the simulator hand hooks plain mappings of
floats; a ``StepOutputs`` is never built in the pure core, only read there.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["StepOutputs", "StepOutputsClosed"]


class StepOutputsClosed(LookupError):
    """A step's outputs were asked for after the step ended, and nobody had read them during it."""


class StepOutputs(Mapping[str, float]):
    """Step ``step``'s scalar outputs ``names``, read by ``reader()`` (a dict of floats) on the first value asked for.

    >>> outputs = StepOutputs(4, ["loss"], lambda: {"loss": 0.25})
    >>> "loss" in outputs, outputs.was_read
    (True, False)
    >>> outputs["loss"], outputs.was_read
    (0.25, True)
    """

    __slots__ = ("step", "_names", "_reader", "_values")

    def __init__(self, step: int, names: Iterable[str], reader: Callable[[], Mapping[str, float]] | None) -> None:
        self.step = step
        self._names = tuple(names)
        self._reader = reader  # None once read, or once closed unread
        self._values: dict[str, float] | None = None

    @property
    def was_read(self) -> bool:
        return self._values is not None

    def close(self) -> None:
        """The step is over: the reader (and what it holds on the device) is let go."""
        self._reader = None

    def _read(self) -> dict[str, float]:
        reader = self._reader
        if reader is None:
            raise StepOutputsClosed(
                f"the outputs of step {self.step} ({', '.join(self._names)}) were asked for after the step ended, "
                f"and no hook read them during it, so they were never taken off the device: read the values a hook "
                f"needs while it handles the step's AfterStep and keep them as floats in its slot "
                f"(loss = float(event.outputs['loss'])), or keep a history with pf.log_every"
            )
        values = dict(reader())
        wrong = {k: type(v).__name__ for k, v in values.items() if v.__class__ is not float}
        if wrong or tuple(values) != self._names:
            raise TypeError(
                f"step {self.step}'s outputs must read as floats named {self._names} (got {wrong or values})"
            )
        self._values, self._reader = values, None
        return values

    def __getitem__(self, name: str) -> float:
        values = self._values
        if values is None:
            if name not in self._names:
                raise KeyError(name)
            values = self._read()
        return values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __eq__(self, other: object) -> bool:
        """Two views: the same step's same names, and the same values where both were read (the values of an
        unread one were never seen: nothing tells them apart). A mapping: the same values, this view read for it
        (an unread view closed reads as unequal)."""
        if isinstance(other, StepOutputs):
            if self.step != other.step or self._names != other._names:
                return False
            return self._values is None or other._values is None or self._values == other._values
        if not isinstance(other, Mapping):
            return NotImplemented
        if self._values is None and self._reader is None:
            return False
        return dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash((self.step, self._names))

    def __repr__(self) -> str:
        if self._values is None:
            return f"StepOutputs(step={self.step}, unread: {', '.join(self._names)})"
        return f"StepOutputs(step={self.step}, {self._values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what it holds: its values when read, else its names alone (closed)."""
        values = self._values
        if values is None:
            return (StepOutputs, (self.step, self._names, None))
        return (_read_outputs, (self.step, values))


def _read_outputs(step: int, values: dict[str, float]) -> StepOutputs:
    outputs = StepOutputs(step, values, None)
    outputs._values = values
    return outputs
