"""Resuming on another world size: the epoch continues after the samples consumed; the best value carries over.

48 samples, batch 4, 3 epochs: 6 steps per epoch on 2 ranks, 12 on 1. Every
run saves every 3 steps with snapshots, so one uninterrupted run per world
size gives the checkpoints each resume starts from.
"""

import collections
import json
import shutil

import pytest
import torch

import pimm_fn as pf
from _launch import results, run_ranks
from pimm_fn.core.effects import WriteBest
from pimm_fn.core.state import Progress

pytestmark = pytest.mark.distributed

SAMPLES, BATCH, EPOCHS = 48, 4, 3
TIMEOUT = 120

# Evaluations every 3 steps; the run stops (and saves) at step 8, mid-epoch on 1 and on 2 ranks.
FIRST = {"0": [0.2, 0.8], "1": [9.0, 9.0]}  # rank 1's "better" values are never broadcast
WORSE = {"0": [0.6, 0.7, 0.79, 0.5, 0.3, 0.1, 0.75, 0.2, 0.4], "1": [10.0] * 9}


def _steps_per_epoch(world):
    return SAMPLES // world // BATCH


# (saved by, resumed on, checkpoint step) -> the restored (epoch, iter_in_epoch) and the final global step.
# 2 -> 1 at step 9: epoch 1 after 3 of 6 steps, 3 * 4 * 2 = 24 samples consumed; on 1 rank the other 24
#   are 6 batches: step 6 of 12, then 6 + 12 more steps. 1 -> 2 at step 15: epoch 1 after 3 of 12 steps,
#   12 consumed; the other 36 are 18 a rank, 5 batches (the last of 2): step 1 of 6, then 5 + 6 more.
CASES = {
    (2, 1, 9): ((1, 6), 9 + 6 + 12),
    (1, 2, 15): ((1, 1), 15 + 5 + 6),
    (2, 1, 12): ((1, 12), 12 + 12),  # the end of epoch 1 on 2 ranks
    (1, 2, 12): ((0, 6), 12 + 6 + 6),  # the end of epoch 0 on 1 rank
}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One uninterrupted run on 2 ranks and one on 1 rank: their directories (snapshots every 3 steps) and results."""
    out = tmp_path_factory.mktemp("full")
    found = {}
    for world in (2, 1):
        run_ranks(
            "_world_workers:train", world, out, timeout=TIMEOUT, save_dir=str(out / f"w{world}"), tag=f"w{world}"
        ).check()
        found[world] = (out / f"w{world}", results(out, f"w{world}", world))
    return found


@pytest.fixture(scope="module")
def resumed(full, tmp_path_factory):
    """``resumed(saved_by, resumed_on, step)``: the ranks' results of that resume (each launched once)."""
    done = {}

    def launch(saved_by, resumed_on, step, **data):
        key = (saved_by, resumed_on, step, tuple(sorted(data.items())))
        if key not in done:
            out = tmp_path_factory.mktemp("resumed")
            run_dir = out / "run"
            shutil.copytree(full[saved_by][0], run_dir)
            run_ranks(
                "_world_workers:train",
                resumed_on,
                out,
                timeout=TIMEOUT,
                save_dir=str(run_dir),
                tag="r",
                resume=str(run_dir / "model" / f"iter_{step}"),
                **data,
            ).check()
            done[key] = (run_dir, results(out, "r", resumed_on))
        return done[key]

    return launch


def _epoch_samples(ranks, first_step, steps):
    """The samples all ``ranks`` trained on in ``steps`` steps from their ``first_step`` (1-based) on, counted."""
    counted = collections.Counter()
    for rank in ranks:
        for batch in rank["seen"][first_step - 1 : first_step - 1 + steps]:
            counted.update(batch)
    return counted


@pytest.mark.parametrize(("saved_by", "resumed_on", "step"), [k for k in CASES if k[2] != 12])
def test_a_resume_on_another_world_size_continues_the_epoch_after_the_samples_consumed(
    full, resumed, saved_by, resumed_on, step
):
    """Mid-epoch, the interrupted epoch trains each sample once in all (before and after), then new-size epochs."""
    (epoch, at), final_step = CASES[(saved_by, resumed_on, step)]
    old, new = _steps_per_epoch(saved_by), _steps_per_epoch(resumed_on)
    _, ranks = resumed(saved_by, resumed_on, step)
    before = _epoch_samples(full[saved_by][1], epoch * old + 1, step - epoch * old)
    after = _epoch_samples(ranks, 1, new - at)
    assert before + after == collections.Counter(range(SAMPLES))  # none repeated, none skipped
    for later in range(epoch + 1, EPOCHS):
        first = new - at + (later - epoch - 1) * new + 1
        assert _epoch_samples(ranks, first, new) == collections.Counter(range(SAMPLES))
    for rank in ranks:
        p = rank["restored"]["progress"]
        assert (p.epoch, p.iter_in_epoch, p.iters_per_epoch, p.global_step) == (epoch, at, new, step)
        (message,) = [m for c, m in rank["warnings"] if c == "ResumeNotExactWarning"]
        assert f"{(step - epoch * old) * BATCH * saved_by} samples consumed" in message
        assert f"continues after them at step {at} of {new}" in message
        assert rank["final"]["progress"].global_step == final_step


@pytest.mark.parametrize(("saved_by", "resumed_on", "step"), [k for k in CASES if k[2] == 12])
def test_a_resume_on_another_world_size_at_an_epoch_boundary_has_the_new_epoch_length(
    full, resumed, saved_by, resumed_on, step
):
    """At an epoch's end the state holds the new length, at its end; every later epoch trains each sample once."""
    (epoch, at), final_step = CASES[(saved_by, resumed_on, step)]
    new = _steps_per_epoch(resumed_on)
    _, ranks = resumed(saved_by, resumed_on, step)
    for rank in ranks:
        p = rank["restored"]["progress"]
        assert (p.epoch, p.iter_in_epoch, p.iters_per_epoch, p.at_epoch_end) == (epoch, at, new, True)
        assert not [m for c, m in rank["warnings"] if c == "ResumeNotExactWarning"]
        assert rank["final"]["progress"].global_step == final_step
    for later in range(epoch + 1, EPOCHS):
        first = (later - epoch - 1) * new + 1
        assert _epoch_samples(ranks, first, new) == collections.Counter(range(SAMPLES))


@pytest.mark.parametrize(("saved_by", "resumed_on", "step"), list(CASES))
def test_a_resume_on_another_world_size_executes_what_plan_predicts_for_the_new_size(
    full, resumed, saved_by, resumed_on, step
):
    """The saves go on by global_step and the run ends where plan, started at the restored progress, says."""
    _, ranks = resumed(saved_by, resumed_on, step)
    restored = ranks[0]["restored"]["progress"]
    planned = pf.plan(
        [pf.save_every(3, snapshots=True)],
        iters_per_epoch=_steps_per_epoch(resumed_on),
        max_epochs=EPOCHS,
        start=restored,
    )
    assert planned[-1].step == CASES[(saved_by, resumed_on, step)][1]
    for rank in ranks:
        assert [(e.step, e.effect) for e in rank["trace"]] == [(e.step, e.effect) for e in planned]


def test_a_same_size_resume_inside_a_continued_epoch_is_bit_identical(full, resumed, tmp_path):
    """A checkpoint written while a 2 -> 1 resume continued its epoch resumes on 1 rank exactly as it went on."""
    run_dir, (went_on,) = resumed(2, 1, 9)
    again_dir = tmp_path / "run"
    shutil.copytree(run_dir, again_dir)
    run_ranks(
        "_world_workers:train",
        1,
        tmp_path,
        timeout=TIMEOUT,
        save_dir=str(again_dir),
        tag="again",
        resume=str(again_dir / "model" / "iter_12"),
    ).check()
    (again,) = results(tmp_path, "again", 1)
    assert not [m for c, m in again["warnings"] if c == "ResumeNotExactWarning"]
    assert again["restored"]["progress"].iter_in_epoch == 9  # 6 + the 3 steps after step 9
    assert again["seen"] == went_on["seen"][3:]
    for name, tensor in went_on["final"]["weights"].items():
        assert torch.equal(again["final"]["weights"][name], tensor), name


def test_a_sampler_that_cannot_be_positioned_restarts_the_epoch_and_strict_refuses(full, resumed):
    """A sampler other than torch's DistributedSampler: the epoch restarts, the warning says why; strict refuses."""
    _, (rank,) = resumed(2, 1, 9, sampler="own", strict_first=True)
    assert "not a torch DistributedSampler" in rank["strict"] and "strict_resume=False" in rank["strict"]
    (message,) = [m for c, m in rank["warnings"] if c == "ResumeNotExactWarning"]
    assert "OwnSampler, not a torch DistributedSampler" in message and "restarts from its first batch" in message
    p = rank["restored"]["progress"]
    assert (p.epoch, p.iter_in_epoch, p.global_step, rank["restored"]["position"]) == (1, 0, 9, "BeforeEpoch")
    assert rank["final"]["progress"].global_step == 9 + 12 + 12


def test_a_resume_on_another_world_size_with_more_workers_warns_once_and_continues(full, resumed):
    """num_workers 0 -> 2 with the world size: one line names it; the epoch still continues by samples."""
    (epoch, at), final_step = CASES[(2, 1, 9)]
    _, (rank,) = resumed(2, 1, 9, num_workers=2)
    (message,) = [m for c, m in rank["warnings"] if c == "ResumeNotExactWarning"]
    assert "num_workers 0 -> 2" in message and f"continues after them at step {at} of 12" in message
    before = _epoch_samples(full[2][1], 7, 3)
    assert before + _epoch_samples([rank], 1, 12 - at) == collections.Counter(range(SAMPLES))
    assert rank["final"]["progress"].global_step == final_step


# -- the best value a resume carries ----------------------------------------------------------------


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Checkpoints of step 8 (best score 0.8 at step 6) written by 2 ranks and by 1 rank."""
    out = tmp_path_factory.mktemp("stopped")
    found = {}
    for world in (2, 1):
        run_ranks(
            "train", world, out, save_dir=str(out / f"w{world}"), tag=f"w{world}", hooks="scores", scores=FIRST, steps=8
        ).check()
        found[world] = (out / f"w{world}", results(out, f"w{world}", world))
    return found


def _copy(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


def _best_file(run_dir):
    model_dir = run_dir / "model"
    return json.loads((model_dir / "model_best.json").read_text()), (model_dir / "model_best.pth").read_bytes()


def _check_restored(restored, saved):
    for name, tensor in saved["weights"].items():
        assert torch.equal(restored["weights"][name], tensor), f"weights {name!r} not restored"
    for key in ("exp_avg", "exp_avg_sq"):
        for index, state in saved["optimizer"]["state"].items():
            assert torch.equal(restored["optimizer"]["state"][index][key], state[key])
    assert restored["best"] == {"score": 0.8}
    assert restored["progress"].global_step == 8


def _check_no_worse_best(ranks, best_before):
    for rank in ranks:
        assert not [e for e in rank["trace"] if isinstance(e.effect, WriteBest)]
        assert rank["final"]["best"] == {"score": 0.8}


@pytest.mark.parametrize(("saved_by", "resumed_on"), [(2, 1), (1, 2)])
def test_resume_on_another_world_size_carries_weights_optimizer_and_best(stopped, tmp_path, saved_by, resumed_on):
    """Weights, optimizer, progress and best carry over; the epoch goes on after the samples consumed, strict too."""
    run_dir, saved = stopped[saved_by]
    run_dir = _copy(run_dir, tmp_path)
    best_before = _best_file(run_dir)
    assert best_before[0] == {"metric": "score", "value": 0.8, "step": 6}
    run_ranks(
        "train",
        resumed_on,
        tmp_path,
        save_dir=str(run_dir),
        tag="resumed",
        hooks="scores",
        scores=WORSE,
        resume="auto",
        strict_first=True,
    ).check()
    ranks = results(tmp_path, "resumed", resumed_on)
    consumed = {2: 2 * BATCH * 2, 1: 8 * BATCH}[saved_by]  # epoch 1 after 2 of 6 steps on 2 ranks; epoch 0 after 8 on 1
    for rank in ranks:
        assert rank["strict"] is None  # the data position carries over: strict accepts
        assert [w for w in rank["warnings"] if w[0] == "ResumeNotExactWarning"], rank["warnings"]
        _check_restored(rank["restored"], saved[0]["final"])
        p = rank["restored"]["progress"]
        assert p.iters_per_epoch == _steps_per_epoch(resumed_on)
        assert p.iters_per_epoch - p.iter_in_epoch == -(-(SAMPLES - consumed) // resumed_on // BATCH)
        assert rank["final"]["position"] == "AfterTrain"
    _check_no_worse_best(ranks, best_before)
    assert _best_file(run_dir) == best_before


def test_resume_keeps_the_agreed_best_and_never_overwrites_it_with_worse(stopped, tmp_path):
    """A same-size resume restores rank 0's broadcast best on every rank; worse scores write no model_best."""
    run_dir = _copy(stopped[2][0], tmp_path)
    best_before = _best_file(run_dir)
    run_ranks(
        "train", 2, tmp_path, save_dir=str(run_dir), tag="resumed", hooks="scores", scores=WORSE, resume="auto"
    ).check()
    ranks = results(tmp_path, "resumed", 2)
    for rank in ranks:
        assert rank["restored"]["best"] == {"score": 0.8}
        assert rank["restored"]["progress"].global_step == 8
        assert not [w for w in rank["warnings"] if w[0] == "ResumeNotExactWarning"]
    _check_no_worse_best(ranks, best_before)
    assert _best_file(run_dir) == best_before


def test_plan_from_a_restored_progress_ends_after_the_remaining_epochs():
    """plan(start=...) walks the rest of the restored epoch and the later ones at the given length."""
    start = Progress(12, EPOCHS, epoch=1, iter_in_epoch=6, global_step=9)
    trace = pf.plan([pf.save_every(3)], iters_per_epoch=12, max_epochs=EPOCHS, start=start)
    assert [e.step for e in trace] == [12, 15, 18, 21, 24, 27]
