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
import subprocess
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]


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


def run_ranks(module: str, args: list[str], base: pathlib.Path, *, world: int, timeout: float) -> None:
    """``python -m <module> <args> --rank <r>`` on ``world`` fresh processes, one thread each, torchrun's environment.

    Each rank's output goes to ``base/rank<r>.log``. A rank that fails, or a
    launch past ``timeout`` seconds, raises with the ranks' logs; every rank
    still running is killed.
    """
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=path)
    logs = [base / f"rank{r}.log" for r in range(world)]
    procs = []
    try:
        for rank, log in enumerate(logs):
            with open(log, "w") as f:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", module, *args, "--rank", str(rank)],
                        cwd=REPO,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    )
                )
        _wait(module, procs, timeout, logs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _wait(module: str, procs, timeout: float, logs) -> None:
    """Wait for every rank; a rank that fails or a launch past ``timeout`` raises with the ranks' logs."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.returncode not in (None, 0) for p in procs):
            time.sleep(2)  # let the other rank report too
            break
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    if codes != [0] * len(procs):
        tails = "\n".join(
            f"--- rank {r} (exit {c}) ---\n{log.read_text()[-3000:]}" for r, (c, log) in enumerate(zip(codes, logs))
        )
        raise RuntimeError(
            f"{module}: a rank failed, or the ranks did not finish within {timeout:.0f}s "
            f"(exit codes {codes}; None: still running, killed)\n{tails}"
        )
