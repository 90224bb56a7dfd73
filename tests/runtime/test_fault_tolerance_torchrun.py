"""Fault-tolerant replicas as torchrun groups: two groups of 2 gloo ranks each, launched by torchrun, one lighthouse.

One run shared by the assertions (``_ft_ranks.py`` on each rank): group 0,
the checkpoint writer, has its rank 0 SIGKILLed in the forward of step 6
(its rank 1, left in DDP's all-reduce, stops, and so does its torchrun
agent); group 1, whose rank 1 waits out the collectives' timeout with the
stuck rank 1 while its rank 0 fails at once, goes on alone, writing, and
holds at step 10 until group 0 is launched again; the restarted group 0
resumes from group 1's checkpoint, heals rank by rank from group 1 and
writes again.
Each group is started with ``REPLICA_GROUP_ID`` and ``TORCHFT_LIGHTHOUSE``,
group 1 from another seed (its weights differ until the first quorum's heal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("RUST_LOG", "error")  # torchft's lighthouse and managers log every quorum otherwise
torchft = pytest.importorskip("torchft")
from torchft._torchft import LighthouseServer  # noqa: E402 - after the skip

HERE = Path(__file__).parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import _ft_workers as workers  # noqa: E402

BOUND_S = 90  # every process ends within this, or the test fails
STEPS = 16
RANKS = (0, 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Groups:
    """The torchrun groups of the run (one agent each, in a session of its own), their ranks' records read back."""

    def __init__(self, tmp: Path, lighthouse: str):
        self.tmp, self.lighthouse = tmp, lighthouse
        self.agents: dict[str, subprocess.Popen] = {}

    def start(self, name: str, group: int, **opts) -> None:
        options = dict(
            save_dir=str(self.tmp / "save"), out=str(self.tmp / name), max_steps=STEPS, bound_s=BOUND_S, timeout=3
        )
        env = {
            **os.environ,
            "REPLICA_GROUP_ID": str(group),
            "TORCHFT_LIGHTHOUSE": self.lighthouse,
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            "--max-restarts=0",
            "--monitor-interval=0.1",
            str(HERE / "_ft_ranks.py"),
            json.dumps({**options, **opts}),
        ]
        with open(self.tmp / f"{name}.log", "w") as log:  # the agent holds its own copy
            self.agents[name] = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait(self, name: str, deadline: float) -> int:
        try:
            return self.agents[name].wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{name} did not end in time:\n{self.log(name)[-4000:]}") from None

    def kill(self) -> None:
        """SIGKILL every agent's session: the agent and its ranks."""
        for agent in self.agents.values():
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()

    def records(self, name: str, rank: int) -> list[dict]:
        path = self.tmp / f"{name}-rank{rank}"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def kinds(self, name: str, rank: int, kind: str) -> list[dict]:
        return [r for r in self.records(name, rank) if r["kind"] == kind]

    def commits(self, name: str, rank: int) -> list[int]:
        return [r["step"] for r in self.kinds(name, rank, "commit")]


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchrun")
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=800)
    g = Groups(tmp, lighthouse.address())
    deadline = time.monotonic() + BOUND_S
    ready = [str(tmp / f"ready{group}-rank{rank}") for group in (0, 1) for rank in RANKS]
    try:
        g.start("a", 0, die_at=6, die_in="forward", die_rank=0, ready=str(tmp / "ready0"), barrier=ready)
        g.start(
            "b",
            1,
            seed=7,
            hold_at=10,
            hold_until=str(tmp / "started-rank0"),
            ready=str(tmp / "ready1"),
            barrier=ready,
            refused=str(tmp / "refused"),
        )
        g.wait("a", deadline)
        g.start("c", 0, started=str(tmp / "started"))
        g.wait("b", deadline)
        g.wait("c", deadline)
    finally:
        g.kill()
        lighthouse.shutdown()
    return g


def _rejoined(groups) -> int:
    """The step the restarted group first took part in: 11 (group 1 holds at step 10 until it started), or a later
    one when its first quorum came after group 1's next (a busy machine)."""
    return groups.commits("c", 0)[0]


def test_the_group_of_the_killed_rank_stopped_and_the_other_never_raised(groups):
    assert groups.agents["a"].returncode != 0 and groups.log("a").count("Signal 9 (SIGKILL) received") == 1
    for name in ("b", "c"):
        assert groups.agents[name].returncode == 0, groups.log(name)[-4000:]  # a rank's exception exits 3
    joined = _rejoined(groups)
    assert 11 <= joined < STEPS
    for rank in RANKS:
        assert groups.commits("a", rank) == list(range(1, 6))  # rank 1 too: it never committed step 6
        assert groups.commits("b", rank) == list(range(1, STEPS + 1))  # each step once, none raised
        assert groups.commits("c", rank) == list(range(joined, STEPS + 1))  # from its heal at group 1's step on
        assert groups.kinds("b", rank, "end")[0]["step"] == STEPS == groups.kinds("c", rank, "end")[0]["step"]
    seen = [r["participants"] for r in groups.kinds("b", 0, "commit")]  # seen[i]: step i + 1
    assert seen[:5] == [2] * 5 and seen[5 : joined - 1] == [1] * (joined - 6)
    assert seen[joined - 1 :] == [2] * (STEPS - joined + 1)
    assert "step 6 was not committed by every replica group" in groups.log("b")  # its vote failed, drawn again


def test_each_rank_of_each_group_trains_its_own_share_each_sample_once_an_epoch(groups):
    seen: dict[int, list[int]] = {}
    for name in ("a", "b", "c"):
        for rank in RANKS:
            for r in groups.kinds(name, rank, "commit"):
                seen.setdefault(r["epoch"], []).extend(r["samples"])
    *whole, last = sorted(seen)
    assert len(whole) >= 3
    for epoch in whole:
        assert sorted(seen[epoch]) == list(range(4 * workers.STEPS_PER_EPOCH)), epoch
    assert len(set(seen[last])) == len(seen[last])
    first = [groups.kinds(name, rank, "commit")[0]["samples"] for name in ("a", "b") for rank in RANKS]
    assert len({tuple(s) for s in first}) == 4  # step 1: four ranks, four batches


def test_all_four_ranks_end_with_the_same_parameters_and_each_rank_equals_its_peer_in_the_other_group(groups):
    ends = {(name, rank): groups.kinds(name, rank, "parameters")[0] for name in ("b", "c") for rank in RANKS}
    assert len({(e["digest"], e["optimizer"]) for e in ends.values()}) == 1, ends
    for rank in RANKS:  # the buffers too: rank r of one group averages its batch norm statistics with rank r's
        b, c = ([(e["step"], e["weights"], e["state"]) for e in groups.kinds(name, rank, "end")] for name in "bc")
        assert b == c  # what each group executed and compared is its own
    # Group 1 started from other weights: the first quorum's heal made every rank of both groups alike.
    starts = {groups.kinds(name, rank, "begin")[0]["digest"] for name in ("a", "b") for rank in RANKS}
    assert len(starts) == 1


def test_the_restarted_group_heals_rank_by_rank_from_the_live_group(groups):
    joined = _rejoined(groups)
    for rank in RANKS:
        healed = [r for r in groups.kinds("c", rank, "begin") if r["healed"]]
        assert len(healed) == 1 and healed[0]["step"] == joined
        sources = [r["parts"] for r in groups.kinds("b", rank, "begin") if r["step"] == joined]
        assert healed[0]["parts"] in sources  # weights, optimizer, progress, best, data cursor: rank r's
        starts = {r["step"]: r["parts"] for r in groups.kinds("b", rank, "begin")}
        assert all(r["parts"] == starts[r["step"]] for r in groups.kinds("c", rank, "begin") if r["step"] > joined)
    assert "resumed from " in groups.log("c") and "/model/last at step 8" in groups.log("c")  # group 1's
    assert f"healed from rank 1, the state of step {joined - 1}" in groups.log("c")


def test_one_group_writes_each_checkpoint_all_of_its_ranks_in_the_save(groups):
    writers: dict[int, set] = {}
    for name in ("a", "b", "c"):
        for rank in RANKS:
            for r in groups.kinds(name, rank, "commit"):
                if r["writes"]:
                    writers.setdefault(r["step"], set()).add((name, rank))
    assert all(w in ({("a", 0), ("a", 1)}, {("b", 0), ("b", 1)}, {("c", 0), ("c", 1)}) for w in writers.values())
    assert {s for s, w in writers.items() if ("a", 0) in w} == set(range(1, 6))
    assert {8, 10} <= {s for s, w in writers.items() if ("b", 0) in w}  # alone: participating rank 0
    joined = _rejoined(groups)
    assert {s for s, w in writers.items() if ("c", 0) in w} == set(range(joined, STEPS + 1))  # "0:..." sorts first
    assert "saved checkpoint of step 8" in groups.log("b") and "saved checkpoint of step 16" in groups.log("c")
    last = groups.tmp / "save" / "model" / "last"
    assert json.loads((last / "COMPLETE").read_text())["world_size"] == 2  # one group's collective save
    receipts = sorted(p.name for p in (last / "receipts").iterdir())
    assert receipts == ["rank0", "rank1"] and len(list((last / "trainer").glob("*.distcp"))) == 2
    assert "took over" not in groups.log("b")  # each group its own lock in the shared save_dir
    assert sorted(p.name for p in (groups.tmp / "save").glob("replica-*")) == ["replica-0", "replica-1"]


def test_a_torchrun_group_without_ddp_is_refused_before_anything_is_written(groups):
    for rank in RANKS:
        said = groups.kinds("b", rank, "refused")[0]["message"]
        assert "in a torchrun group of 2 ranks needs the model in DistributedDataParallel" in said
        assert "Parallel(ddp=True, fault_tolerant=...)" in said
    assert not (groups.tmp / "refused").exists()
