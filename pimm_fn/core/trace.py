"""What a run executed, as values: one ``TraceEntry`` per effect, a ``Trace`` of them in order.

A real run's ``run.trace``, ``plan`` and the simulator all speak of executed
effects this way, so they compare by ``==``. A ``TraceEntry``'s ``repr``
names its event by its moment (``AfterStep(step=4, ...)``) instead of
repeating the step outputs and metric values its effect already carries; its
effect is shown in full. A ``Trace`` displays as a table (``print``, IPython,
Jupyter) with each effect's hook shown by its identity.
"""

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import attrs

from pimm_fn import notebook
from pimm_fn.core import summary
from pimm_fn.core.effects import Effect
from pimm_fn.core.events import Event

__all__ = ["TraceEntry", "Trace"]


@attrs.frozen(repr=False)
class TraceEntry:
    """One executed effect: at global ``step``, during ``event``, from hook ``hook`` (its position in the list).

    >>> from pimm_fn.core.events import AfterStep
    >>> from pimm_fn.core.effects import SaveCheckpoint
    >>> TraceEntry(4, AfterStep(4, {"loss": 0.25}, 8), SaveCheckpoint(4), 1)
    TraceEntry(step=4, event=AfterStep(step=4, ...), effect=SaveCheckpoint(step=4, snapshot=False, final=False, async_save=False, deferred=False), hook=1)
    """

    step: int
    event: Event
    effect: Effect
    hook: int = -1

    def __repr__(self) -> str:
        event = summary.event_label(self.event)
        return f"TraceEntry(step={self.step}, event={event}, effect={self.effect!r}, hook={self.hook})"


def _entries(entries: Iterable[TraceEntry]) -> tuple[TraceEntry, ...]:
    return tuple(entries)  # attrs' converter=tuple, with the type the checker reads


def _labels(hooks: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if hooks is None else tuple(hooks)


@attrs.frozen(eq=False, repr=False)
class Trace(Sequence[TraceEntry]):
    """The effects a run executed, in order: a read-only sequence of ``TraceEntry``.

    It compares equal to a list or tuple of the same entries, so
    ``run.trace == []`` and ``run.trace == plan(...)`` mean what they say.
    ``hooks`` holds the hooks' identities for the display only; it is not
    compared. A slice is a ``Trace`` too.

    >>> from pimm_fn.core.events import AfterStep
    >>> from pimm_fn.core.effects import SaveCheckpoint
    >>> trace = Trace([TraceEntry(2, AfterStep(2), SaveCheckpoint(2), 0)], hooks=["save_every(2)"])
    >>> trace == [TraceEntry(2, AfterStep(2), SaveCheckpoint(2), 0)], trace[:0] == ()
    (True, True)
    >>> print(trace)
    Trace: 1 effect, step 2
      step  hook           event                effect
      2     save_every(2)  AfterStep(step=2)    SaveCheckpoint(step=2)
    """

    entries: tuple[TraceEntry, ...] = attrs.field(converter=_entries)
    hooks: tuple[str, ...] | None = attrs.field(default=None, converter=_labels)

    @overload
    def __getitem__(self, index: int) -> TraceEntry: ...

    @overload
    def __getitem__(self, index: slice) -> "Trace": ...

    def __getitem__(self, index: int | slice) -> "TraceEntry | Trace":
        if isinstance(index, slice):
            return Trace(self.entries[index], self.hooks)
        return self.entries[index]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[TraceEntry]:
        return iter(self.entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return self.entries == other.entries
        if isinstance(other, (list, tuple)):
            return len(self.entries) == len(other) and all(a == b for a, b in zip(self.entries, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.entries)

    def __repr__(self) -> str:
        return f"Trace({list(self.entries)!r})"

    def __str__(self) -> str:
        title, table = summary.trace_title(self.entries), summary.trace_table(self.entries, self.hooks)
        return summary.table_text(title, *table)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        notebook.pretty(printer, str(self), cycle)

    def _repr_html_(self) -> str:
        title, table = summary.trace_title(self.entries), summary.trace_table(self.entries, self.hooks)
        return notebook.table_html(title, *table)
