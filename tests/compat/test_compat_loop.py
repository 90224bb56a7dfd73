"""A pimm-style hook config, class-based hook included, driving a real pf.loop run."""

import json

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.compat import HookBase, build_hooks  # noqa: E402
from pimm_fn.core.effects import Evaluate, LoadWeights, Log, SaveCheckpoint  # noqa: E402
from pimm_fn.runtime.handlers import load_weights as load_weights_handler  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.head(torch.relu(self.encoder(x))) - y) ** 2).mean()}


def data():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def score(model):
    x, y = data().tensors
    with torch.no_grad():
        return {"mIoU": -float(model(( x, y))["loss"])}


class DoubleBatch(HookBase):
    """A pimm-style class hook: edits the config and logs at each epoch's end."""

    def modify_config(self, cfg):
        cfg["batch_size"] = cfg.get("batch_size", 1) * 2  # plan() starts from an empty config

    def after_epoch(self):
        return (Log(self.trainer.global_step, "epoch_done", {"epoch": self.trainer.epoch}),)

    def __repr__(self):
        return "DoubleBatch()"


CONFIG = [
    dict(type="CheckpointLoader", keywords="backbone.", replacement="encoder."),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter", log_interval=2),
    dict(type="SemSegEvaluator"),
    dict(type="CheckpointSaver", save_freq=2),
]


def _loop(save_dir, weight, *, max_epochs, resume=None, handlers=None):
    torch.manual_seed(0)
    model = Net()
    hooks = build_hooks([*CONFIG, DoubleBatch()], weight=str(weight), evaluate=score)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data(), batch_size=5, shuffle=True)
    run = pf.loop(model, optimizer, loader, hooks=hooks, max_epochs=max_epochs, save_dir=save_dir,
                  resume=resume, config={"batch_size": 5}, console=False, handlers=handlers)
    return model, hooks, run


def test_pimm_config_trains_saves_per_epoch_and_resumes(tmp_path):
    """Weights load with the key rewrite, saves land at epoch ends with snapshots every 2, and a resume continues."""
    torch.manual_seed(1)
    pretrained = Net()
    weight = tmp_path / "pretrained.pth"
    torch.save({f"backbone.{k[len('encoder.'):]}" if k.startswith("encoder.") else k: v
                for k, v in pretrained.state_dict().items()}, weight)
    save_dir = tmp_path / "run"

    loaded = {}

    def load_and_record(effect, state, ctx):
        followups = load_weights_handler(effect, state, ctx)
        loaded.update({k: v.clone() for k, v in ctx.model.state_dict().items()})
        return followups

    _, hooks, run = _loop(save_dir, weight, max_epochs=3, handlers={LoadWeights: load_and_record})
    final = run()
    assert loaded and all(torch.equal(loaded[k], v) for k, v in pretrained.state_dict().items())

    assert final.progress.global_step == 12 and final.config == {"batch_size": 10}
    saves = [e.effect for e in run.trace if isinstance(e.effect, SaveCheckpoint)]
    assert saves == [SaveCheckpoint(4, deferred=True), SaveCheckpoint(8, snapshot=True, deferred=True), SaveCheckpoint(12, deferred=True)]
    assert [e.effect.step for e in run.trace if isinstance(e.effect, Evaluate)] == [4, 8, 12]
    assert run.trace[0].effect == LoadWeights(str(weight), (("backbone.", "encoder."),))
    model_dir = save_dir / "model"
    assert (model_dir / "last").is_dir() and (model_dir / "iter_8").is_dir() and not (model_dir / "iter_4").exists()
    kinds = [json.loads(line)["kind"] for line in (save_dir / "log.jsonl").read_text().splitlines()]
    assert kinds[:5] == ["train", "train", "epoch", "eval/score", "epoch_done"]

    metrics = {e.event.step: dict(e.event.values) for e in run.trace if isinstance(e.event, pf.events.MetricsPublished)}
    planned = pf.plan(hooks, iters_per_epoch=4, max_epochs=3, metrics=metrics)
    def shown(entries):  # a dry run has no losses: compare log records by kind
        return [(e.step, e.hook, e.effect.kind if isinstance(e.effect, Log) else e.effect) for e in entries]

    assert shown(run.trace) == shown(planned)

    _, _, resumed = _loop(save_dir, weight, max_epochs=4, resume="auto")
    assert resumed.state.progress.global_step == 12
    resumed()
    after_resume = [e.effect for e in resumed.trace if isinstance(e.effect, (SaveCheckpoint, LoadWeights))]
    assert after_resume == [SaveCheckpoint(16, snapshot=True, deferred=True)]  # no warm start again, cadence continues
