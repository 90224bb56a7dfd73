"""Run every benchmark, print one report and write ``benchmarks/RESULTS.md``.

``python -m benchmarks [--quick]``. Each part also runs alone, e.g.
``python -m benchmarks.loop_overhead``. The simulation, guard and FSDP2
checkpoint benchmarks and the digests one (``benchmarks.simulation``, ``benchmarks.guard``,
``benchmarks.fsdp_io``, which starts its own ranks, ``benchmarks.digests``, ``benchmarks.object_storage``,
which starts its own S3 server, ``benchmarks.preemption``, ``benchmarks.exit_codes``, which launches
torchrun, ``benchmarks.heal``, which starts its own ranks) run as processes of their
own when present; their figures are read back from ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import pathlib
import subprocess
import sys

from benchmarks import _common

HERE = pathlib.Path(__file__).resolve().parent
OURS = ("loop_overhead", "checkpoint_io", "async_save")
OTHERS = ("simulation", "guard", "fsdp_io", "digests", "object_storage", "preemption", "exit_codes", "layout", "heal")


def _run_other(name: str, quick: bool) -> str | None:
    """Run ``benchmarks.<name>`` as its own process, if it exists; returns its output."""
    if not (HERE / f"{name}.py").exists():
        return None
    cmd = [sys.executable, "-m", f"benchmarks.{name}"] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    return done.stdout + (f"\n(exit {done.returncode}: {done.stderr.strip()[-400:]})" if done.returncode else "")


def _json_section(name: str) -> str:
    path = _common.RESULTS / f"{name}.json"
    if not path.exists():
        return ""
    doc = json.loads(path.read_text())
    doc.pop("machine", None)
    doc.pop("versions", None)
    text = json.dumps(doc, indent=2)
    if len(text) > 4000:
        text = text[:4000] + "\n... (truncated; see the JSON file)"
    return f"\n## {name} (from results/{name}.json)\n\n```json\n{text}\n```\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks that everything runs")
    parser.add_argument("--only", nargs="*", choices=OURS + OTHERS, help="run only these parts")
    args = parser.parse_args(argv)
    report = io.StringIO()
    for name in OURS:
        if args.only and name not in args.only:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        result = module.run(quick=args.quick)
        module.table(result, file=report)
    others = {}
    for name in OTHERS:
        if args.only and name not in args.only:
            continue
        out = _run_other(name, args.quick)
        if out is not None:
            print(out)
            others[name] = out
    m, v = _common.machine(), _common.versions()
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m benchmarks{' --quick' if args.quick else ''}` on {m['date']}.",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
        "- every figure is a ratio measured in one process run, after warm-up, over paired rounds",
        "  (median [min..max]); absolute times vary with the machine's load.",
        "",
        "```",
        report.getvalue().strip(),
        "```",
    ]
    for name in OTHERS:
        lines.append(_json_section(name))
    (HERE / "RESULTS.md").write_text("\n".join(lines).rstrip() + "\n")
    print(f"\nwrote {HERE / 'RESULTS.md'} and {_common.RESULTS}/*.json")


if __name__ == "__main__":
    main()
