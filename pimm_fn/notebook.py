"""How the run's values show in a notebook: HTML tables with a progress bar, and IPython's pretty printer.

The facts come from ``pimm_fn.core.summary`` as ``(label, value)`` rows (and
a trace's header and rows); this module only renders them, so ``str`` and
the Jupyter display show the same things. It imports nothing of pimm_fn: the
pure core's values (``State``, ``Progress``, ``Trace``) and the runtime's
``Loop`` call it from their ``_repr_html_`` and ``_repr_pretty_``.
"""

import html

__all__ = ["render_html", "table_html", "pretty"]


def render_html(title: str, rows, progress=None) -> str:
    """``rows`` as a small HTML table under ``title``, with a progress bar of ``progress``'s steps."""
    bar = ""
    if progress is not None:
        total = progress.global_step + progress.steps_left
        bar = f' <progress value="{progress.global_step}" max="{max(total, 1)}"></progress>'
    cells = "".join(
        f'<tr><th style="text-align:left;vertical-align:top">{html.escape(label)}</th>'
        f'<td style="text-align:left"><code>{html.escape(str(value)).replace(chr(10), "<br>")}</code></td></tr>'
        for label, value in rows
    )
    return f"<div><b>{html.escape(title)}</b>{bar}<table>{cells}</table></div>"


def table_html(title: str, header, rows) -> str:
    """``rows`` under ``header`` as an HTML table, under ``title``."""
    head = "<tr>" + "".join(f'<th style="text-align:left">{html.escape(h)}</th>' for h in header) + "</tr>"
    body = "".join(
        "<tr>" + "".join(f'<td style="text-align:left"><code>{html.escape(c)}</code></td>' for c in r) + "</tr>"
        for r in rows
    )
    return f"<div><b>{html.escape(title)}</b><table>{head if rows else ''}{body}</table></div>"


def pretty(printer, text: str, cycle: bool = False) -> None:
    """Write ``text`` through IPython's pretty ``printer`` line by line, so nested values keep their indent."""
    for i, line in enumerate(("..." if cycle else text).split("\n")):
        if i:
            printer.break_()
        printer.text(line)
