"""Several nodes, simulated on one host: elastic restarts under torchrun, and a save_dir the nodes do not share.

Each simulated node is a torchrun agent of its own (``--nnodes=2
--nproc-per-node=1``) meeting the other through a c10d rendezvous on
127.0.0.1, as two machines would.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

from _launch import HERE, REPO, free_port, results, run_ranks
from pimm_fn.checkpoint import latest_checkpoint

pytestmark = pytest.mark.distributed


def torchrun_nodes(
    function: str, out: pathlib.Path, *, nodes: int = 2, max_restarts: int = 2, timeout: float = 120, **kwargs
) -> list:
    """Run ``_elastic_workers.<function>`` under one torchrun agent per simulated node; each agent's (exit code, log).

    Past ``timeout`` every agent's process group is killed and the test fails
    with the logs; the workers (in sessions of their own) end themselves at
    the same deadline.
    """
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + timeout
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: with the store the agents share with their workers (torch's default),
    # a restarted worker group can find the previous attempt's keys and hang in init_process_group
    # (pytorch/pytorch#135712): most restarts here hung without it. The README tells users the same.
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PIMM_TEST_DEADLINE": str(deadline),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id=pimm-{uuid.uuid4().hex}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        str(HERE / "_elastic_workers.py"),
        function,
        str(out),
        json.dumps(kwargs),
    ]
    logs = [out / f"{function}-node{n}-{time.monotonic_ns()}.log" for n in range(nodes)]
    agents = []
    for log in logs:
        with open(log, "w") as f:
            agents.append(
                subprocess.Popen(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            )
    try:
        for agent in agents:
            agent.wait(timeout=max(deadline - time.time(), 0.1))
    except subprocess.TimeoutExpired:
        _kill(agents)
        pytest.fail(f"torchrun on {nodes} nodes did not finish within {timeout}s\n{_report(logs)}")
    finally:
        _kill(agents)
    return [(agent.returncode, log.read_text()) for agent, log in zip(agents, logs)]


def _kill(agents) -> None:
    """SIGTERM each live agent's process group (the agent stops its workers), then SIGKILL what is left."""
    live = [a for a in agents if a.poll() is None]
    for agent in live:
        os.killpg(agent.pid, signal.SIGTERM)
    for agent in live:
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def _report(logs) -> str:
    return "\n".join(f"--- {log.name} ---\n{log.read_text()[-6000:]}" for log in logs)


def _assert_bit_identical(a, b, path="state"):
    """Two trees of tensors and plain values are equal, tensors bit for bit."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            _assert_bit_identical(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_bit_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_worker_killed_once_on_one_of_two_nodes_is_restarted_and_the_run_ends_bit_identical(tmp_path, kind):
    """torchrun --max-restarts restarts both nodes after rank 1 SIGKILLs itself; resume="auto" continues from step 8.

    The run ends with the weights, optimizer state and effect trace of an uninterrupted run.
    """
    run_ranks(
        "_elastic_workers:train",
        2,
        tmp_path / "ref",
        kind=kind,
        save_dir=str(tmp_path / "ref" / "run"),
        tag="ref",
        timeout=90,
    ).check()
    reference = results(tmp_path / "ref", "ref", 2)

    marker = tmp_path / "killed.marker"
    agents = torchrun_nodes(
        "train",
        tmp_path / "elastic",
        kind=kind,
        save_dir=str(tmp_path / "elastic" / "run"),
        tag="elastic",
        kill_after=10,
        kill_rank=1,
        marker=str(marker),
    )
    logs = "\n".join(log[-4000:] for _, log in agents)
    assert [code for code, _ in agents] == [0, 0], logs
    assert marker.read_text() == "rank 1 killed after step 10\n"
    assert "exitcode: -9" in logs  # an agent saw its worker SIGKILLed...
    resumed = results(tmp_path / "elastic", "elastic", 2)
    # ...and restarted its worker group: the agent of the killed worker counts a restart (the other agent
    # restarts its workers because the first one rejoined, without counting one).
    assert max(rank["restarts"] for rank in resumed) >= 1, logs
    for rank in range(2):
        assert resumed[rank]["restored"]["progress"].global_step == 8  # save_every(4): step 8 before the kill at 10
        for part in ("weights", "optimizer", "progress", "best"):
            _assert_bit_identical(resumed[rank]["final"][part], reference[rank]["final"][part], f"rank {rank} {part}")
        assert resumed[rank]["trace"] == [e for e in reference[rank]["trace"] if e.step > 8]
    assert latest_checkpoint(tmp_path / "elastic" / "run" / "model").step == 18


@pytest.fixture(scope="module")
def node_local(tmp_path_factory):
    """Rank r works in ``node<r>``: ``save_dir="run"`` is the same path on two nodes' own disks."""
    out = tmp_path_factory.mktemp("node_local")
    nodes = [out / f"node{r}" for r in range(2)]
    for node in nodes:
        node.mkdir()
    run_ranks(
        "_elastic_workers:node_local", 2, out, nodes=[str(n) for n in nodes], tag="node_local", timeout=90
    ).check()
    return out, results(out, "node_local", 2)


@pytest.mark.parametrize(("how", "step"), [("sync", 2), ("async", 3), ("loop", 4)])
def test_a_save_dir_not_shared_between_nodes_raises_on_every_rank(node_local, how, step):
    """Each rank raises CheckpointStorageError naming the missing rank, the hosts, rank 0's path and the fix."""
    out, found = node_local
    errors = [rank[how] for rank in found]
    assert errors[0] == errors[1], errors  # the same error on every rank
    kind, message = errors[0]
    assert kind == "CheckpointStorageError", message
    host = found[1]["host"]
    assert f"save_dir is not shared between nodes: rank 1's files (host {host}) are missing on rank 0" in message
    run = "loop" if how == "loop" else "run"
    assert f" at {out / 'node0' / run / 'model' / f'.staging-last-{step}'}; " in message
    assert "put save_dir on storage every node sees" in message


def test_a_save_dir_not_shared_between_nodes_publishes_nothing(node_local):
    """After the failed saves the latest checkpoint is still step 1, saved on shared storage; rank 1's files sit unpublished.

    Step 1 itself, a background save that both ranks wrote into one directory, passed the check.
    """
    out, found = node_local
    assert [rank["latest"] for rank in found] == [[1, None], [1, None]]
    assert [rank["loop_step"] for rank in found] == [4, 4]  # the loop stopped at its first save
    last = out / "node0" / "run" / "model" / "last"
    assert json.loads((last / "COMPLETE").read_text())["step"] == 1
    assert sorted(p.name for p in (last / "receipts").iterdir()) == ["rank0", "rank1"]
    assert not (out / "node0" / "loop" / "model" / "last").exists()
    rank1 = out / "node1" / "run" / "model"
    assert latest_checkpoint(rank1) is None
    assert (rank1 / ".staging-last-3" / "receipts" / "rank1").is_file()
    assert (rank1 / ".staging-last-3" / "trainer").is_dir()  # rank 1's DCP files went to its own disk
