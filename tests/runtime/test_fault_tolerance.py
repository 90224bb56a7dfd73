"""Fault-tolerant replicas (``Parallel(fault_tolerant=FaultTolerance(...))``): real processes, an in-process lighthouse.

Runs of replica processes (``_ft_workers.py``), each shared by the
assertions about it: two groups with a GradScaler and
``on_nonfinite="skip"``, a loss NaN on one and gradients overflowing on the
other, one SIGKILLed at a step and restarted; three groups, the checkpoint
writer SIGKILLed during a save and restarted, another SIGKILLed during an
evaluation and left dead; two groups of two named optimizers, one killed
and restarted; two pairs of groups that fold apart (other hooks; a decision
from a group-local input); two groups under on_nonfinite="raise", a loss NaN
on one. Then the faults a single process meets: an
unreachable lighthouse, too few groups, no torchft.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import latest_checkpoint
from pimm_fn.core.effects import SaveCheckpoint, WriteBest
from pimm_fn.core.membership import Membership
from pimm_fn.core.plan import plan
from pimm_fn.testing.replicas import simulate_replicas

os.environ.setdefault("RUST_LOG", "error")  # torchft's lighthouse and managers log every quorum otherwise
torchft = pytest.importorskip("torchft")
from torchft._torchft import LighthouseServer  # noqa: E402 - after the skip

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import _ft_workers as workers  # noqa: E402
import _preloaded as preloaded  # noqa: E402

BOUND_S = 60  # every process ends within this, or the test fails
STEPS = 24
SCALE = 1024.0  # the GradScaler's initial scale in the two groups' run
NAN_AT, OVERFLOW_AT = 3, 5
NAMED = dict(
    named=True, max_steps=12
)  # the named optimizers' run: SGD for the linear layer, Adam for the norm  # the step group 0's loss is NaN at, and group 1's scaled gradients overflow at


class Replicas:
    """The replica processes of one scenario, their records read back."""

    def __init__(self, tmp: Path, lighthouse: str):
        self.tmp, self.lighthouse = tmp, lighthouse
        self.procs: dict[str, preloaded.Process] = {}

    def start(self, name: str, replica: int, **opts) -> preloaded.Process:
        options = dict(
            replica=replica,
            lighthouse=self.lighthouse,
            save_dir=str(self.tmp / "save"),
            out=str(self.tmp / name),
            max_steps=STEPS,
        )
        options.update(opts)
        proc = preloaded.start([HERE / "_ft_workers.py", json.dumps(options)], stdout=self.tmp / f"{name}.log")
        self.procs[name] = proc
        return proc

    def wait(self, name: str, deadline: float) -> int:
        try:
            return self.procs[name].wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._give_up(name, "did not end in time")

    def wait_for(self, path: Path, name: str, deadline: float) -> None:
        """Until ``name`` wrote ``path``; fails (every replica killed) past ``deadline`` or when ``name`` ended."""
        while not path.exists():
            if time.monotonic() > deadline or self.procs[name].poll() is not None:
                self._give_up(name, f"did not write {path.name}")
            time.sleep(0.01)

    def _give_up(self, name: str, why: str) -> NoReturn:
        """Every replica killed, and the test failed with ``name``'s log."""
        for proc in self.procs.values():
            proc.kill()
        raise AssertionError(f"{name} {why}:\n{self.log(name)[-3000:]}") from None

    def records(self, name: str) -> list[dict]:
        path = self.tmp / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def commits(self, name: str) -> list[int]:
        return [r["step"] for r in self.records(name) if r["kind"] == "commit"]

    def committed(self, name: str, step: int) -> dict:
        """The record of ``step``'s commit."""
        return next(r for r in self.records(name) if r["kind"] == "commit" and r["step"] == step)

    def began(self, name: str, step: int) -> dict:
        """The parts of ``step``'s last start (the one committed)."""
        return self.begins(name)[step][-1]["parts"]

    def ends(self, *names: str) -> list[tuple[str, str]]:
        """Each replica's weights and optimizer and scaler states at its end."""
        return [(r["weights"], r["state"]) for name in names for r in self.records(name) if r["kind"] == "end"]

    def begins(self, name: str, *, healed: bool = False) -> dict[int, list[dict]]:
        """Each step's starts, in order (a discarded step starts again, resized for the next quorum's participants).

        ``healed``: from the start after this replica's heal on (a restarted
        one may try a step from its checkpoint first, which its vote discards).
        """
        found: dict[int, list[dict]] = {}
        records = [r for r in self.records(name) if r["kind"] == "begin"]
        if healed:
            records = records[next(i for i, r in enumerate(records) if r["healed"]) :]
        for r in records:
            found.setdefault(r["step"], []).append(r)
        return found

    def same_starts(self, source: str, healed: str) -> bool:
        """Each start of ``healed`` from its heal on is one of ``source``'s at that step, in every part."""
        theirs = self.begins(source)
        return all(
            any(r["parts"] == s["parts"] for s in theirs[step])
            for step, starts in self.begins(healed, healed=True).items()
            for r in starts
        )


def _lighthouse():
    return LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=800)


def _killed_and_restarted(tmp: Path, *, die_at: int, hold_at: int, a=(), b=(), **both) -> Replicas:
    """Groups 0 (a) and 1 (b), each with ``both``: b SIGKILLed in the forward of ``die_at`` and restarted as c
    (resume='auto') once a is held at ``hold_at``, until c joined: a went on alone to there."""
    lighthouse = _lighthouse()
    r = Replicas(tmp, lighthouse.address())
    deadline = time.monotonic() + BOUND_S
    ready = [str(tmp / "ready0"), str(tmp / "ready1")]
    try:
        held = tmp / "held"
        r.start(
            "a",
            0,
            hold_at=hold_at,
            held=str(held),
            hold_until=str(tmp / "started"),
            ready=ready[0],
            barrier=ready,
            **dict(a),
            **both,
        )
        r.start("b", 1, die_at=die_at, die_in="forward", ready=ready[1], barrier=ready, **dict(b), **both)
        r.wait("b", deadline)
        r.wait_for(held, "a", deadline)
        r.start("c", 1, started=str(tmp / "started"), **both)
        r.wait("a", deadline)
        r.wait("c", deadline)
    finally:
        lighthouse.shutdown()
    return r


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Groups 0 and 1 with a GradScaler under on_nonfinite='skip': 0's loss NaN at step 3, 1's scaled gradients
    overflowing at 5; 1 SIGKILLed in the forward of step 7 and restarted (resume='auto'), 0 held at step 12 until
    it joined."""
    return _killed_and_restarted(
        tmp_path_factory.mktemp("two"),
        die_at=7,
        hold_at=12,
        a={"nan_at": NAN_AT},
        b={"overflow_at": OVERFLOW_AT},
        scaler=SCALE,
        on_nonfinite="skip",
    )


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Groups 0, 1, 2: 0 (the writer) SIGKILLed during the save of step 8 and restarted; 2 during the evaluation
    of step 9, left dead; 1 held at step 14 until 0 joined again; the restarted 0 hangs (SIGSTOP) in the forward
    of step 20, and 1 goes on alone after its collectives' timeout (2 s)."""
    tmp = tmp_path_factory.mktemp("three")
    lighthouse = _lighthouse()
    r = Replicas(tmp, lighthouse.address())
    deadline = time.monotonic() + BOUND_S
    ready = [str(tmp / f"ready{i}") for i in range(3)]
    try:
        r.start("r0", 0, die_at=8, die_in="save", ready=ready[0], barrier=ready, timeout=2)
        r.start("r1", 1, hold_at=14, hold_until=str(tmp / "started"), ready=ready[1], barrier=ready, timeout=2)
        r.start("r2", 2, die_at=9, die_in="eval", ready=ready[2], barrier=ready, timeout=2)
        r.wait("r0", deadline)
        r.start("r0b", 0, started=str(tmp / "started"), die_at=20, die_in="hang", timeout=2)
        r.wait("r2", deadline)
        r.wait("r1", deadline)
        r.procs["r0b"].kill()  # stopped since step 20
        r.wait("r0b", deadline)
    finally:
        lighthouse.shutdown()
    return r


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """Groups 0 and 1 of two named optimizers (a custom step): 1 SIGKILLed in the forward of step 4 and restarted,
    0 held at step 7 until it joined."""
    return _killed_and_restarted(tmp_path_factory.mktemp("named"), die_at=4, hold_at=7, **NAMED)


def _pair(r: Replicas, names: tuple[str, str], *options: dict) -> None:
    """Start groups 0 and 1 as ``names``, each with its ``options``, together and both in every quorum."""
    ready = [str(r.tmp / f"ready-{name}") for name in names]
    for replica, (name, opts) in enumerate(zip(names, options, strict=True)):
        r.start(name, replica, min_replicas=2, ready=ready[replica], barrier=ready, **opts)


@pytest.fixture(scope="module")
def apart(tmp_path_factory):
    """Two pairs of groups that fold apart, each pair its own lighthouse. ``hooks``: both trained 2 steps alike
    (``p0``, ``p1``: group 0 saved the last), then both resume there, group 0 saving every 4 steps and group 1 every
    3 (no heal: both are at step 2). ``local``: the same hooks, one of which emits a collective ``Call`` after step 2
    on group 1 alone. The first part of ``hooks`` runs beside ``local``."""
    tmp = tmp_path_factory.mktemp("apart")
    lighthouses = {name: _lighthouse() for name in ("hooks", "local")}
    found = {name: Replicas(tmp / name, lighthouses[name].address()) for name in lighthouses}
    deadline = time.monotonic() + BOUND_S

    try:
        for r in found.values():
            r.tmp.mkdir()
        _pair(found["hooks"], ("p0", "p1"), {"max_steps": 2}, {"max_steps": 2})
        _pair(found["local"], ("g0", "g1"), {"local_at": None}, {"local_at": 2})
        for name in ("p0", "p1"):
            found["hooks"].wait(name, deadline)
        _pair(found["hooks"], ("g0", "g1"), {"max_steps": 6, "save_every": 4}, {"max_steps": 6, "save_every": 3})
        for r in found.values():
            r.wait("g0", deadline)
            r.wait("g1", deadline)
    finally:
        for lighthouse in lighthouses.values():
            lighthouse.shutdown()
    return found


# -- two groups, one killed at a step and restarted -------------------------------------------------------------
def test_the_killed_replica_died_and_the_others_never_raised(two):
    assert two.procs["b"].returncode == -9
    for name in ("a", "c"):
        assert two.procs[name].returncode == 0, two.log(name)[-3000:]  # an exception out of run() exits 3
        assert two.records(name)[-1]["kind"] == "end" and two.records(name)[-1]["step"] == STEPS


def test_committed_steps_rise_one_by_one_on_every_replica(two):
    assert two.commits("a") == list(range(1, STEPS + 1))
    assert two.commits("b") == list(range(1, 7))
    committed = two.commits("c")
    assert committed == list(range(committed[0], STEPS + 1)) and committed[0] > 12


def test_the_step_the_killed_one_left_was_discarded_and_drawn_again(two):
    assert re.search(r"step 7 was not committed by every replica group \(.*\): discarded, drawn again", two.log("a"))
    begins = [r["step"] for r in two.records("a") if r["kind"] == "begin"]
    assert begins.count(7) == 2  # BeforeStep folded for the attempt, and again from the boundary for the redraw
    assert two.commits("a").count(7) == 1  # AfterStep for the committed one only


def test_each_sample_of_an_epoch_is_trained_once_whoever_is_alive(two):
    seen: dict[int, list[int]] = {}
    for name in ("a", "b", "c"):
        for r in two.records(name):
            if r["kind"] == "commit":
                seen.setdefault(r["epoch"], []).extend(r["samples"])
    *whole, last = sorted(seen)
    assert len(whole) >= 3
    for epoch in whole:
        assert sorted(seen[epoch]) == list(range(4 * workers.STEPS_PER_EPOCH)), epoch
    assert len(set(seen[last])) == len(seen[last])  # the epoch the run stopped in: none twice


def test_the_survivor_went_on_alone_then_with_the_restarted_one(two):
    seen = [r["participants"] for r in two.records("a") if r["kind"] == "commit"]
    assert seen[:6] == [2] * 6 and 1 in seen[6:12] and seen[-1] == 2


def test_the_healed_replica_equals_its_source_weights_optimizer_state_and_data_cursor(two):
    healed = [r for r in two.records("c") if r["kind"] == "begin" and r["healed"]]
    assert len(healed) == 1
    sources = [r["parts"] for r in two.begins("a")[healed[0]["step"]]]
    assert healed[0]["parts"] in sources  # weights, optimizer, progress, best, data cursor: each equal
    assert "healed from rank 0, the state of step" in two.log("c")


def test_every_replica_equals_the_others_after_every_committed_step_and_at_the_end(two):
    assert two.same_starts("a", "c")  # weights, optimizer, scaler, progress, data cursor
    ends = two.ends("a", "c")
    assert len(ends) == 2 and ends[0] == ends[1]


def test_a_loss_not_finite_on_one_group_skips_the_step_on_every_group(two):
    for name in ("a", "b"):  # a's loss was NaN; b's finite, and it skipped too
        assert two.committed(name, NAN_AT - 1)["skipped"] == 0 and two.committed(name, NAN_AT)["skipped"] == 1
        assert two.began(name, NAN_AT)["params"] == two.began(name, NAN_AT + 1)["params"]  # no update
        assert two.began(name, NAN_AT + 1)["params"] != two.began(name, NAN_AT + 2)["params"]  # the next one trained
    assert two.began("a", NAN_AT + 1) == two.began("b", NAN_AT + 1)
    assert "is not finite on another rank or replica group" in two.log("b")


def test_gradients_overflowing_on_one_group_skip_the_step_and_back_the_scale_off_on_every_group(two):
    def scale(name: str, step: int) -> float:
        return next(r["scale"] for r in two.records(name) if r["kind"] == "begin" and r["step"] == step)

    for name in ("a", "b"):  # b's scaled gradients overflowed; averaged, a's did too
        assert two.began(name, OVERFLOW_AT)["params"] == two.began(name, OVERFLOW_AT + 1)["params"]
        assert two.committed(name, OVERFLOW_AT)["skipped"] == 1  # a scaler's skip, not a non-finite loss
        assert scale(name, OVERFLOW_AT) == SCALE and scale(name, OVERFLOW_AT + 1) == SCALE / 2
    assert two.began("a", OVERFLOW_AT + 1) == two.began("b", OVERFLOW_AT + 1)
    assert {scale("a", STEPS), scale("c", STEPS)} == {SCALE / 2}  # the restarted group healed with it


def _executed(records: list[dict]) -> list[list]:
    return [effect for r in records for effect in r.get("effects", ())]


def _entries(entries, saves: bool = True) -> list[list]:
    """Simulated or planned entries as the workers write theirs; ``saves=False``: without the writes of rank 0."""
    return [
        [e.step, type(e.event).__name__, repr(e.effect), e.hook]
        for e in entries
        if saves or not isinstance(e.effect, (SaveCheckpoint, WriteBest))
    ]


def test_the_run_folds_what_plan_and_simulate_replicas_predict_for_its_membership(two):
    """The membership the run had (group 1 lost in step 7, back from the quorum that joined it), the evaluations'
    values it saw: group 0 executed plan's trace; group 1, before its loss and from its heal, the simulated one's,
    without the writes (group 0 wrote each, as the simulator has it)."""
    commits = [r for r in two.records("a") if r["kind"] == "commit"]
    back = next(r["step"] for r in commits if r["step"] > 7 and r["participants"] == 2)
    membership = Membership(2, lost={1: 7}, rejoined={1: back})
    metrics = {r["step"]: r["values"] for r in two.records("a") if r["kind"] == "eval"}
    hooks = [pf.evaluate_every(3, workers.val_loss, name="val"), pf.save_every(4), pf.best_on("val_loss", mode="min")]
    epoch = {"length": 4 * workers.STEPS_PER_EPOCH, "batch_size": 4, "max_steps": STEPS, "metrics": metrics}
    result = simulate_replicas(hooks, membership=membership, **epoch)
    assert [len(s.participants) for s in result.steps] == [r["participants"] for r in commits]
    assert _executed(two.records("a")) == _entries(plan(hooks, membership=membership, **epoch))
    assert _executed(two.records("a")) == _entries(result.runs[0].trace)
    assert {s.replica for s in result.saves} == {0}
    simulated = result.runs[1]
    (heal,) = simulated.heals
    assert heal.step == back - 1
    first = [e for e, tick in zip(simulated.trace[: heal.index], simulated.ticks) if tick is not None]
    assert _executed(two.records("b")) == _entries(first, saves=False)
    healed = two.records("c")
    healed = healed[next(i for i, r in enumerate(healed) if r["kind"] == "begin" and r["healed"]) + 1 :]
    assert _executed(healed) == _entries(simulated.trace[heal.index :], saves=False)
    assert len(_executed(healed)) >= 4  # evaluations at least, from step 15 on


def test_one_replica_group_writes_each_checkpoint(two):
    writers = {}
    for name in ("a", "b", "c"):
        for r in two.records(name):
            if r["kind"] == "commit" and r["writes"]:
                writers.setdefault(r["step"], []).append(name)
    assert all(len(names) == 1 for names in writers.values()), writers
    assert "took over" not in two.log("a")  # group 0 kept its own save_dir lock while group 1 came and went


# -- three groups: the writer killed during a save, another during an evaluation -------------------------------
def test_three_replicas_lose_two_and_the_restarted_one_rejoins(three):
    assert three.procs["r0"].returncode == -9 and three.procs["r2"].returncode == -9
    assert three.procs["r1"].returncode == 0, three.log("r1")[-3000:]
    assert three.commits("r1") == list(range(1, STEPS + 1))
    # Each died in the effects of its last step, after the hooks had folded it: the save of 8, the evaluation of 9.
    assert three.commits("r0")[-1] == 8 and three.commits("r2")[-1] == 9
    seen = {r["participants"] for r in three.records("r1") if r["kind"] == "commit"}
    assert {3, 1, 2} <= seen or {3, 2} <= seen


def test_a_hung_replica_is_left_behind_after_the_timeout(three):
    assert three.commits("r0b")[-1] == 19 and three.procs["r0b"].returncode == -9  # killed by the test, stopped
    assert re.search(r"step 20 was not committed by every replica group \(.*\): discarded", three.log("r1"))
    participants = {r["step"]: r["participants"] for r in three.records("r1") if r["kind"] == "commit"}
    assert participants[19] == 2 and participants[STEPS] == 1


def test_the_save_a_killed_writer_left_is_written_by_the_next(three):
    commits = {name: {r["step"]: r for r in three.records(name) if r["kind"] == "commit"} for name in ("r1", "r0b")}
    assert not commits["r1"][4]["writes"]  # group 0 wrote step 4
    # Step 12: group 1, participating rank 0 once group 0 died; or the restarted group 0, if it had rejoined by then
    # (it usually rejoins at step 14, where group 1 waits for it, but may come earlier on a busy machine).
    writer = "r1" if commits["r1"][12]["participants"] == 1 else "r0b"
    assert [name for name in commits if commits[name].get(12, {}).get("writes")] == [writer]
    assert "saved checkpoint of step 12" in three.log(writer)


def test_three_replicas_end_equal(three):
    assert three.begins("r0b", healed=True) and three.same_starts("r1", "r0b")


def test_a_checkpoint_written_degraded_resumes_in_a_plain_run(three):
    save_dir = three.tmp / "save"
    torch.manual_seed(123)
    model = workers.Net()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        workers.loader(),
        hooks=[
            pf.evaluate_every(3, workers.val_loss, name="val"),
            pf.save_every(4),
            pf.best_on("val_loss", mode="min"),
        ],
        max_steps=STEPS + 4,
        save_dir=save_dir,
        resume="auto",
        watching=pf.Watching(console=False, sanity_check=0),
    )
    assert run.state.progress.global_step == STEPS
    ends = {r["weights"] for r in three.records("r1") if r["kind"] == "end"}
    assert ends == {workers.digest(model.state_dict())}  # the writer's last checkpoint: the replicas' weights
    run.run()
    assert run.state.progress.global_step == STEPS + 4


# -- two groups of two named optimizers -------------------------------------------------------------------------
def test_named_optimizers_vote_once_a_step_and_every_group_ends_equal(named):
    assert named.procs["b"].returncode == -9
    for name in ("a", "c"):
        assert named.procs[name].returncode == 0, named.log(name)[-3000:]
    assert named.commits("a") == list(range(1, 13))
    assert re.search(r"step 4 was not committed by every replica group \(.*\): discarded", named.log("a"))
    ends = named.ends("a", "c")
    assert len(ends) == 2 and ends[0] == ends[1]  # the weights, and both optimizers' states


def test_a_restarted_group_of_named_optimizers_heals_equal_to_its_source(named):
    healed = [r for r in named.records("c") if r["kind"] == "begin" and r["healed"]]
    assert len(healed) == 1 and healed[0]["step"] > 4
    assert named.same_starts("a", "c")  # each optimizer's state among the parts


def test_groups_that_fold_alike_compare_at_every_vote_and_never_differ(two, three):
    """Through a kill, a heal, a discarded step and a hang: every committed vote of two or more groups compared."""
    for r, name in ((two, "a"), (two, "c"), (three, "r1")):
        (end,) = [e for e in r.records(name) if e["kind"] == "end"]
        two_or_more = [c for c in r.records(name) if c["kind"] == "commit" and c["participants"] > 1]
        assert end["compared"] >= len(two_or_more) > 0, name
        assert "disagree" not in r.log(name)


def test_groups_with_other_hooks_stop_together_at_the_first_vote_naming_the_hook(apart):
    """Resumed at one step, neither heals (the heal would refuse a run with other hooks): the vote tells them apart."""
    r = apart["hooks"]
    assert [r.procs[name].returncode for name in ("p0", "p1")] == [0, 0]
    for name in ("g0", "g1"):
        assert r.procs[name].returncode == 3, r.log(name)[-3000:]  # out of run(): the worker exits 3
        (error,) = [e for e in r.records(name) if e["kind"] == "error"]
        assert error["step"] == 2 and r.commits(name) == []  # before step 3's AfterStep: no hook saw it
        message = error["message"]
        assert message.startswith("replica groups disagree at the vote of step 3; replica groups fold different hooks")
        assert "  hook #1: group 0: save_every(4); group 1: save_every(3)\n" in message
        assert "Every replica group must build the same hook list" in message


def test_a_group_local_decision_stops_the_groups_at_the_next_vote_naming_the_effect(apart):
    r = apart["local"]
    for name in ("g0", "g1"):
        assert r.procs[name].returncode == 3, r.log(name)[-3000:]
        (error,) = [e for e in r.records(name) if e["kind"] == "error"]
        assert error["step"] == 2 and r.commits(name) == [1, 2]
        lines = error["message"].splitlines()
        assert lines[0].startswith("replica groups disagree at the vote of step 3: they folded different collective")
        assert lines[1] == "  group 0: nothing"
        assert lines[2] == (
            "  group 1: Call('__main__:noted', 2, scope=Scope.COLLECTIVE) from hook #4 __main__.main.<locals>.local_decision "
            "(AfterStep)"
        )
        assert "group-local input" in lines[3]


# -- a NaN loss on one group under on_nonfinite="raise" -------------------------------------------------------
@pytest.fixture(scope="module")
def nan_raised(tmp_path_factory):
    """Groups 0 and 1 under the default on_nonfinite='raise', saving every 2 steps: 0's loss NaN at step 3."""
    tmp = tmp_path_factory.mktemp("nan")
    lighthouse = _lighthouse()
    r = Replicas(tmp, lighthouse.address())
    deadline = time.monotonic() + BOUND_S
    try:
        both = {"max_steps": 6, "save_every": 2}
        _pair(r, ("n0", "n1"), {**both, "nan_at": NAN_AT}, both)
        r.wait("n0", deadline)
        r.wait("n1", deadline)
    finally:
        lighthouse.shutdown()
    return r


def test_a_loss_not_finite_on_one_group_raises_on_every_group_before_any_update(nan_raised):
    r = nan_raised
    for name, said in (("n0", "is nan at global step 3"), ("n1", "is not finite on another rank or replica group")):
        assert r.procs[name].returncode == 3, r.log(name)[-3000:]  # out of run(): the worker exits 3
        (error,) = [e for e in r.records(name) if e["kind"] == "error"]
        assert said in error["message"] and "global step 3" in error["message"], error["message"]
        assert r.commits(name) == [1, 2]  # step 3 never committed: no hook saw it
        assert error["params"] == r.began(name, NAN_AT)["params"]  # no optimizer stepped: the NaN is in no weights
    found = latest_checkpoint(r.tmp / "save" / "model")
    assert found is not None and found.step == 2  # the last checkpoint predates the NaN


# -- faults of one process -------------------------------------------------------------------------------------
def _loop(tmp_path, data=None, **tolerance):
    model = workers.Net()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        workers.loader() if data is None else data,
        max_steps=4,
        save_dir=tmp_path / "save",
        parallel=pf.Parallel(fault_tolerant=pf.FaultTolerance(replica_group="0", **tolerance)),
        watching=pf.Watching(sanity_check=0, progress=False),
    )


def test_an_unreachable_lighthouse_is_a_clear_error_within_connect_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(pf.ReplicaError, match="cannot reach the torchft lighthouse at http://127.0.0.1:1"):
        _loop(tmp_path, lighthouse="http://127.0.0.1:1", connect_timeout=1)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "save" / "pimm_fn.replica-0.lock").exists()  # released with the refusal


def test_fewer_than_min_replicas_wait_saying_so_then_a_clear_error(tmp_path, capsys):
    lighthouse = _lighthouse()
    try:
        run = _loop(tmp_path, lighthouse=lighthouse.address(), min_replicas=2, quorum_timeout=1)
        start = time.monotonic()
        try:
            with pytest.raises(pf.ReplicaError, match="only 1 of min_replicas=2 replica groups"):
                run.step()
        finally:
            run.ctx.replicas.close()
        assert time.monotonic() - start < 10
    finally:
        lighthouse.shutdown()
    assert "waiting for 2 replica groups (min_replicas), 1 in the quorum" in capsys.readouterr().out


def test_a_vote_that_always_fails_stops_the_run_after_ten_steps_discarded(tmp_path, capsys):
    lighthouse = _lighthouse()
    try:
        run = _loop(tmp_path, lighthouse=lighthouse.address())
        run.ctx.replicas.manager.should_commit = lambda: False  # a failure that is not a peer lost
        try:
            with pytest.raises(pf.ReplicaError, match="step 1 was not committed 10 times in a row"):
                run.step()
        finally:
            run.ctx.replicas.close()
    finally:
        lighthouse.shutdown()
    assert run.state.progress.global_step == 0 and run.interrupted is None  # no hook saw the step
    assert capsys.readouterr().out.count("step 1 was not committed by every replica group") == 9
    assert list(run.ctx.model.parameters())[0].grad is None  # the failed vote took the gradients away


def test_data_whose_order_other_replicas_cannot_compute_are_refused(tmp_path):
    shuffled = torch.utils.data.DataLoader(workers.dataset(), batch_size=4, shuffle=True)  # a RandomSampler
    with pytest.raises(
        TypeError, match="cannot be dealt over replicas: its sampler is a RandomSampler.*DistributedSampler"
    ):
        _loop(tmp_path, shuffled, lighthouse="http://127.0.0.1:1")
    assert not (tmp_path / "save").exists()  # refused before anything was written


def test_the_option_is_refused_without_torchft_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # its import fails, as where it is not installed
    with pytest.raises(ImportError, match=r"pip install 'pimm_fn\[ft\]'"):
        _loop(tmp_path, lighthouse="http://127.0.0.1:1")
    assert not (tmp_path / "save").exists()  # refused before anything was written


def test_the_group_and_the_lighthouse_come_from_the_option_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(
        ValueError, match="lighthouse's address: pass FaultTolerance.lighthouse=.* or set TORCHFT_LIGHTHOUSE"
    ):
        _loop(tmp_path)
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://127.0.0.1:1")
    with pytest.raises(pf.ReplicaError, match="at http://127.0.0.1:1 within connect_timeout=1 s"):
        _loop(tmp_path, connect_timeout=1)


@pytest.mark.parametrize(
    ("fields", "error", "says"),
    [
        ({"min_replicas": 0}, ValueError, "'min_replicas' must be an int >= 1"),
        ({"timeout": 0}, ValueError, "'timeout' must be a finite number > 0"),
        ({"quorum_timeout": float("inf")}, ValueError, "'quorum_timeout' must be a finite number > 0"),
        ({"lighthouse": 29510}, TypeError, "'lighthouse' must be None or an address"),
        ({"replica_group": 0}, TypeError, "'replica_group' must be None or a str"),
    ],
)
def test_a_malformed_option_is_refused_when_made(fields, error, says):
    with pytest.raises(error, match=re.escape(says)):
        pf.FaultTolerance(**fields)
    with pytest.raises(TypeError, match="'fault_tolerant' must be None or a pimm_fn.FaultTolerance"):
        pf.Parallel(fault_tolerant=fields)


def test_a_slow_quorum_is_said_once_and_a_quick_one_not_at_all():
    from pimm_fn.runtime.replicas.switch import Watch

    said: list[str] = []
    watch = Watch(said.append, "waiting for the quorum", after=0.05)
    try:
        for _ in range(100):  # quick waits: nothing said
            watch.begin()
            watch.end()
        watch.begin()
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # still waiting: said once
        watch.end()
    finally:
        watch.close()
    assert said == ["waiting for the quorum"]


def test_a_grad_scaler_with_a_custom_step_and_a_sharded_model_are_refused_before_anything_is_written(tmp_path):
    model = workers.Net()

    def step(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {}

    with pytest.raises(ValueError, match=re.escape("takes a GradScaler with a built-in step only")):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            workers.loader(),
            max_steps=4,
            save_dir=tmp_path / "save",
            step_fn=step,
            training=pf.Training(scaler=torch.amp.GradScaler("cpu")),
            parallel=pf.Parallel(fault_tolerant=pf.FaultTolerance(replica_group="0", lighthouse="http://127.0.0.1:1")),
        )
    assert not (tmp_path / "save").exists()
    from pimm_fn.runtime.replicas.switch import check

    option = pf.FaultTolerance(replica_group="0", lighthouse="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=re.escape("does not take a sharded model (FSDP2")):
        check(option, sharded=True, scaler=False, custom_step=False)
    check(option, sharded=False, scaler=True, custom_step=False)  # the built-in steps average before the scaler


def test_a_train_step_votes_once_a_step_whether_its_scaler_steps_or_skips(tmp_path):
    """TrainStep(precision='fp16') with clipping: each step one vote, the overflowing ones skipped and committed."""
    lighthouse = _lighthouse()
    try:
        model = workers.Net()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # past float16's range: the first steps overflow
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            workers.loader(),
            max_steps=6,
            save_dir=tmp_path / "save",
            step_fn=pf.TrainStep(precision="fp16", clip_grad_norm=1.0),
            training=pf.Training(scaler=scaler),
            parallel=pf.Parallel(fault_tolerant=pf.FaultTolerance(replica_group="0", lighthouse=lighthouse.address())),
            watching=pf.Watching(sanity_check=0, progress=False),
        )
        try:
            run.run(steps=4)
            assert run.ctx.replicas.manager.current_step() == 4  # one committed vote a step, no more
        finally:
            run.ctx.replicas.close()
    finally:
        lighthouse.shutdown()
    assert run.state.progress.global_step == 4 and scaler.get_scale() < 2.0**40  # some steps were skipped


def test_a_backward_after_a_steps_vote_is_refused_naming_the_fix(tmp_path):
    """A custom step that steps one optimizer and then runs another backward: its new gradients were never averaged."""

    def alternating(model, optimizers, batch, *, scheduler=None, scaler=None):
        for optimizer in optimizers.values():  # each optimizer on a loss of its own, one after the other
            optimizer.zero_grad()
            model(batch)["loss"].backward()
            optimizer.step()
        return {}

    lighthouse = _lighthouse()
    try:
        model = workers.Net()
        run = pf.loop(
            model,
            {
                "body": torch.optim.SGD(model.body.parameters(), lr=0.05),
                "norm": torch.optim.SGD(model.norm.parameters(), lr=0.05),
            },
            workers.loader(),
            max_steps=4,
            save_dir=tmp_path / "save",
            step_fn=alternating,
            parallel=pf.Parallel(fault_tolerant=pf.FaultTolerance(replica_group="0", lighthouse=lighthouse.address())),
            watching=pf.Watching(sanity_check=0, progress=False),
        )
        try:
            refused = r"SGD.step\(\) got gradients computed after this train step's vote"
            with pytest.warns(pf.ResumeNotExactWarning), pytest.raises(pf.ReplicaError, match=refused):
                run.step()  # after the first optimizer's step: said not exact
        finally:
            run.ctx.replicas.close()
    finally:
        lighthouse.shutdown()
