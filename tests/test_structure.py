"""The package's structure: no private imports across subpackages, no import cycles, no module state rebound.

All read from the source with ``ast`` (every ``import`` statement, at the
top of a module or inside a function), so an import hidden in a function
to dodge a cycle counts like any other.
"""

import ast
import collections
import pathlib

import pimm_fn
from benchmarks.layout import imported, modules_of  # the one import scan: the layout benchmark counts with it too

ROOT = pathlib.Path(pimm_fn.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    return modules_of(ROOT)


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def _subpackage(name: str) -> str:
    """``pimm_fn.checkpoint`` for any module under it; ``pimm_fn`` for the top-level package itself."""
    return ".".join(name.split(".")[:2])


def _is_private(name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    """An import inside a function counts, relative imports resolve, and a cycle of three is one component."""
    module = tmp_path / "mod.py"
    module.write_text("from . import validation\n\ndef f():\n    from pimm_fn.checkpoint import files as L\n")
    known = _modules()
    found = imported("pimm_fn.checkpoint.mod", module, known)
    assert found == {"pimm_fn.checkpoint.validation", "pimm_fn.checkpoint.files"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_module_imports_a_private_module_of_another_subpackage():
    """A subpackage's private modules (``_name.py``) are imported only from inside that subpackage."""
    crossings = sorted(
        f"{importer} imports {imported}"
        for importer, targets in _graph().items()
        for imported in targets
        if _is_private(imported) and _subpackage(imported) != _subpackage(importer)
    )
    assert not crossings, "private modules imported across subpackages (use the public module instead):\n" + "\n".join(
        crossings
    )


def test_no_import_cycles():
    """No set of pimm_fn modules imports itself around a cycle (top-level and function-level imports alike)."""
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_no_module_rebinds_its_own_globals():
    """No ``global`` statement: state lives in objects that own it (a run's BackgroundSaver), not in module variables."""
    found = sorted(
        f"{name}: global {', '.join(node.names)}"
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    )
    assert not found, "module state rebound through `global`:\n" + "\n".join(found)


def test_no_module_holds_half_a_concept():
    """Every module but a package's ``__init__.py`` has at least 40 lines: a smaller one belongs in the module it serves."""
    small = sorted(
        name
        for name, path in _modules().items()
        if path.name != "__init__.py" and len(path.read_text(encoding="utf-8").splitlines()) < 40
    )
    assert not small, f"modules under 40 lines (merge each into the module holding the rest of its concept): {small}"


def test_no_runtime_or_checkpoint_folder_holds_more_than_fifteen_modules():
    """The runtime's and the checkpoint's folders stay families a reader takes in at a glance."""
    counts = collections.Counter(str(path.parent.relative_to(ROOT)) for path in ROOT.rglob("*.py"))
    crowded = {
        folder: n for folder, n in counts.items() if folder.split("/")[0] in ("runtime", "checkpoint") and n > 15
    }
    assert not crowded, f"folders of more than 15 modules (split each into families): {crowded}"
