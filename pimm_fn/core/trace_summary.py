"""A trace as a table, as text: what ``str`` of a ``Trace`` shows (``pimm_fn.notebook`` renders it as HTML).

One row per effect (step, hook identity, event, effect, each compact as
``pimm_fn.core.summary`` writes values), a long trace cut in the middle,
under a title saying how many effects and the steps they span.
"""

from pimm_fn.core.summary import WIDTH, compact, cut, event_label

__all__ = ["trace_title", "trace_table", "table_text"]

_HEAD = _TAIL = 10  # a long trace shows its first and last entries


def trace_table(entries, hooks=None) -> tuple:
    """``(header, rows)`` of a trace: step, hook (identity, or ``#index``), event, effect; a long one cut in the middle.

    ``hooks`` are the hooks' labels in list order, as ``TraceEntry.hook`` indexes them.
    """
    def row(e):
        known = hooks is not None and 0 <= e.hook < len(hooks)
        hook = cut(hooks[e.hook], WIDTH // 2) if known else f"#{e.hook}"
        return str(e.step), hook, event_label(e.event), compact(e.effect)

    entries = tuple(entries)
    if len(entries) <= _HEAD + _TAIL + 1:
        return ("step", "hook", "event", "effect"), [row(e) for e in entries]
    skipped = len(entries) - _HEAD - _TAIL
    gap = ("...", "", "", f"... {skipped} more entries (list(trace) has them all) ...")
    return ("step", "hook", "event", "effect"), [*map(row, entries[:_HEAD]), gap, *map(row, entries[-_TAIL:])]


def table_text(title: str, header, rows) -> str:
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


def trace_title(entries) -> str:
    """How many effects a trace holds and the steps they span.

    >>> from types import SimpleNamespace as Entry
    >>> trace_title([]), trace_title([Entry(step=3), Entry(step=8)])
    ('Trace: no effects', 'Trace: 2 effects, steps 3 to 8')
    """
    if not entries:
        return "Trace: no effects"
    steps = f"step {entries[0].step}" if entries[0].step == entries[-1].step else \
        f"steps {entries[0].step} to {entries[-1].step}"
    return f"Trace: {len(entries)} effect{'s' * (len(entries) != 1)}, {steps}"
