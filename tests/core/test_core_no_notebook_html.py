"""The pure core states facts as text; HTML for a notebook is rendered outside it, by a module that knows no pimm_fn value."""

import ast
import pathlib

import pimm_fn

ROOT = pathlib.Path(pimm_fn.__file__).parent


def _imports(path: pathlib.Path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
    return found


def test_no_core_module_builds_html():
    """No module of pimm_fn.core imports ``html`` or IPython, nor writes an HTML tag."""
    found = sorted(
        f"{p.name}: {reason}"
        for p in sorted((ROOT / "core").glob("*.py"))
        for reason in (
            *(f"imports {m}" for m in _imports(p) if m == "html" or m.startswith("IPython")),
            *(["writes <table>"] if "<table>" in p.read_text(encoding="utf-8") else []),
        )
    )
    assert not found, found


def test_the_notebook_renderer_is_a_leaf():
    """pimm_fn.notebook imports nothing of pimm_fn, so the core's values may call it without an upward dependency."""
    assert not {m for m in _imports(ROOT / "notebook.py") if m.split(".")[0] == "pimm_fn"}
