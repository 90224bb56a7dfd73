"""Every public name has its entry in the API reference: the build fails on one that has none.

The reference pages (``docs/reference/*.md``) name each entry by its public path (``::: pimm_fn.loop``); this
MkDocs hook compares those with ``__all__`` of ``pimm_fn``, ``pimm_fn.testing`` and ``pimm_fn.compat`` before
anything is rendered, so a name added to one of them without a page entry stops ``mkdocs build``.
"""

import importlib
import pathlib
import re

from mkdocs.exceptions import PluginError

PUBLIC = ("pimm_fn", "pimm_fn.testing", "pimm_fn.compat")
ENTRY = re.compile(r"^::: (pimm_fn[\w.]*)\s*$", re.M)


def public_names() -> set:
    """``module.name`` for every name the three public modules export."""
    return {f"{module}.{name}" for module in PUBLIC for name in importlib.import_module(module).__all__}


def entries(docs: pathlib.Path) -> set:
    """The paths the reference pages render, ``::: path`` each."""
    return {path for page in sorted((docs / "reference").glob("*.md")) for path in ENTRY.findall(page.read_text())}


def missing(docs: pathlib.Path) -> list:
    """The public names that no reference page renders."""
    return sorted(public_names() - entries(docs))


def on_pre_build(config, **kwargs):
    """Refuse to build a reference that leaves out a public name."""
    left_out = missing(pathlib.Path(config["docs_dir"]))
    if left_out:
        raise PluginError(f"the API reference has no entry for {', '.join(left_out)}: add `::: <name>` for each to "
                          "the page of docs/reference/ where it belongs")
