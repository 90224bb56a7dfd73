"""pimm's legacy one-file model_last.pth ({"epoch", "iter", "state_dict", "optimizer", "scheduler": None}) records no
steps per epoch: loop() resumes it with this run's, as pimm takes len(train_loader) (PIMM.md 3.8, 3.11), saying so."""

import shutil

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.compat import HANDLERS, build_hooks  # noqa: E402
from pimm_fn.compat.checkpoints import translate  # noqa: E402
from pimm_fn.compat.reading import PimmCheckpointError  # noqa: E402
from pimm_fn.core.effects import SaveCheckpoint  # noqa: E402

from _pimm_layouts import pimm_saver  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.head(torch.relu(self.encoder(x))) - y) ** 2).mean()}


def _loader():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)  # 5 steps per epoch, in order


def _build(save_dir, *, pimm=False, resume=None, config=(dict(type="CheckpointSaver", save_freq=5),)):
    """3 epochs of 5 steps, Adam, no scheduler (the file's "scheduler" is None); ``pimm``: save pimm's legacy file."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    handlers = {**HANDLERS, **({SaveCheckpoint: pimm_saver("pointcept")} if pimm else {})}
    run = pf.loop(
        model,
        optimizer,
        _loader(),
        hooks=build_hooks(list(config)),
        max_epochs=3,
        save_dir=save_dir,
        resume=resume,
        handlers=handlers,
        watching=pf.Watching(console=True),
    )
    return model, run


def _copy(tree):
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    return tree.clone() if isinstance(tree, torch.Tensor) else tree


def test_a_legacy_model_last_resumes_with_this_runs_steps_per_epoch_and_says_so(tmp_path, capsys):
    """Saved by pimm at step 10 (epoch=2, iter=0, no scheduler): resumed at epoch 2, global_step 10 = 2 * len(loader),
    with the step-10 weights and Adam moments, then trained to the end bit-identical to the run that went on."""
    model, run = _build(tmp_path / "a", pimm=True)
    run.run(steps=10)
    saved = tmp_path / "pimm" / "model_last.pth"
    shutil.copytree(tmp_path / "a" / "model", saved.parent)
    assert torch.load(saved, weights_only=True)["scheduler"] is None
    at_10 = {k: v.clone() for k, v in model.state_dict().items()}
    moments = _copy(run.ctx.optimizer.state_dict()["state"])
    run.run()
    capsys.readouterr()
    resumed_model, resumed = _build(tmp_path / "b", resume=saved)
    said = capsys.readouterr().out
    assert (
        f"{saved} is pimm's legacy checkpoint (epoch=2, iter=0), which does not record its steps per epoch: "
        f"taking this run's steps per epoch, 5, as pimm takes its loader's length; resuming at epoch 2, "
        f"global_step 10"
    ) in said
    assert said.count("legacy checkpoint") == 1
    p = resumed.state.progress
    assert (p.epoch, p.iter_in_epoch, p.iters_per_epoch, p.global_step, p.max_epochs) == (1, 5, 5, 10, 3)
    assert all(torch.equal(resumed_model.state_dict()[k], v) for k, v in at_10.items())
    state = resumed.ctx.optimizer.state_dict()["state"]
    assert sorted(state) == sorted(moments)
    assert all(torch.equal(state[i][key], value) for i in moments for key, value in moments[i].items())
    resumed.run()
    assert resumed.state.progress.global_step == 15
    assert all(torch.equal(a, b) for a, b in zip(resumed_model.state_dict().values(), model.state_dict().values()))


def test_a_mid_epoch_legacy_file_restarts_the_epoch_before_as_pimm_does(tmp_path):
    """epoch=1, iter=3 with 5 steps per epoch: 0 < iter < len(loader), so pimm resumes at epoch 0, global_step 0."""
    _, run = _build(tmp_path / "a", pimm=True, config=(dict(type="CheckpointSaver", save_freq=4),))
    run.run(steps=9)  # the save of step 8: epoch 1, iter 3
    with pytest.warns(pf.ResumeNotExactWarning, match=r"legacy checkpoint is mid-epoch \(epoch=1, iter=3\)"):
        _, resumed = _build(tmp_path / "b", resume=tmp_path / "a" / "model" / "model_last.pth")
    p = resumed.state.progress
    assert (p.global_step, p.iters_per_epoch, resumed.state.position) == (0, 5, "BeforeTrain")


def test_translate_without_the_runs_length_still_asks_for_it(tmp_path):
    """translate() alone has no loader: a legacy file without a scheduler count is refused with the fix."""
    _, run = _build(tmp_path / "a", pimm=True)
    run.run(steps=5)
    with pytest.raises(PimmCheckpointError, match=r"iters_per_epoch=len\(train_loader\)"):
        translate(tmp_path / "a" / "model" / "model_last.pth", tmp_path / "out")
