"""save_checkpoint -> load_checkpoint restores every kind of state bit-identically."""

import json
import random

import numpy as np
import pytest
import torch

from pimm_fn.checkpoint import CheckpointInfo, latest_checkpoint, load_checkpoint, save_checkpoint


def _trained_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        sched.step()
    trainer = {
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": 1,
        "best": None,
        "done": False,
    }
    local = {
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        "state": json.dumps({"hook": {"count": 3}}),
        "cursor": {"epoch": 0, "index": 17},
    }
    return model, opt, trainer, local


@pytest.mark.parametrize("fmt", ["standard", "legacy"])
def test_round_trip_is_bit_identical(tmp_path, same, fmt):
    """Weights, Adam state after real steps, scheduler, scaler, RNG states and JSON come back exactly."""
    model, _, trainer, local = _trained_state()
    info = save_checkpoint(tmp_path, step=7, weights=model.state_dict(), trainer=trainer, local=local, format=fmt)
    assert info == CheckpointInfo(tmp_path / ("last" if fmt == "standard" else "last.pth"), 7, fmt, 1)
    loaded = load_checkpoint(latest_checkpoint(tmp_path))
    same(dict(model.state_dict()), dict(loaded.weights))
    same(trainer, loaded.trainer)
    same(local, loaded.local)


def test_optimizer_state_loads_into_fresh_optimizer_without_template(tmp_path):
    """A fresh optimizer (no state yet) accepts the loaded state and steps identically."""
    model, opt, trainer, local = _trained_state()
    save_checkpoint(tmp_path, step=2, weights=model.state_dict(), trainer=trainer, local=local)
    loaded = load_checkpoint(latest_checkpoint(tmp_path))
    model2, _, _, _ = _trained_state()
    model2.load_state_dict(loaded.weights)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1.0)
    opt2.load_state_dict(loaded.trainer["optimizer"])
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_standard_layout_on_disk(tmp_path):
    """last/ holds model.pth, a DCP trainer/ dir, each rank's receipt and the COMPLETE marker; nothing is left in staging."""
    save_checkpoint(tmp_path, step=3, weights={"w": torch.ones(2)}, trainer={}, local={})
    last = tmp_path / "last"
    assert sorted(p.name for p in last.iterdir()) == ["COMPLETE", "model.pth", "receipts", "trainer"]
    marker = json.loads((last / "COMPLETE").read_text())
    assert {k: v for k, v in marker.items() if k != "files"} == {
        "step": 3,
        "format": "standard",
        "world_size": 1,
        "version": 1,
    }
    assert sorted(marker["files"]) == ["model.pth", "trainer/.metadata", "trainer/__0_0.distcp"]
    assert (last / "trainer" / ".metadata").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_save_replaces_last_and_keeps_one_copy(tmp_path):
    """A second save publishes the new step and removes the retired one."""
    for step in (1, 2):
        save_checkpoint(
            tmp_path, step=step, weights={"w": torch.full((1,), float(step))}, trainer={"s": step}, local={}
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]
    loaded = load_checkpoint(latest_checkpoint(tmp_path))
    assert loaded.info.step == 2 and loaded.trainer == {"s": 2} and loaded.weights["w"].item() == 2.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"step": -1}, ValueError, "'step' must be an int >= 0"),
        ({"format": "zip"}, ValueError, "'format' must be one of"),
        ({"keep_snapshots": -2}, ValueError, "'keep_snapshots'"),
        ({"trainer": [1]}, TypeError, "'trainer' must be a dict"),
        ({"weights": {"w": object()}}, TypeError, r"weights\['w'\] is a object"),
        ({"trainer": {"f": print}}, TypeError, "has type"),
    ],
)
def test_save_rejects_bad_arguments(tmp_path, kwargs, error, match):
    """Bad arguments fail before anything is published, naming the argument."""
    args = {"step": 1, "weights": {}, "trainer": {}, "local": {}, **kwargs}
    with pytest.raises(error, match=match):
        save_checkpoint(tmp_path, **args)
    assert latest_checkpoint(tmp_path) is None


def test_load_rejects_non_info():
    """load_checkpoint says how to obtain a CheckpointInfo when given a path."""
    with pytest.raises(TypeError, match="find_checkpoint"):
        load_checkpoint("runs/x/model/last")
