"""The README's torchrun line works as written after scripts/setup.sh: the venv's torchrun runs the demo on 2 ranks."""

import pathlib
import re
import shlex
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = [
    "--num-train",
    "32",
    "--num-val",
    "8",
    "--points",
    "128",
    "--batch-size",
    "8",
    "--threads",
    "2",
    "--epochs",
    "1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# torch's own teardown race, not the run's: a gloo worker thread that frees a finished collective after Python began
# to finalize aborts the process (benchmarks/exit_codes.py measures it, a plain DDP script included).
TEARDOWN_ABORT = "terminate called without an active exception"


def test_the_readme_torchrun_line_trains_the_demo_on_two_ranks(tmp_path):
    """`.venv/bin/torchrun --nproc_per_node=2 examples/train_pointcloud.py` (this venv's) finishes on 2 ranks, and
    `python -m pimm_fn status` says so; torchrun's exit code is 0 but for torch's own abort at exit."""
    (line,) = re.findall(
        r"^    (\.venv/bin/torchrun .*examples/train_pointcloud\.py)$", (ROOT / "README.md").read_text(), re.M
    )
    command = shlex.split(line)
    command[0] = str(pathlib.Path(sys.executable).parent / "torchrun")  # .venv/bin/, wherever the venv is
    command[1:1] = [f"--master_port={_free_port()}"]  # tests run side by side: not the default port
    done = subprocess.run(
        [*command, *TINY, "--save-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0 or TEARDOWN_ABORT in done.stderr, done.stderr[-3000:]
    assert "on 2 rank(s)" in done.stdout and "set_vital" not in done.stderr, done.stdout + done.stderr[-2000:]
    status = subprocess.run(
        [sys.executable, "-m", "pimm_fn", "status", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0 and status.stdout.startswith("finished: "), (status, done.stderr[-3000:])
