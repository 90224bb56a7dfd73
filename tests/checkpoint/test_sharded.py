"""A sharded (FSDP2) model in one process: shards through DCP, the weights file, and what the loop refuses."""

import sys
import pathlib
import warnings

import pytest
import torch
from torch.distributed.fsdp import fully_shard

import pimm_fn as pf
from pimm_fn.checkpoint import load_weights_file
from pimm_fn.checkpoint.formats import sharded

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
from _process_group import one_rank_group  # noqa: E402, F401 - a fixture


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.body(x) - y) ** 2).mean()}


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _sharded_net():
    torch.manual_seed(0)
    net = Net()
    fully_shard(net.body[0])
    fully_shard(net)
    return net


def score(model):
    x = torch.ones(2, 4)
    with torch.no_grad():
        return {"score": -float(model((x, x.sum(1, keepdim=True)))["loss"])}


def _full(model) -> dict:
    return {k: v.clone() for k, v in sharded.full_weights(model).items()}


def test_is_sharded_tells_an_fsdp2_model_from_a_plain_one(one_rank_group):
    assert sharded.is_sharded(_sharded_net()) and not sharded.is_sharded(Net())


def test_a_save_before_the_first_step_leaves_a_fresh_optimizer_fresh(one_rank_group, tmp_path):
    """Taking a fresh optimizer's state would create it with a step; Adam would count it. Nothing is created."""
    net = _sharded_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    shards, rest = sharded.state(net, optimizer)
    assert not optimizer.state and rest == {"state": {}, "param_groups": None}
    assert sorted(shards) == [
        sharded.MODEL + k for k in ("body.0.bias", "body.0.weight", "body.2.bias", "body.2.weight")
    ]


def test_sharded_checkpoint_without_a_weights_file_resumes_exactly_and_its_weights_assemble(one_rank_group, tmp_path):
    """weights_file=False: no model.pth, a note in its place; resume reads the shards; load_weights_file gathers them."""
    hooks = [pf.save_every(4)]
    reference_net = _sharded_net()
    reference = pf.loop(
        reference_net,
        torch.optim.Adam(reference_net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=3,
        save_dir=tmp_path / "ref",
        saving=pf.Saving(weights_file=False),
        watching=pf.Watching(console=False),
    )
    reference()
    net = _sharded_net()
    run = pf.loop(
        net,
        torch.optim.Adam(net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=3,
        save_dir=tmp_path / "run",
        saving=pf.Saving(weights_file=False),
        watching=pf.Watching(console=False),
    )
    run.run(steps=6)  # saved at 4
    last = tmp_path / "run" / "model" / "last"
    assert not (last / "model.pth").exists() and "weights_file=False" in (last / "model.pth.skipped").read_text()
    net = _sharded_net()
    resumed = pf.loop(
        net,
        torch.optim.Adam(net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=3,
        save_dir=tmp_path / "run",
        resume="auto",
        saving=pf.Saving(weights_file=False),
        watching=pf.Watching(console=False),
    )
    assert resumed.state.progress.global_step == 4
    resumed()
    final = _full(net)
    assert all(torch.equal(final[k], v) for k, v in _full(reference_net).items())
    assert all(torch.equal(final[k], v) for k, v in load_weights_file(tmp_path / "run").items())


def test_sharded_weights_read_from_shards_whose_bytes_changed_are_refused(one_rank_group, tmp_path):
    """weights_file=False with digests: the weights come from trainer/'s data files, so their digests are checked."""
    net = _sharded_net()
    pf.loop(
        net,
        torch.optim.SGD(net.parameters(), lr=0.01),
        _data(),
        hooks=[pf.save_every(4)],
        max_epochs=1,
        save_dir=tmp_path,
        saving=pf.Saving(weights_file=False, digests=True),
        watching=pf.Watching(console=False),
    )()
    last = tmp_path / "model" / "last"
    assert set(load_weights_file(last)) == set(_full(net))
    data = next(p for p in (last / "trainer").iterdir() if p.suffix == ".distcp")
    content = bytearray(data.read_bytes())
    content[-8:] = bytes(b ^ 0xFF for b in content[-8:])
    data.write_bytes(bytes(content))
    with pytest.raises(pf.checkpoint.CheckpointError, match=f"trainer/{data.name} does not match the SHA-256"):
        load_weights_file(last)


def test_sharded_best_model_is_the_gathered_full_state_dict(one_rank_group, tmp_path):
    net = _sharded_net()
    run = pf.loop(
        net,
        torch.optim.SGD(net.parameters(), lr=0.01),
        _data(),
        max_epochs=1,
        save_dir=tmp_path,
        hooks=[pf.evaluate_every(2, score), pf.best_on("score")],
        watching=pf.Watching(console=False),
    )
    run()
    best = torch.load(tmp_path / "model" / "model_best.pth", weights_only=True)
    assert {k: type(v) for k, v in best.items()} == dict.fromkeys(best, torch.Tensor)
    assert best["body.0.weight"].shape == (8, 4)


def test_a_sharded_model_wrapped_in_ddp_as_well_is_refused_with_the_fix(one_rank_group):
    net = _sharded_net()
    with pytest.raises(ValueError, match="drop ddp=True"):
        pf.loop(net, torch.optim.SGD(net.parameters(), lr=0.1), _data(), max_epochs=1, parallel=pf.Parallel(ddp=True))


def test_a_sharded_model_in_the_legacy_format_is_refused_with_the_fix(one_rank_group, tmp_path):
    net = _sharded_net()
    with pytest.raises(ValueError, match="checkpoint_format='standard'"):
        pf.loop(
            net,
            torch.optim.SGD(net.parameters(), lr=0.1),
            _data(),
            max_epochs=1,
            save_dir=tmp_path,
            hooks=[pf.save_every(2)],
            saving=pf.Saving(checkpoint_format="legacy"),
        )


def test_best_on_a_rank_local_metric_of_a_sharded_model_says_to_broadcast(one_rank_group, tmp_path):
    """A sharded best write gathers on every rank, so every rank must decide alike: broadcast=False is refused."""
    net = _sharded_net()
    run = pf.loop(
        net,
        torch.optim.SGD(net.parameters(), lr=0.1),
        _data(),
        max_epochs=1,
        save_dir=tmp_path,
        hooks=[pf.evaluate_every(2, score, broadcast=False), pf.best_on("score")],
        watching=pf.Watching(console=False),
    )
    with pytest.raises(ValueError, match="broadcast=True"):
        run()


def test_a_sharded_model_refuses_a_replicated_checkpoint_before_touching_anything(one_rank_group, tmp_path):
    torch.manual_seed(0)
    plain = Net()
    pf.loop(
        plain,
        torch.optim.SGD(plain.parameters(), lr=0.1),
        _data(),
        max_epochs=1,
        save_dir=tmp_path,
        hooks=[pf.save_every(2)],
        watching=pf.Watching(console=False),
    ).run(steps=2)
    net = _sharded_net()
    before = _full(net)
    with pytest.raises(pf.ResumeError, match="replicated"):
        pf.loop(
            net,
            torch.optim.SGD(net.parameters(), lr=0.1),
            _data(),
            max_epochs=1,
            save_dir=tmp_path,
            hooks=[pf.save_every(2)],
            resume="auto",
            watching=pf.Watching(console=False),
        )
    assert all(torch.equal(v, before[k]) for k, v in _full(net).items())


def test_a_sharded_checkpoint_resumes_into_an_unsharded_model(one_rank_group, tmp_path):
    """DCP assembles full tensors from the shards: the plain model gets the sharded run's exact weights."""
    net = _sharded_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    pf.loop(
        net,
        optimizer,
        _data(),
        max_epochs=1,
        save_dir=tmp_path,
        hooks=[pf.save_every(2)],
        watching=pf.Watching(console=False),
    ).run(steps=2)
    saved = _full(net)
    torch.manual_seed(1)
    plain = Net()
    plain_optimizer = torch.optim.Adam(plain.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pf.loop(
            plain,
            plain_optimizer,
            _data(),
            max_epochs=1,
            save_dir=tmp_path,
            hooks=[pf.save_every(2)],
            resume="auto",
            watching=pf.Watching(console=False),
        )
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in saved.items())
    assert plain_optimizer.state_dict()["state"][0]["exp_avg"].shape == (8, 4)


def test_a_background_save_of_a_sharded_model_resumes_exactly(one_rank_group, tmp_path):
    """async_save=True: the shards are copied before the next optimizer step changes them."""
    hooks = [pf.save_every(3, async_save=True)]
    reference_net = _sharded_net()
    pf.loop(
        reference_net,
        torch.optim.Adam(reference_net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=2,
        save_dir=tmp_path / "ref",
        watching=pf.Watching(console=False),
    )()
    net = _sharded_net()
    run = pf.loop(
        net,
        torch.optim.Adam(net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=2,
        save_dir=tmp_path / "run",
        watching=pf.Watching(console=False),
    )
    run.run(steps=5)  # saved at 3 in the background, then two more steps
    run.ctx.wait_for_save()
    net = _sharded_net()
    resumed = pf.loop(
        net,
        torch.optim.Adam(net.parameters(), lr=0.01),
        _data(),
        hooks=hooks,
        max_epochs=2,
        save_dir=tmp_path / "run",
        resume="auto",
        watching=pf.Watching(console=False),
    )
    assert resumed.state.progress.global_step == 3
    resumed()
    final = _full(net)
    assert all(torch.equal(final[k], v) for k, v in _full(reference_net).items())


def test_a_sharded_run_warm_starts_from_a_plain_weights_file(one_rank_group, tmp_path):
    """load_weights hands the full state dict to every rank, which keeps its shards."""
    torch.manual_seed(3)
    plain = Net()
    torch.save(plain.state_dict(), tmp_path / "pretrained.pth")
    net = _sharded_net()
    run = pf.loop(
        net,
        torch.optim.SGD(net.parameters(), lr=0.0),
        _data(),
        max_epochs=1,
        hooks=[pf.load_weights(tmp_path / "pretrained.pth")],
        watching=pf.Watching(console=False),
    )
    run.step()  # BeforeTrain loads; a step at lr 0 leaves the weights as loaded
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in _full(net).items())
