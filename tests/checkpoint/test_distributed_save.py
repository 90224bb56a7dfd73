"""Real 2-rank gloo runs of save/discover/load (subprocesses, hard timeout)."""

import json
import os
import pathlib
import socket
import subprocess
import time

import _preloaded as preloaded
import pytest
import torch

from _dist_worker import local_state, replicated_state
from pimm_fn.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pimm_fn.checkpoint.formats import standard as _standard

pytestmark = pytest.mark.distributed
_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parents[1]
_TIMEOUT_S = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(root, world):
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": os.pathsep.join([str(_REPO), os.environ.get("PYTHONPATH", "")]),
    }
    logs = [root / f"rank{r}.log" for r in range(world)]
    procs = [
        preloaded.start([_HERE / "_dist_worker.py", r, world, root], env=env, cwd=_REPO, stdout=log)
        for r, log in enumerate(logs)
    ]
    deadline = time.monotonic() + _TIMEOUT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"ranks did not finish within {_TIMEOUT_S}s (a hang in a collective?)")
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log.read_text()[-4000:]}"


def test_two_ranks_save_and_load_their_own_local_state(tmp_path, same):
    """Each rank restores its own local state; discovery is identical on both; other world sizes load sensibly."""
    weights, trainer = replicated_state()
    save_checkpoint(tmp_path / "single", step=3, weights=weights, trainer=trainer, local=local_state(0))

    _run_ranks(tmp_path, world=2)

    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    assert results[0]["latest"] == [str(tmp_path / "model" / "last"), 20, "standard", 2]
    assert results[0]["names"] == ["iter_20", "last"]

    # A single process reading the 2-rank checkpoint is rank 0: it gets rank 0's state.
    loaded = load_checkpoint(latest_checkpoint(tmp_path / "model"))
    assert loaded.info.world_size == 2
    same(local_state(0), loaded.local)
    same(trainer, loaded.trainer)
    same(dict(weights), dict(loaded.weights))
    # Rank 1's entry is stored separately (equal shapes were not de-duplicated).
    _, local1 = _standard.read_trainer(loaded.info.path, rank=1)
    same(local_state(1), local1)
    assert not torch.equal(local_state(0)["rng"], local_state(1)["rng"])
