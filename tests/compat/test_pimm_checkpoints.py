"""pimm's checkpoint layouts in pimm_fn: written by a small writer after PIMM.md 3.2-3.4 (real torch.save, real
DCP), then resumed bit-identically, warm-started from, discovered in pimm's order, or refused with the reason."""

import os
import shutil

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn import checkpoint  # noqa: E402
from pimm_fn.compat import HANDLERS, PIMM_BEST, build_hooks  # noqa: E402
from pimm_fn.compat.checkpoints import translate  # noqa: E402
from pimm_fn.compat.reading import PimmCheckpointError, latest_pimm_checkpoint, read_pimm_checkpoint  # noqa: E402
from pimm_fn.core.effects import SaveCheckpoint  # noqa: E402

from _pimm_layouts import pimm_saver, write_split  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the writer's single-process DCP


class Net(torch.nn.Module):
    def __init__(self, dropout=0.2):
        super().__init__()
        self.encoder = torch.nn.Linear(3, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 1)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.head(self.drop(self.norm(self.encoder(x)))) - y) ** 2).mean()}


def data():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


CONFIG = [dict(type="CheckpointSaver", save_freq=5), dict(type="InformationWriter", log_frequency=5)]


def build(save_dir, *, layout=None, resume=None, random=True, epochs=3, config=CONFIG):
    """A 3-epoch run of 5 steps each (Adam, OneCycleLR over the 15 steps); ``layout``: save in pimm's layout."""
    torch.manual_seed(0)
    model = Net(0.2 if random else 0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=15)
    handlers = {**HANDLERS, **({SaveCheckpoint: pimm_saver(layout, best=0.25)} if layout else {})}
    loader = DataLoader(data(), batch_size=4, shuffle=random)
    run = pf.loop(
        model,
        optimizer,
        loader,
        hooks=build_hooks(config),
        max_epochs=epochs,
        save_dir=save_dir,
        scheduler=scheduler,
        resume=resume,
        handlers=handlers,
        watching=pf.Watching(console=False),
    )
    return model, run


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize(
    "layout, name, random",
    [
        ("split", "last", True),
        ("file", "model_last.pth", True),
        ("pointcept", "model_last.pth", False),
    ],
)
def test_a_run_resumed_from_pimms_layout_ends_bit_identical_to_continuing_in_pimm_fn(tmp_path, layout, name, random):
    """A pimm checkpoint of the epoch boundary at step 10 (model, Adam moments, OneCycleLR, RNG; Pointcept files
    without RNG) resumes to the same weights as the run that went on."""
    model, run = build(tmp_path / "a", layout=layout, random=random)
    run.run(steps=10)
    shutil.copytree(tmp_path / "a" / "model", tmp_path / "pimm")  # the checkpoint of step 10, as pimm left it
    run.run()
    resumed_model, resumed = build(tmp_path / "b", resume=tmp_path / "pimm" / name, random=random)
    p = resumed.state.progress
    assert (p.epoch, p.iter_in_epoch, p.global_step, p.max_epochs, resumed.state.position) == (
        1,
        5,
        10,
        3,
        "AfterEpoch",
    )
    if layout != "pointcept":
        assert resumed.state.best == {PIMM_BEST: 0.25}
    resumed.run()
    assert resumed.state.progress.global_step == 15 and same(model, resumed_model)


def test_resume_auto_finds_pimms_layout_and_the_first_save_replaces_the_import(tmp_path):
    """resume='auto' over a pimm save_path resumes its newest checkpoint; the translation under model/ goes at the
    next save, after which pimm_fn's own checkpoint is the one discovered."""
    _, run = build(tmp_path, layout="split")
    run.run(steps=10)
    _, resumed = build(tmp_path, resume="auto")
    assert resumed.state.progress.global_step == 10 and (tmp_path / "model" / ".staging-pimm-import").is_dir()
    resumed.run()
    assert not (tmp_path / "model" / ".staging-pimm-import").exists()
    assert checkpoint.find_checkpoint(tmp_path).step == 15


def test_a_mid_epoch_pimm_checkpoint_replays_its_epoch_as_pimm_does_without_a_cursor(tmp_path):
    """pimm's cursor is a pickle pimm_fn never loads: the epoch restarts, global_step rewound, with a warning."""
    _, run = build(tmp_path / "a", layout="split", config=[dict(type="CheckpointSaver", save_freq=4)])
    run.run(steps=9)  # the save of step 8, 3 steps into epoch 1, is the last
    with pytest.warns(pf.ResumeNotExactWarning, match=r"mid-epoch \(epoch 1, step 3 of 5\).*\(global_step 8 -> 5\)"):
        info = translate(tmp_path / "a" / "model" / "last", tmp_path / "out")
    assert info.step == 5


def test_discovery_follows_pimms_order_newest_complete_first(tmp_path):
    """last, last.prev, model_last.pth by modification time (earlier candidate on a tie); incomplete dirs,
    last.tmp, iter_* and model_best are never candidates (PIMM.md 3.9)."""
    model_dir = tmp_path / "model"
    for name in ("last", "last.prev", "last.tmp"):
        (model_dir / name).mkdir(parents=True)
    (model_dir / "last" / ".complete").write_text("ok\n")
    for name in ("model_last.pth", "iter_5.pth", "model_best.pth"):
        (model_dir / name).write_bytes(b"")
    os.utime(model_dir / "last", (100, 100))
    os.utime(model_dir / "model_last.pth", (200, 200))
    assert latest_pimm_checkpoint(model_dir) == model_dir / "model_last.pth"
    os.utime(model_dir / "model_last.pth", (100, 100))
    assert latest_pimm_checkpoint(model_dir) == model_dir / "last"
    (model_dir / "last" / ".complete").unlink()
    (model_dir / "model_last.pth").unlink()
    assert latest_pimm_checkpoint(model_dir) is None


def test_what_cannot_be_translated_is_refused_with_the_reason(tmp_path):
    """A weights-only file, an incomplete directory, a fresh start over pimm checkpoints: each a clear error."""
    torch.save({"state_dict": Net().state_dict()}, tmp_path / "iter_5.pth")
    with pytest.raises(PimmCheckpointError, match=r"holds model weights only .* Warm-start a fresh run from it"):
        build(tmp_path / "run", resume=tmp_path / "iter_5.pth")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "weights.pth").write_bytes(b"")
    with pytest.raises(PimmCheckpointError, match=r"^Incomplete checkpoint directory: "):
        read_pimm_checkpoint(tmp_path / "broken")
    (tmp_path / "old" / "model").mkdir(parents=True)
    torch.save({"epoch": 1, "state_dict": Net().state_dict()}, tmp_path / "old" / "model" / "model_last.pth")
    with pytest.raises(FileExistsError, match=r"already holds pimm checkpoints \(model_last.pth\)"):
        build(tmp_path / "old")


def test_pickled_objects_in_a_pimm_file_are_never_loaded(tmp_path):
    """Loading admits tensors, plain values and numpy arrays only: a pickled object is refused, not run."""
    torch.save({"epoch": 1, "state_dict": Net().state_dict(), "extra": torch.nn.Linear(1, 1)}, tmp_path / "x.pth")
    with pytest.raises(PimmCheckpointError, match=r"does not load with torch.load\(weights_only=True\)"):
        read_pimm_checkpoint(tmp_path / "x.pth")


def test_checkpoint_loader_warm_starts_from_a_pimm_split_checkpoint_with_pimms_rules(tmp_path):
    """CheckpointLoader with weight=<pimm save_path>: keys renamed on whole components (module. ignored), a key of
    another shape skipped and kept at init, the rest loaded; a rule set matching nothing is refused."""
    source = Net()
    weights = {
        f"module.backbone.{k[len('encoder.') :]}" if k.startswith("encoder.") else f"module.{k}": v
        for k, v in source.state_dict().items()
    }
    weights["module.head.bias"] = torch.zeros(3)  # another shape: skipped
    model_dir = tmp_path / "pimm" / "model"
    model_dir.mkdir(parents=True)
    torch.save({"state_dict": weights}, tmp_path / "w.pth")
    (model_dir / "last").mkdir()
    shutil.copy(tmp_path / "w.pth", model_dir / "last" / "weights.pth")
    hooks = build_hooks(
        [dict(type="CheckpointLoader", keywords="backbone", replacement="encoder")], weight=str(tmp_path / "pimm")
    )
    torch.manual_seed(1)
    model = Net()
    init_bias = model.head.bias.clone()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        DataLoader(data(), batch_size=10),
        hooks=hooks,
        max_epochs=1,
        handlers=HANDLERS,
        watching=pf.Watching(console=False),
    )
    run.step()
    assert torch.equal(model.encoder.weight, source.encoder.weight) and torch.equal(model.norm.bias, source.norm.bias)
    assert torch.equal(model.head.bias, init_bias)
    nothing = build_hooks(
        [dict(type="CheckpointLoader", keywords="backbone", replacement="trunk")], weight=str(tmp_path / "w.pth")
    )
    other = Net()
    other.encoder, other.norm, other.head = torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2)
    run = pf.loop(
        other,
        torch.optim.SGD(other.parameters(), lr=0.0),
        DataLoader(data(), batch_size=10),
        hooks=nothing,
        max_epochs=1,
        handlers=HANDLERS,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(RuntimeError, match=r"^Checkpoint load matched 0 of 4 model parameters"):
        run.step()


def test_an_exported_models_model_safetensors_is_read_by_pimm_fns_one_checked_reader(tmp_path):
    """CheckpointLoader's weight=<export dir> reads model.safetensors (keys without module.); one cut short is a
    CheckpointError naming it, as for any warm start, not an error from inside another library."""
    from safetensors.torch import save_file

    from pimm_fn.compat.warm_start import load_pimm_weights

    source = Net().state_dict()
    save_file({f"module.{k}": v for k, v in source.items()}, str(tmp_path / "model.safetensors"))
    read = load_pimm_weights(tmp_path)
    assert set(read) == set(source) and all(torch.equal(read[k], source[k]) for k in source)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[:-4])
    with pytest.raises(pf.CheckpointError, match=r"model.safetensors gives tensor '.*' the bytes .*: cut short"):
        load_pimm_weights(tmp_path)


def test_a_split_checkpoint_reads_back_the_payload_pimm_wrote(tmp_path):
    """Weights without module., the trainer counters, and the FQN-keyed optimizer state come back as written."""
    model = Net()
    optimizer = torch.optim.Adam(model.parameters())
    model(next(iter(DataLoader(data(), batch_size=4))))["loss"].backward()
    optimizer.step()
    payload = {
        "model": {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}},
        "optimizer": {
            "state_dict": {
                "state": {"encoder.weight": {"step": torch.tensor(1.0)}},
                "param_groups": [{"lr": 0.1, "params": ["encoder.weight"]}],
            }
        },
        "trainer": {"epoch": 2, "iter_in_epoch": 0, "global_step": 10, "samples_seen": 40},
    }
    write_split(tmp_path, payload)
    read = read_pimm_checkpoint(tmp_path / "last")
    assert list(read.weights) == list(model.state_dict())
    assert read.payload["trainer"] == {"epoch": 2, "iter_in_epoch": 0, "global_step": 10, "samples_seen": 40}
    assert read.payload["optimizer"]["state_dict"]["param_groups"] == [{"lr": 0.1, "params": ["encoder.weight"]}]
