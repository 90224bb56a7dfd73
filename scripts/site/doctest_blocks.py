"""Docstring examples show as code in the API reference, as ``help()`` shows them.

The package's docstrings write their doctests bare (``>>> plan(...)`` and the value it prints), which Markdown
would read as text: ``[4, 8][-2:]`` as a link. This griffe extension fences each run of doctest lines (a ``>>>``
line up to the next blank line) as a ``pycon`` block, before the docstring is parsed; the source is left as it is.
"""

import griffe


def fenced(text: str) -> str:
    """``text`` with each doctest run inside a fenced ``pycon`` block."""
    out, in_block, indent = [], False, ""
    for line in text.split("\n"):
        stripped = line.lstrip()
        if not in_block and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out += ["", f"{indent}```pycon"]
            in_block = True
        elif in_block and not stripped:
            out += [f"{indent}```", ""]
            in_block = False
        out.append(line)
    if in_block:
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fences the doctests of every docstring the reference renders."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        """Fence the object's doctests once it is loaded (its docstring not yet parsed)."""
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fenced(obj.docstring.value)
