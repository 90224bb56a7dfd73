"""The example script: its pieces build and train, and (once the loop exists) it runs."""

import importlib.util
import pathlib

import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_pointcloud.py"
TINY = ["--num-train", "32", "--num-val", "8", "--points", "128", "--batch-size", "8",
        "--threads", "1"]


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
