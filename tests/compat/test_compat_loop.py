"""A pimm-style hook list driving a real pf.loop run: the catalogue's handlers do pimm's work on the model and
optimizer, class-based hooks go straight into pf.loop, and the records land in log.jsonl."""

import gc
import json
import math

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.compat import HANDLERS, HookBase, build_hooks, split_weight_decay  # noqa: E402
from pimm_fn.core.effects import Log  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0

    def get_anneal_factor(self):
        return 1.0 / (1 + self.step)


class Net(torch.nn.Module):
    """A model with pimm's annealing interface (update_anneal_step, decoder.blocks) and pimm-style hook methods."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(3, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 1)
        self.decoder = torch.nn.Module()
        self.decoder.blocks = torch.nn.ModuleList([Block(), Block()])
        self.anneal_steps, self.epochs_seen = [], []

    def update_anneal_step(self, step):
        self.anneal_steps.append(step)
        for block in self.decoder.blocks:
            block.step = step

    def after_epoch(self):  # pimm's ModelHook forwards the trainer's events to the model
        self.epochs_seen.append(self.trainer.epoch)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.head(self.norm(self.encoder(x))) - y) ** 2).mean()}


def data():
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def score(model):
    x, y = data().tensors
    return {"mIoU": -float(model((x, y))["loss"])}


class EpochNote(HookBase):
    """A class-based hook handed to pf.loop directly."""

    def after_epoch(self):
        return (Log(self.trainer.global_step, "note", {"epoch": self.trainer.epoch}),)

    def __repr__(self):
        return "EpochNote()"


CONFIG = [
    dict(type="WandbNamer", keys=("model", "seed")),
    dict(type="WeightDecayExclusion"),
    dict(type="ParameterCounter", min_params=5),
    dict(type="DtypeOverrider", class_patterns=["LayerNorm"], dtype="float64", override_parameters=True),
    dict(type="ModelHook"),
    dict(type="WeightDecayScheduler", base_value=0.04, final_value=0.2),
    dict(type="AttentionMaskAnnealingHook", log_frequency=3),
    dict(type="IterationTimer", warmup_iter=0),
    dict(type="InformationWriter", log_frequency=2),
    dict(type="GradientNormLogger", log_frequency=3),
    dict(type="SemSegEvaluator"),
    dict(type="CheckpointSaver", save_freq=3),
    dict(type="GarbageHandler", interval=2, disable_auto=False),
    dict(type="FinalEvaluator"),
]


def test_a_pimm_config_runs_with_the_catalogue_handlers(tmp_path):
    """Weight decay split before the loop and scheduled per step, LayerNorm run in float64, annealing told every
    global step, the model's own hook methods called, gradient norms, parameter counts, timing, best-model tests."""
    torch.manual_seed(0)
    model = Net()
    optimizer = split_weight_decay(model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.5))
    tested = []

    def tester(m):
        tested.append(m is not model)
        return {"allAcc": 1.0}

    hooks = build_hooks(CONFIG, evaluate=score, tester=tester)
    run = pf.loop(
        model,
        optimizer,
        DataLoader(data(), batch_size=4),
        hooks=[*hooks, EpochNote()],
        max_epochs=2,
        save_dir=tmp_path,
        handlers=HANDLERS,
        watching=pf.Watching(console=False),
        training=pf.Training(config={"model": "Net", "seed": 1500}),
    )
    state = run()
    assert gc.isenabled()
    assert state.config["wandb_run_name"] == "Net-1.5K"
    assert [g["apply_wd"] for g in optimizer.param_groups] == [True, False]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [
        pytest.approx(0.2 - 0.08 * (1 + math.cos(math.pi * 5 / 6))),
        0.0,
    ]
    assert (
        getattr(model.norm.forward, "pimm_fn_dtype", None) is torch.float64 and model.norm.weight.dtype == torch.float64
    )
    assert model.anneal_steps == [0, 1, 2, 3, 4, 5, 6] and model.epochs_seen == [0, 1]
    assert tested == [True] and (tmp_path / "model" / "model_best.pth").is_file()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    kinds = {}
    for r in records:
        kinds.setdefault(r["kind"], []).append(r["step"])
    assert kinds["grad_norm"] == [3, 6] and kinds["anneal"] == [3, 6] and kinds["train"] == [2, 3, 4, 6]
    assert kinds["timing"] == [3, 6] and kinds["note"] == [3, 6] and kinds["eval/FinalEvaluator"] == [6]
    assert [r["module"] for r in records if r["kind"] == "parameters/module"] == ["encoder", "norm", "head"]
    assert records[0]["kind"] == "parameters" and records[0]["total"] == 3 * 4 + 4 + 8 + 4 + 1


def test_weight_decay_exclusion_refuses_an_optimizer_that_was_not_split():
    """The split must precede the scheduler and the optimizer's load: the hook refuses to train without it."""
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    run = pf.loop(
        model,
        optimizer,
        DataLoader(data(), batch_size=4),
        hooks=build_hooks([CONFIG[1]]),
        max_epochs=1,
        handlers=HANDLERS,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(ValueError, match=r"param group 0 is not split .*split_weight_decay\(model, optimizer"):
        run.step()


def test_pf_loop_takes_a_class_based_hook_directly():
    """A HookBase object in loop(hooks=...) is adapted; its methods see the trainer view and return effects."""
    model = Net()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(data(), batch_size=6),
        hooks=[EpochNote()],
        max_epochs=2,
        watching=pf.Watching(console=False),
    )
    run()
    assert [(e.step, e.effect.values["epoch"]) for e in run.trace] == [(2, 0), (4, 1)]
