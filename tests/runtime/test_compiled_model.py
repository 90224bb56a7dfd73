"""A torch.compile'd model trains, saves unwrapped weights, and resumes into a compiled or a plain model.

``backend="aot_eager"`` goes through dynamo and AOT autograd (the
``OptimizedModule`` wrapper, graph capture, the compiled backward) without
a C++ compiler, so the test runs anywhere in seconds; inductor wraps the
model the same way.
"""

import shutil

import torch

import pimm_fn as pf
from pimm_fn import checkpoint
from _tiny_workload import TinyNet, loader, negative_mse, same_weights, weights

HOOKS = [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.best_on("score")]


def _run(save_dir, model, **kwargs):
    return pf.loop(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        loader("stateful"),
        hooks=HOOKS,
        max_epochs=2,
        save_dir=save_dir,
        watching=pf.Watching(console=False, progress=False),
        **kwargs,
    )


def _compiled(seed=0):
    torch.manual_seed(seed)
    return torch.compile(TinyNet(), backend="aot_eager")


def _plain(seed=0):
    torch.manual_seed(seed)
    return TinyNet()


def test_a_compiled_run_saves_plain_keys_and_resumes_into_a_compiled_or_a_plain_model(tmp_path):
    """Weights are saved with the plain module's keys (no '_orig_mod.'), model_best.pth included. Stopped after
    step 6 (its checkpoint): resumed compiled, the run ends as the uninterrupted compiled run does; resumed into a
    plain model, it starts from exactly the saved weights and ends with the same weights too."""
    whole = _compiled()
    _run(tmp_path / "whole", whole)()
    plain_keys = set(TinyNet().state_dict())
    for path in (tmp_path / "whole" / "model" / "last" / "model.pth", tmp_path / "whole" / "model" / "model_best.pth"):
        assert set(checkpoint.load_weights_file(path)) == plain_keys, path
    TinyNet().load_state_dict(checkpoint.load_weights_file(tmp_path / "whole" / "model" / "model_best.pth"))

    first = _compiled()
    stopped = _run(tmp_path / "run", first)
    stopped.run(steps=6)
    at_six = weights(first._orig_mod)
    stopped.ctx.close()
    shutil.copytree(tmp_path / "run", tmp_path / "plain")

    again = _compiled(seed=1)  # other initial weights: everything must come from the checkpoint
    resumed = _run(tmp_path / "run", again, resume="auto")
    assert resumed.state.progress.global_step == 6 and same_weights(weights(again._orig_mod), at_six)
    resumed()
    assert same_weights(weights(again._orig_mod), weights(whole._orig_mod))

    plain = _plain(seed=1)
    into_plain = _run(tmp_path / "plain", plain, resume="auto")
    assert into_plain.state.progress.global_step == 6 and same_weights(weights(plain), at_six)
    into_plain()
    assert same_weights(weights(plain), weights(whole._orig_mod))
    assert into_plain.state.best == resumed.state.best
