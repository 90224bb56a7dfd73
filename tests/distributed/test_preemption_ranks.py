"""Preemption on 2 gloo ranks under torchrun: SIGTERM to one worker, or to the agent, saves one agreed step.

Each case: every rank stops at the same step, that step is saved once (a
normal checkpoint whose marker says ``saved_for``), every worker exits with
75, and a resume ends bit-identical to an uninterrupted run (one launch
resumes both cases and trains the reference).
"""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from _launch import HERE, REPO, free_port, results, run_ranks

pytestmark = pytest.mark.distributed

TIMEOUT = 90


def _start(out: pathlib.Path, save_dir: pathlib.Path) -> subprocess.Popen:
    """Train under a torchrun agent of 2 workers (a session of its own); its log is ``out/agent.log``."""
    out.mkdir(parents=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        str(HERE / "_preemption_workers.py"),
        str(out),
        str(save_dir),
    ]
    with open(out / "agent.log", "w") as f:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _signal_when_ready(agents: dict, tmp_path, delays: dict, deadline: float) -> None:
    """SIGTERM each case's victim (the agent, or rank 1) ``delays[victim]`` s after both its workers trained two steps.

    The cases are watched together: each one's delay counts from its own workers' second step, not from the
    other case's signal.
    """
    due, waiting = {}, dict(agents)
    while waiting:
        now = time.monotonic()
        for victim, agent in list(waiting.items()):
            ready = [tmp_path / victim / f"ready-rank{r}" for r in range(2)]
            if victim not in due:
                if all(r.exists() and r.read_text() for r in ready):
                    due[victim] = now + delays[victim]
                elif agent.poll() is not None or now > deadline:
                    pytest.fail(f"the workers never trained:\n{(tmp_path / victim / 'agent.log').read_text()[-6000:]}")
            elif now >= due[victim]:
                os.kill(agent.pid if victim == "agent" else int(ready[1].read_text()), signal.SIGTERM)
                del waiting[victim]
        time.sleep(0.005)


def _torchrun_cases(tmp_path, delays: dict) -> dict:
    """Both launches at once, each signalled as ``delays`` says; each case's agent log."""
    deadline = time.monotonic() + TIMEOUT
    agents = {victim: _start(tmp_path / victim, tmp_path / victim / "run") for victim in delays}
    try:
        _signal_when_ready(agents, tmp_path, delays, deadline)
        for victim, agent in agents.items():
            agent.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not end within {TIMEOUT}s of the SIGTERM")
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    return {victim: (tmp_path / victim / "agent.log").read_text() for victim in delays}


def _same(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_sigterm_to_one_worker_or_to_the_agent_saves_one_agreed_step_and_resumes_bit_identical(tmp_path):
    """Both ranks stop at one step, save it once (saved_for SIGTERM), exit 75; the resumes end as the reference."""
    cases = {}
    delays = {victim: random.uniform(0.0, 0.25) for victim in ("worker", "agent")}
    for victim, log in _torchrun_cases(tmp_path, delays).items():
        delay, save_dir = delays[victim], tmp_path / victim / "run"
        stopped = [json.loads((tmp_path / victim / f"stopped-rank{r}.json").read_text()) for r in range(2)]
        context = f"{victim}, SIGTERM {delay:.3f}s after step 2:\n{log[-4000:]}"
        assert [s["code"] for s in stopped] == [75, 75], context
        assert stopped[0]["stopped"] == stopped[1]["stopped"], context  # one agreed step, on every rank
        step = stopped[0]["stopped"]["step"]
        assert stopped[0]["stopped"]["reason"] == "SIGTERM"
        marker = json.loads((save_dir / "model" / "last" / "COMPLETE").read_text())
        assert marker["step"] == step and marker["world_size"] == 2, context
        assert marker.get("saved_for") == "SIGTERM" or step % 4 == 0, context  # save_every(4)'s own save holds it
        assert log.count("SIGTERM: saved step") == 1, context  # one line, from rank 0
        cases[str(save_dir)] = step
        print(f"{victim}: SIGTERM {delay:.3f}s after step 2 -> every rank saved step {step}")

    run_ranks(
        "_preemption_workers:finish", 2, tmp_path / "finish", save_dirs=list(cases), tag="finish", timeout=TIMEOUT
    ).check()
    for rank in results(tmp_path / "finish", "finish", 2):
        for save_dir, step in cases.items():
            resumed = rank[save_dir]
            assert resumed.pop("resumed_at") == step
            _same(resumed, rank["reference"])


@pytest.mark.parametrize("ending", ["finished", "preempted", "early stop", "exception"])
def test_pimm_fns_own_groups_are_destroyed_when_run_ends_on_every_path(tmp_path, ending):
    """Finished, preempted, stopped early, or left on an exception alike on both ranks and continued to the end: once
    run() is done, torch holds only the script's default group, and the gloo threads of pimm_fn's groups are gone.
    Left on the exception, only the group of the background save still in flight is kept (its save goes on)."""
    run_ranks(
        "_preemption_workers:groups_after_run",
        2,
        tmp_path,
        timeout=TIMEOUT,
        save_dir=str(tmp_path / "run"),
        ending=ending,
        tag="groups",
    ).check()
    for rank, seen in enumerate(results(tmp_path, "groups", 2)):
        before, during, after = seen["before"], seen["during"], seen["after"]
        assert seen["ended"] == ending and during == 3 and before[0] == 1, (rank, seen)  # two groups of pimm_fn's
        assert after[-1] == before and seen["finished"] == (ending != "preempted"), (rank, seen)
        if ending == "exception":  # the preemption agreement's group destroyed; the saver's, with its save, kept
            assert after[0][0] == 2, (rank, seen)
