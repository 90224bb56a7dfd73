"""The README's first example runs as written: a plain (input, target) classifier trains to good accuracy."""

import pathlib
import re

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_readme_first_example_trains_a_plain_classifier_as_written(tmp_path, monkeypatch):
    """Its first python block, pasted as it is into a fresh folder: it trains, evaluates 'val/acc' each epoch (after
    a sanity check) and keeps the best model, above 0.9 accuracy on ten classes."""
    block = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    monkeypatch.chdir(tmp_path)  # its save_dir="runs/exp1" lands here
    torch.manual_seed(0)  # the example draws its data unseeded
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny MLP: one thread is fastest, and a busy machine's cores stay free
    try:
        namespace = {"__name__": "readme"}
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the project's own README
    finally:
        torch.set_num_threads(threads)
    final_state, run = namespace["final_state"], namespace["run"]
    assert final_state.finished and final_state.progress.global_step == 5 * 48
    assert final_state.best["val/acc"] > 0.9, final_state.best
    assert [r["step"] for r in run.history.records("eval")] == [48, 96, 144, 192, 240]
    assert (tmp_path / "runs/exp1/model/model_best.pth").is_file() and (tmp_path / "runs/exp1/model/last").is_dir()
