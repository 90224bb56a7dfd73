"""What every benchmark shares: statistics, the machine's description, results on disk.

Every comparison is a ratio measured inside one process run, after warm-up,
over several paired rounds; absolute times are reported but never asserted.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import sys

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def spread(values) -> dict:
    """``{"min", "median", "max", "n"}`` of ``values``."""
    values = list(values)
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def fmt_spread(s: dict, unit: str = "", digits: int = 2) -> str:
    """``median [min..max]`` as one cell of a table."""
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}..{s['max']:.{digits}f}]"


def versions() -> dict:
    """Versions of Python, torch, pimm_fn and the peers that are installed."""
    found = {"python": platform.python_version()}
    for name, module in (
        ("torch", "torch"),
        ("pimm_fn", "pimm_fn"),
        ("pytorch-ignite", "ignite"),
        ("lightning", "lightning"),
        ("torchtnt", "torchtnt"),
    ):
        try:
            found[name] = getattr(__import__(module), "__version__", "?")
        except ImportError:
            found[name] = None
    return found


def machine() -> dict:
    """CPU model, cores and memory of this machine, as far as it tells."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "os": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(name: str, payload: dict) -> pathlib.Path:
    """Write ``payload`` (plus machine and versions) to ``results/<name>.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"benchmark": name, "machine": machine(), "versions": versions(), **payload}
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path


def print_table(title: str, header: list[str], rows: list[list[str]], file=sys.stdout) -> None:
    """A plain-text table with aligned columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n## {title}", file=file)
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths)), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)), file=file)


def free_port() -> int:
    """A port nobody listens on now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
