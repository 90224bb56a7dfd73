"""Launch N real ranks of a worker function, each bounded by a hard timeout.

Every rank is a process of its own running
``python _workers.py <function> <rank> <world> <out> <json kwargs>`` (forked
from a server with torch imported: ``_preloaded``), with the torchrun-style
environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``).
Output goes to per-rank log files, never pipes, so a chatty rank cannot
block. When one rank dies, the others get ``grace`` seconds to notice before
they are killed; past ``timeout`` every rank is killed and the test fails
with their logs.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import socket
import time

import attrs
import pytest

import _preloaded as preloaded

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@attrs.frozen
class Ranks:
    """What the ranks of one launch did: exit codes, logs and wall time."""

    codes: tuple
    logs: tuple
    seconds: float

    def log(self, rank: int) -> str:
        return self.logs[rank]

    def check(self) -> "Ranks":
        """Fail the test, with every rank's log, unless all ranks exited 0."""
        if any(code != 0 for code in self.codes):
            pytest.fail(f"ranks exited with {list(self.codes)}\n{self.report()}")
        return self

    def report(self) -> str:
        return "\n".join(
            f"--- rank {r} (exit {c}) ---\n{log[-6000:]}" for r, (c, log) in enumerate(zip(self.codes, self.logs))
        )


def run_ranks(
    function: str,
    world: int,
    out,
    *,
    timeout: float = 60,
    grace: float = 10,
    script=HERE / "_workers.py",
    hash_seeds: bool = False,
    **kwargs,
) -> Ranks:
    """Run ``_workers.<function>(rank, world, out, **kwargs)`` on ``world`` ranks.

    Args:
        function: a function name in ``_workers`` (in ``script``).
        world: number of ranks.
        out: a directory the workers write results to.
        timeout: hard limit for the whole launch, in seconds.
        grace: seconds the surviving ranks get after one rank exits non-zero.
        script: the worker script run on every rank, with the same arguments (``_workers.py``'s; another joins
            its own groups).
        hash_seeds: each rank a fresh interpreter with a ``PYTHONHASHSEED`` of its own (``rank + 1``), so sets and
            dicts of strings iterate in another order on each rank: for a test that ranks agree whatever that order.
        kwargs: JSON-serializable arguments for the worker function.
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    args = json.dumps(kwargs)
    paths = [out / f"{function}-rank{r}-{time.monotonic_ns()}.log" for r in range(world)]
    start = time.monotonic()
    procs = [
        preloaded.start(
            [script, function, rank, world, out, args],
            env={
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                **({"PYTHONHASHSEED": str(rank + 1)} if hash_seeds else {}),
            },
            cwd=REPO,
            stdout=path,
            fresh_interpreter=hash_seeds,
        )
        for rank, path in enumerate(paths)
    ]
    failed_at = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if now - start > timeout:
                raise TimeoutError
            if failed_at is not None and now - failed_at > grace:
                break
            time.sleep(0.02)
    except TimeoutError:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        logs = "\n".join(f"--- rank {r} ---\n{path.read_text()[-6000:]}" for r, path in enumerate(paths))
        pytest.fail(f"{function} on {world} ranks did not finish within {timeout}s (a hang in a collective?)\n{logs}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return Ranks(
        tuple(p.returncode for p in procs), tuple(path.read_text() for path in paths), time.monotonic() - start
    )


def results(out, tag, world) -> list:
    """What each rank of the launch tagged ``tag`` dumped, in rank order."""
    found = []
    for rank in range(world):
        with open(pathlib.Path(out) / f"{tag}-rank{rank}.pkl", "rb") as f:
            found.append(pickle.load(f))
    return found
