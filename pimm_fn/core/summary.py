"""Compact summaries of a run's values, as text: what ``str`` of a ``State``, ``Progress`` or ``Trace`` shows.

``repr`` stays exact (every field, every digit), for a debugger and for
comparing two runs; a ``State``'s is laid out one field a line
(:func:`fields_repr`). What this module builds is for reading: a summary as
``(label, value)`` rows, rendered here as text; ``pimm_fn.notebook`` renders
the same rows as HTML for Jupyter, so both show the same facts. Floats appear as
the log lines show them (5 significant digits), fields at their default are
left out, and a long value is cut with ``...``. Hooks appear by their
identity (``pimm_fn.core.hook.key``), slots beside the hook that keeps them.
A trace's table: ``pimm_fn.core.summary``.

A trace as a table, as text: what ``str`` of a ``Trace`` shows (``pimm_fn.notebook`` renders it as HTML).

One row per effect (step, hook identity, event, effect, each compact as
``pimm_fn.core.summary`` writes values), a long trace cut in the middle,
under a title saying how many effects and the steps they span.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Effect, Log, SaveCheckpoint

__all__ = [
    "number",
    "pairs",
    "cut",
    "compact",
    "event_label",
    "hook_label",
    "progress_line",
    "state_rows",
    "run_rows",
    "render_text",
    "fields_repr",
    "trace_title",
    "trace_table",
    "table_text",
]


WIDTH = 100  # the most characters a displayed value takes before it is cut


# What the summaries read of a Progress, a State and a TraceEntry (pimm_fn.core.state and .trace): those
# modules import this one to show themselves, not the reverse.
class _Progress(Protocol):
    @property
    def iters_per_epoch(self) -> int: ...
    @property
    def max_epochs(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def iter_in_epoch(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def samples_seen(self) -> int: ...
    @property
    def step_limit(self) -> int | None: ...
    @property
    def steps_left(self) -> int: ...


class _State(Protocol):
    @property
    def progress(self) -> _Progress: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def metrics(self) -> Mapping[Any, object]: ...
    @property
    def best(self) -> Mapping[Any, object]: ...
    @property
    def config(self) -> Mapping[Any, object]: ...
    @property
    def slots(self) -> tuple[Any, ...]: ...
    @property
    def position(self) -> str | None: ...
    @property
    def stop(self) -> str | None: ...
    @property
    def finished(self) -> bool: ...


class _Entry(Protocol):
    @property
    def step(self) -> int: ...
    @property
    def event(self) -> ev.Event: ...
    @property
    def effect(self) -> Effect: ...
    @property
    def hook(self) -> int: ...


def number(value: object) -> str:
    """A number as the log lines print it: a float to 5 significant digits.

    >>> number(-5.186985492706299), number(3), number("val")
    ('-5.187', '3', 'val')
    """
    return f"{value:.5g}" if isinstance(value, float) else str(value)


def pairs(mapping: Mapping[Any, object]) -> str:
    """``name=value`` pairs of ``mapping``, as a log line shows them.

    >>> pairs({"score": -5.186985492706299, "epoch": 1})
    'score=-5.187 epoch=1'
    """
    return cut(" ".join(f"{k}={number(v)}" for k, v in mapping.items()))


def cut(text: str, width: int = WIDTH) -> str:
    """``text`` cut to ``width`` characters, ending in ``...`` when cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_default(field: "attrs.Attribute[Any]", value: object) -> bool:
    default = field.default
    # An empty container made fresh: shown when it holds something. (attrs' stub declares Factory a function,
    # so that a default of Factory(list) types as a list; it is a class.)
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return not value if isinstance(value, (Mapping, tuple, list)) else False
    return default is not attrs.NOTHING and type(value) is type(default) and value == default


def _compact(value: object) -> str:
    cls = type(value)
    if attrs.has(cls):
        shown = (
            f"{f.name}={_compact(getattr(value, f.name))}"
            for f in attrs.fields(cls)
            if f.repr and not f.name.startswith("_") and not _is_default(f, getattr(value, f.name))
        )
        return f"{cls.__name__}({', '.join(shown)})"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_compact, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(map(_compact, value)) + "]"
    return repr(value)


def compact(value: object, width: int = WIDTH) -> str:
    """``value`` in short: an attrs value with only its fields off their defaults, floats shortened, cut to ``width``.

    >>> from pimm_fn.core.effects import SaveCheckpoint, WriteBest
    >>> compact(SaveCheckpoint(6)), compact(WriteBest("score", -5.186985492706299, 8))
    ('SaveCheckpoint(step=6)', "WriteBest(metric='score', value=-5.187, step=8)")
    """
    return cut(_compact(value), width)


# Per event type, the fields a label leaves out: rank-local data that the effects repeat.
_ELIDED: dict[type[ev.Event], tuple[str, ...]] = {
    ev.AfterStep: ("outputs", "batch_size"),
    ev.MetricsPublished: ("values", "consistent"),
}


def event_label(event: ev.Event) -> str:
    """``event`` by what names its moment: step outputs and metric values left out, marked ``...``.

    >>> event_label(ev.AfterStep(3, {"loss": 0.25}, 8)), event_label(ev.AfterEpoch(0))
    ('AfterStep(step=3, ...)', 'AfterEpoch(epoch=0)')
    >>> event_label(ev.MetricsPublished({"score": 0.5}, "val", 4))
    "MetricsPublished(source='val', step=4, ...)"
    """
    elided = _ELIDED.get(type(event), ())
    fields = attrs.fields(type(event))
    shown = [
        f"{f.name}={getattr(event, f.name)!r}"
        for f in fields
        if f.name not in elided and not _is_default(f, getattr(event, f.name)) or f.name == "step"
    ]
    left_out = any(f.name in elided and not _is_default(f, getattr(event, f.name)) for f in fields)
    return f"{type(event).__name__}({', '.join(shown + ['...'] * left_out)})"


def hook_label(hook: Any) -> str:
    """A hook by its identity; an unnamed ``chain`` by its children's.

    >>> from pimm_fn.core.fold import chain
    >>> from pimm_fn.hooks import save_every
    >>> def history(state, event): return state, ()
    >>> hook_label(history), hook_label(chain(save_every(2), history))
    ('pimm_fn.core.summary.history', 'chain(save_every(2), pimm_fn.core.summary.history)')
    """
    name = protocol.key(hook)
    inner = protocol.children(hook)
    if inner is not None and name == repr(hook):  # no name of its own: its repr would show functions by address
        return f"chain({', '.join(map(hook_label, inner))})"
    return name


def progress_line(progress: _Progress, world_size: int = 1) -> str:
    """Where training stands, in one line: step of total, epoch, iteration in it, budget, samples.

    ``epoch`` counts from 0, as ``Progress.epoch`` and the log lines do. The
    samples are the whole run's, every rank's together (as the console's
    samples/s), where ``Progress.samples_seen`` counts one rank's (every
    rank's alike): with ``world_size`` ranks, that times ``world_size``.

    >>> from pimm_fn.core.state import Progress
    >>> progress_line(Progress(5, 2, epoch=1, iter_in_epoch=3, global_step=8, samples_seen=64))
    'step 8/10, epoch 1 (iter 3/5), max_epochs=2, 64 samples'
    >>> progress_line(Progress(5, 2, epoch=1, iter_in_epoch=3, global_step=8, samples_seen=64), world_size=2)
    'step 8/10, epoch 1 (iter 3/5), max_epochs=2, 128 samples on 2 ranks'
    """
    p = progress
    budget = f"max_steps={p.step_limit}" if p.step_limit is not None else f"max_epochs={p.max_epochs}"
    ranks = f" on {world_size} ranks" if world_size > 1 else ""
    samples = f", {p.samples_seen * world_size} samples{ranks}" if p.samples_seen else ""
    return (
        f"step {p.global_step}/{p.global_step + p.steps_left}, epoch {p.epoch} "
        f"(iter {p.iter_in_epoch}/{p.iters_per_epoch}), {budget}{samples}"
    )


def _where(state: _State) -> str:
    """The state's place in the lifecycle: finished, stopping, or the last event."""
    if state.finished:
        return "finished"
    if state.stop is not None:
        return f"stopping: {state.stop}"
    return f"after {state.position}" if state.position is not None else "not started"


def state_rows(state: _State, hooks: Sequence[Any] | None = None) -> list[tuple[str, str]]:
    """``(label, value)`` rows summing up ``state``: metrics, best values, and each hook's slot.

    With ``hooks`` (the run's hook list) a slot is shown beside its hook's
    identity, every hook listed; without, by its position (``#1``), and hooks
    keeping no slot (``None``) are left out.
    """
    rows = [("progress", f"{progress_line(state.progress, state.world_size)}; {_where(state)}")]
    if state.world_size > 1:
        rows.append(("rank", f"{state.rank} of {state.world_size}"))
    rows += [("metrics", pairs(state.metrics) or "none yet"), ("best", pairs(state.best) or "none yet")]
    if state.config:
        rows.append(("config", pairs(state.config)))
    if hooks is not None and len(hooks) == len(state.slots):
        slots = [(hook_label(h), s) for h, s in zip(hooks, state.slots)]
        lines = [cut(name if slot is None else f"{name}: {compact(slot)}", 2 * WIDTH) for name, slot in slots]
        rows.append(("hooks", "\n".join(lines) or "none"))
    else:
        lines = [f"#{i} {compact(slot)}" for i, slot in enumerate(state.slots) if slot is not None]
        rows.append(("slots", "\n".join(lines) or f"none kept ({len(state.slots)} hooks)"))
    return rows


def render_text(title: str, rows: Sequence[tuple[str, object]]) -> str:
    """``title`` then one indented ``label: value`` line per row; a value's later lines indented under it.

    >>> print(render_text("State", [("metrics", "acc=0.5"), ("slots", "#0 a\\n#1 b")]))
    State
      metrics: acc=0.5
      slots:   #0 a
               #1 b
    """
    width = max((len(label) for label, _ in rows), default=0) + 1
    lines = [title]
    for label, value in rows:
        first, *rest = str(value).split("\n")
        lines.append(f"  {label + ':':<{width}} {first}")
        lines += [f"  {'':<{width}} {line}" for line in rest]
    return "\n".join(lines)


def run_rows(state: _State, hooks: Sequence[Any], trace: Sequence[_Entry]) -> list[tuple[str, str]]:
    """``state_rows`` of a live run, with its last save and last training log line read from its ``trace``."""
    rows = state_rows(state, hooks)
    save = next((e.effect for e in reversed(trace) if isinstance(e.effect, SaveCheckpoint)), None)
    log = next((e.effect for e in reversed(trace) if isinstance(e.effect, Log) and e.effect.kind == "train"), None)
    found = [
        ("last save", f"step {save.step}" + " (final)" * save.final if save is not None else "none in run.trace"),
        ("last train log", f"step {log.step}: {pairs(log.values)}" if log is not None else "none in run.trace"),
        ("trace", f"{len(trace)} effect{'s' * (len(trace) != 1)} (run.trace)"),
    ]
    at = next(i for i, (label, _) in enumerate(rows) if label == "best") + 1
    return rows[:at] + found + rows[at:]


def fields_repr(value: attrs.AttrsInstance) -> str:
    """The exact repr of an attrs ``value``, one field a line, a tuple field one item a line: the call that makes it.

    What ``repr(state)`` prints: every field and every digit as attrs
    writes them, readable where one line would run to hundreds of
    characters.

    >>> @attrs.frozen
    ... class Point:
    ...     x: int
    ...     tags: tuple = ()
    >>> print(fields_repr(Point(1, ("a", None))))
    Point(
        x=1,
        tags=(
            'a',
            None,
        ),
    )
    """
    lines = [f"{type(value).__name__}("]
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        if isinstance(item, tuple) and item:
            lines += [f"    {field.name}=(", *(f"        {part!r}," for part in item), "    ),"]
        else:
            lines.append(f"    {field.name}={item!r},")
    return "\n".join([*lines, ")"])


_HEAD = _TAIL = 10  # a long trace shows its first and last entries


_Row = tuple[str, str, str, str]  # a trace table's row: step, hook, event, effect


def trace_table(entries: Iterable[_Entry], hooks: Sequence[str] | None = None) -> tuple[_Row, list[_Row]]:
    """``(header, rows)`` of a trace: step, hook (identity, or ``#index``), event, effect; a long one cut in the middle.

    ``hooks`` are the hooks' labels in list order, as ``TraceEntry.hook`` indexes them.
    """

    labels: Sequence[str] = () if hooks is None else hooks

    def row(e: _Entry) -> _Row:
        hook = cut(labels[e.hook], WIDTH // 2) if 0 <= e.hook < len(labels) else f"#{e.hook}"
        return str(e.step), hook, event_label(e.event), compact(e.effect)

    entries = tuple(entries)
    if len(entries) <= _HEAD + _TAIL + 1:
        return ("step", "hook", "event", "effect"), [row(e) for e in entries]
    skipped = len(entries) - _HEAD - _TAIL
    gap = ("...", "", "", f"... {skipped} more entries (list(trace) has them all) ...")
    return ("step", "hook", "event", "effect"), [*map(row, entries[:_HEAD]), gap, *map(row, entries[-_TAIL:])]


def table_text(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``title`` then ``rows`` under ``header`` in left-aligned columns, the last one free.

    >>> print(table_text("Trace", ("step", "effect"), [("3", "SaveCheckpoint(step=3)")]))
    Trace
      step  effect
      3     SaveCheckpoint(step=3)
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [title]
    for r in [header, *rows] if rows else []:
        lines.append(("  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths)) + "  " + r[-1]).rstrip())
    return "\n".join(lines)


def trace_title(entries: Sequence[_Entry]) -> str:
    """How many effects a trace holds and the steps they span.

    >>> from types import SimpleNamespace as Entry
    >>> trace_title([]), trace_title([Entry(step=3), Entry(step=8)])
    ('Trace: no effects', 'Trace: 2 effects, steps 3 to 8')
    """
    if not entries:
        return "Trace: no effects"
    steps = (
        f"step {entries[0].step}"
        if entries[0].step == entries[-1].step
        else f"steps {entries[0].step} to {entries[-1].step}"
    )
    return f"Trace: {len(entries)} effect{'s' * (len(entries) != 1)}, {steps}"
