"""The example script: its pieces build and train, and (once the loop exists) it runs."""

import importlib.util
import pathlib

import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_pointcloud.py"
TINY = ["--num-train", "32", "--num-val", "8", "--points", "128", "--batch-size", "8", "--threads", "1"]


def _script():
    spec = importlib.util.spec_from_file_location("train_pointcloud", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_match_the_documented_command_line():
    """Defaults: runs/pointcloud, one process, no resume."""
    args = _script().parse_args([])
    assert (args.save_dir, args.nproc, args.resume) == ("runs/pointcloud", 1, False)
    assert _script().parse_args(["--resume"]).resume


def test_built_components_train_one_epoch_through_the_loop():
    """build() returns a model, optimizer, per-step scheduler, loader and evaluator that fit."""
    script = _script()
    args = script.parse_args(TINY + ["--epochs", "2"])
    model, opt, sched, loader, evaluate = script.build(args)
    assert len(loader) == 4 and sched.get_last_lr()[0] <= args.lr  # never above the peak
    import pimm_fn as pf

    state = pf.loop(model, opt, loader, max_epochs=1, scheduler=sched, watching=pf.Watching(console=False))()
    assert state.progress.global_step == 4 and sched.last_epoch == 4
    result = evaluate(model)
    assert set(result) == {"mIoU", "val_loss"} and 0.0 <= result["mIoU"] <= 1.0


def test_warmup_cosine_rises_to_the_peak_then_falls_to_zero():
    """The schedule factor warms up linearly, peaks at 1 and ends at 0."""
    factor = _script().warmup_cosine(100)
    assert factor(0) < factor(10) < factor(14) == 1.0 and factor(15) == 1.0
    assert 0.0 < factor(60) < 1.0 and factor(99) < 0.01 and factor(200) == 0.0


def test_script_runs_and_resumes_with_the_library_loop(tmp_path, capsys):
    """A finished run resumed with the same --epochs restores its progress and does no more steps."""
    script = _script()
    torch.manual_seed(0)
    save = ["--save-dir", str(tmp_path / "run")]
    first = script.train(script.parse_args(TINY + save + ["--epochs", "2"]))
    assert (first.progress.global_step, first.progress.completed_epochs) == (8, 2)
    assert "mIoU" in first.best and "done: 8 steps" in capsys.readouterr().out
    resumed = script.train(script.parse_args(TINY + save + ["--epochs", "2", "--resume"]))
    assert (resumed.progress.global_step, resumed.progress.completed_epochs) == (8, 2)


def _bits(tensors: dict) -> dict:
    """Each tensor as (dtype, shape, its bytes): equal only when bit-identical."""
    return {
        k: (v.dtype, tuple(v.shape), v.contiguous().reshape(-1).view(torch.uint8).tolist()) for k, v in tensors.items()
    }


def test_the_demos_best_model_round_trips_through_safetensors_bit_identical(tmp_path):
    """model_best.pth exported as safetensors (its step and mIoU recorded) loads into a fresh model bit-identical, and
    equals the .pth export tensor for tensor; a warm start from it trains on those weights."""
    import pimm_fn as pf
    from pointcloud import PointSegNet
    from safetensors import safe_open

    from pimm_fn.checkpoint import load_weights_file
    from pimm_fn.cli import main

    script = _script()
    torch.manual_seed(0)
    state = script.train(script.parse_args(TINY + ["--save-dir", str(tmp_path / "run"), "--epochs", "2"]))
    best = tmp_path / "run" / "model" / "model_best.pth"
    assert main(["export", str(best), str(tmp_path / "best.safetensors"), "--format", "safetensors"]) == 0
    assert main(["export", str(best), str(tmp_path / "best.pth")]) == 0
    saved = torch.load(best, weights_only=True)

    fresh = PointSegNet()
    fresh.load_state_dict(load_weights_file(tmp_path / "best.safetensors"), strict=True)
    assert _bits(fresh.state_dict()) == _bits(saved)
    with safe_open(str(tmp_path / "best.safetensors"), "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert _bits(torch.load(tmp_path / "best.pth", weights_only=True)) == _bits({k: tensors[k] for k in saved})
    assert metadata["pimm_fn.metric"] == "mIoU" and float(metadata["pimm_fn.value"]) == state.best["mIoU"]

    warm, _, _, loader, _ = script.build(script.parse_args(TINY))
    run = pf.loop(
        warm,
        torch.optim.SGD(warm.parameters(), lr=0.0),
        loader,
        max_epochs=1,
        hooks=[pf.load_weights(tmp_path / "best.safetensors", strict=True)],
        watching=pf.Watching(console=False),
    )
    run.step()  # the warm start, then one step that changes nothing (lr 0, no running statistics)
    assert all(torch.equal(v, saved[k]) for k, v in warm.state_dict().items())
