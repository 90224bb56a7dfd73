"""The package's layout, measured: modules, lines, folders, import floors, and the modules a save and a resume enter.

``python -m benchmarks.layout [--root CHECKOUT]`` (``results/layout.json``). The static part reads
``pimm_fn/`` of ``CHECKOUT`` (this one by default) with ``ast``: every ``.py`` file is a module, a folder
with an ``__init__.py`` is a folder, an import anywhere in a module (inside a function too) is an arrow.
A module's floor is one above the highest module it imports (a module importing no other pimm_fn module
stands on floor 1); the floors are the highest one, over the package and within each folder (counting
only its modules' imports of each other). The trips run the package of ``CHECKOUT`` in a
process of their own and count, with ``sys.setprofile``, the pimm_fn modules and functions entered
while a ``save_every`` save is handled (the ``save_checkpoint`` handler, from its call to its return) and
while ``loop(resume="auto")`` finds and restores the checkpoint (``locate``, ``restore`` and
``resumed_state``, as ``loop()`` calls them). Both are found by their function names, so the same
command measures any checkout, before a move and after it.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import pathlib
import subprocess
import sys

from benchmarks import _common

HERE = pathlib.Path(__file__).resolve().parent
SMALL = 40  # lines: a module under this (an __init__.py aside) holds half a concept
TRIP_ENTRIES = {"save": {"save_checkpoint"}, "resume": {"locate", "restore", "resumed_state"}}


def modules_of(package: pathlib.Path) -> dict[str, pathlib.Path]:
    """Each module of ``package`` by its dotted name (a package's ``__init__.py`` by the package's)."""

    def name(path):
        parts = path.relative_to(package.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    return {name(p): p for p in sorted(package.rglob("*.py"))}


def imported(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The pimm_fn modules ``name`` imports anywhere in its body (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def _floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 1 + the highest floor it imports (an import cycle is cut where it closes)."""
    floor: dict[str, int] = {}

    def visit(name, stack):
        if name in floor:
            return floor[name]
        below = [visit(m, stack | {name}) for m in graph[name] if m not in stack | {name}]
        floor[name] = 1 + max(below, default=0)
        return floor[name]

    for name in graph:
        visit(name, frozenset())
    return floor


def static(root: pathlib.Path) -> dict:
    """Modules, lines, folders and floors of ``root/pimm_fn``."""
    package = root / "pimm_fn"
    modules = modules_of(package)
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in modules.items()}
    graph = {m: imported(m, p, modules) for m, p in modules.items()}
    per_folder = collections.Counter(str(p.parent.relative_to(root)) for p in modules.values())
    floors = _floors(graph)
    small = sorted(m for m, p in modules.items() if p.name != "__init__.py" and lines[m] < SMALL)
    folder_of = {m: str(p.parent.relative_to(root)) for m, p in modules.items()}
    within = {}  # a folder's own floors: its modules' imports of each other only
    for folder in per_folder:
        inside = {m for m in modules if folder_of[m] == folder}
        within[folder] = max(_floors({m: graph[m] & inside for m in inside}).values())
    return {
        "modules": len(modules),
        "lines": sum(lines.values()),
        "folders": len(per_folder),
        "modules_per_folder": dict(sorted(per_folder.items())),
        "largest_folder": max(per_folder.values()),
        f"modules_under_{SMALL}_lines": small,
        "floors": max(floors.values()),
        "floors_in_folder": dict(sorted(within.items())),
        "floors_of": {
            top: max(f for m, f in floors.items() if m.startswith(f"pimm_fn.{top}"))
            for top in ("core", "hooks", "testing", "runtime", "checkpoint", "compat", "cli")
        },
    }


_TRIPS = r'''
import json, os, sys, tempfile
import torch
import pimm_fn as pf

ENTRIES = json.loads(sys.argv[1])


class Trip:
    """The pimm_fn modules and functions entered while one of ``entries`` runs, from its call to its return."""

    def __init__(self, entries):
        self.entries, self.depth, self.modules, self.functions = set(entries), 0, set(), set()

    def __call__(self, frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("pimm_fn"):
            return
        code = frame.f_code
        if event == "call":
            if self.depth or code.co_name in self.entries:
                self.depth += 1
                self.modules.add(module)
                self.functions.add((module, code.co_qualname))
        elif event == "return" and self.depth:
            self.depth -= 1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, batch):
        (x,) = batch
        return {"loss": self.layer(x).pow(2).mean()}


def build(save_dir, resume=None):
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4)
    model = Net()
    return pf.loop(model, torch.optim.SGD(model.parameters(), lr=0.1), data, hooks=[pf.save_every(4)],
                   max_epochs=2, save_dir=save_dir, resume=resume, watching=pf.Watching(console=False, progress=False))


def traced(trip, work):
    sys.setprofile(trip)
    try:
        work()
    finally:
        sys.setprofile(None)
    return {"modules": len(trip.modules), "functions": len(trip.functions), "entered": sorted(trip.modules)}


save_dir = tempfile.mkdtemp()
run = build(save_dir)
run.run(steps=3)
found = {"save": traced(Trip(ENTRIES["save"]), lambda: run.run(steps=1))}  # the save of step 4
run.run()
found["resume"] = traced(Trip(ENTRIES["resume"]), lambda: build(save_dir, resume="auto"))
print(json.dumps(found))
'''


def trips(root: pathlib.Path) -> dict:
    """The save's and the resume's trips through ``root``'s package, measured in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    entries = json.dumps({k: sorted(v) for k, v in TRIP_ENTRIES.items()})
    done = subprocess.run(
        [sys.executable, "-c", _TRIPS, entries], capture_output=True, text=True, env=env, cwd=root, timeout=600
    )
    if done.returncode:
        raise RuntimeError(f"the trips of {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(root: pathlib.Path) -> dict:
    return {"root": str(root), **static(root), "trips": trips(root)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=HERE.parent, help="a checkout (default: this one)")
    parser.add_argument("--name", default="layout", help="results/<name>.json")
    args = parser.parse_args(argv)
    found = measure(args.root.resolve())
    path = _common.write_result(args.name, found)
    rows = [
        ["modules", found["modules"]],
        ["lines", found["lines"]],
        ["folders", found["folders"]],
        ["largest folder (modules)", found["largest_folder"]],
        [f"modules under {SMALL} lines", len(found[f"modules_under_{SMALL}_lines"])],
        ["import floors (package)", found["floors"]],
        ["import floors (most in one folder)", max(found["floors_in_folder"].values())],
        [
            "save trip: modules / functions",
            f"{found['trips']['save']['modules']} / {found['trips']['save']['functions']}",
        ],
        [
            "resume trip: modules / functions",
            f"{found['trips']['resume']['modules']} / {found['trips']['resume']['functions']}",
        ],
    ]
    _common.print_table(f"layout of {args.root}", ["measure", "value"], rows)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
