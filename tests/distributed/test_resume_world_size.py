"""Resuming on another world size, and the best value a resume carries."""

import json
import shutil

import pytest
import torch

from _launch import run_ranks
from conftest import results
from pimm_fn.core.effects import WriteBest

pytestmark = pytest.mark.distributed

# Evaluations every 3 steps; the run stops (and saves) at step 8, mid-epoch on 1 and on 2 ranks.
FIRST = {"0": [0.2, 0.8], "1": [9.0, 9.0]}  # rank 1's "better" values are never broadcast
WORSE = {"0": [0.6, 0.7, 0.79, 0.5, 0.3, 0.1, 0.75, 0.2, 0.4], "1": [10.0] * 9}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Checkpoints of step 8 (best score 0.8 at step 6) written by 2 ranks and by 1 rank."""
    out = tmp_path_factory.mktemp("stopped")
    found = {}
    for world in (2, 1):
        run_ranks("train", world, out, save_dir=str(out / f"w{world}"), tag=f"w{world}", hooks="scores",
                  scores=FIRST, steps=8).check()
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
    p = restored["progress"]
    assert (p.global_step, p.epoch, p.iter_in_epoch) == (8, saved["progress"].epoch, 0)
    assert restored["position"] == "BeforeEpoch"


def _check_no_worse_best(ranks, best_before):
    for rank in ranks:
        assert not [e for e in rank["trace"] if isinstance(e.effect, WriteBest)]
        assert rank["final"]["best"] == {"score": 0.8}


@pytest.mark.parametrize(("saved_by", "resumed_on"), [(2, 1), (1, 2)])
def test_resume_on_another_world_size_restarts_the_epoch(stopped, tmp_path, saved_by, resumed_on):
    """Weights, optimizer, progress and best carry over; the epoch restarts with a warning; strict refuses."""
    run_dir, saved = stopped[saved_by]
    run_dir = _copy(run_dir, tmp_path)
    best_before = _best_file(run_dir)
    assert best_before[0] == {"metric": "score", "value": 0.8, "step": 6}
    run_ranks("train", resumed_on, tmp_path, save_dir=str(run_dir), tag="resumed", hooks="scores",
              scores=WORSE, resume="auto", strict_first=True).check()
    ranks = results(tmp_path, "resumed", resumed_on)
    for rank in ranks:
        assert "written by" in rank["strict"] and "strict_resume=False" in rank["strict"]
        assert rank["strict_untouched"]  # a refused resume loads nothing into the model or optimizer
        assert [w for w in rank["warnings"] if w[0] == "ResumeNotExactWarning"], rank["warnings"]
        _check_restored(rank["restored"], saved[0]["final"])
        assert rank["final"]["position"] == "AfterTrain"
    _check_no_worse_best(ranks, best_before)
    assert _best_file(run_dir) == best_before


def test_resume_keeps_the_agreed_best_and_never_overwrites_it_with_worse(stopped, tmp_path):
    """A same-size resume restores rank 0's broadcast best on every rank; worse scores write no model_best."""
    run_dir = _copy(stopped[2][0], tmp_path)
    best_before = _best_file(run_dir)
    run_ranks("train", 2, tmp_path, save_dir=str(run_dir), tag="resumed", hooks="scores", scores=WORSE,
              resume="auto").check()
    ranks = results(tmp_path, "resumed", 2)
    for rank in ranks:
        assert rank["restored"]["best"] == {"score": 0.8}
        assert rank["restored"]["progress"].global_step == 8
        assert not [w for w in rank["warnings"] if w[0] == "ResumeNotExactWarning"]
    _check_no_worse_best(ranks, best_before)
    assert _best_file(run_dir) == best_before
