"""TrainStep: a configured step moves batches, autocasts, accumulates and clips, and trains."""

import collections
import dataclasses
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from pimm_fn.runtime.step.driver import MicroBatches, batch_size
from pimm_fn.runtime.data.feed import Feed
from pimm_fn.runtime.step.train_step import to_device
from _tiny_workload import same, weights

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    meta: str
    extra: list


class Linear(torch.nn.Module):
    """A deterministic regression (no dropout): gradients depend on the batch alone."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(4, 1)
        self.dtypes = []  # the dtype of each forward's output

    def forward(self, batch):
        x, y = batch
        out = self.layer(x)
        self.dtypes.append(out.dtype)
        return {"loss": ((out.float() - y) ** 2).mean(), "mae": (out.float() - y).abs().mean()}


def data(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(1, keepdim=True)


def loader(n=24, batch=4):
    return DataLoader(TensorDataset(*data(n)), batch_size=batch, shuffle=True)


def test_to_device_moves_every_tensor_of_nested_containers_and_keeps_their_types():
    """Tensors inside dicts, lists, tuples, namedtuples and dataclasses move; other values are the same objects."""
    batch = {
        "a": [torch.ones(2), (torch.zeros(1), "tag")],
        "p": Pair(torch.ones(1), 3),
        "s": Sample(torch.ones(3), "m", [torch.ones(1)]),
        "od": collections.OrderedDict(t=torch.ones(1)),
    }
    moved = to_device(batch, "meta")  # a device every machine has, so the move is real
    assert moved["a"][0].device.type == "meta" and moved["a"][1][0].device.type == "meta"
    assert type(moved["a"]) is list and type(moved["a"][1]) is tuple and moved["a"][1][1] == "tag"
    assert type(moved["p"]) is Pair and moved["p"].x.device.type == "meta" and moved["p"].y == 3
    assert type(moved["s"]) is Sample and moved["s"].x.device.type == "meta" and moved["s"].meta == "m"
    assert moved["s"].extra[0].device.type == "meta"
    assert type(moved["od"]) is collections.OrderedDict and moved["od"]["t"].device.type == "meta"
    assert batch["a"][0].device.type == "cpu"  # the original batch is left as it was


def test_step_on_a_device_trains_on_batches_moved_there():
    """TrainStep(device='cpu') takes (x, y) batches through the non-blocking transfer and trains."""
    model = Linear()
    before = weights(model)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        loader(),
        max_epochs=2,
        watching=pf.Watching(console=False),
        step_fn=pf.TrainStep(device="cpu"),
    )
    run()
    assert run.state.progress.global_step == 12
    assert not same(weights(model), before)


def test_bf16_autocast_on_cpu_runs_the_forward_in_bf16_and_trains():
    """precision='bf16' runs the model's forward in bfloat16 on CPU; the loss still goes down."""
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = pf.TrainStep(precision="bf16")
    x, y = data(32)
    first = step(model, optimizer, (x, y))["loss"]
    for _ in range(30):
        last = step(model, optimizer, (x, y))["loss"]
    assert set(model.dtypes) == {torch.bfloat16}
    assert model.layer.weight.dtype == torch.float32  # autocast leaves the weights in float32
    assert last < first * 0.5


def test_fp16_makes_a_grad_scaler_that_the_loop_checkpoints_and_restores(tmp_path):
    """precision='fp16' with Training(scaler=None): the loop uses the step's GradScaler, saves and resumes its state."""

    def build(resume=None, max_epochs=1):
        model = Linear()
        return pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            loader(),
            max_epochs=max_epochs,
            watching=pf.Watching(console=False),
            step_fn=pf.TrainStep(precision="fp16"),
            hooks=[pf.save_every(6)],
            save_dir=tmp_path,
            resume=resume,
        ), model

    run, model = build()
    assert isinstance(run.ctx.scaler, torch.amp.GradScaler) and run.ctx.scaler.is_enabled()
    run()
    assert set(model.dtypes) == {torch.float16}
    saved = run.ctx.scaler.state_dict()
    assert saved != torch.amp.GradScaler("cpu").state_dict()  # trained: not what a fresh scaler starts from
    resumed, _ = build(resume="auto", max_epochs=2)
    assert resumed.ctx.scaler is not run.ctx.scaler
    assert resumed.ctx.scaler.state_dict() == saved


def test_a_scaler_with_bf16_is_refused_before_training():
    """Training(scaler=GradScaler()) with TrainStep(precision='bf16') is a ValueError naming the fix."""
    model = Linear()
    with pytest.raises(ValueError, match="precision='fp16'"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.05),
            loader(),
            max_epochs=1,
            watching=pf.Watching(console=False),
            training=pf.Training(scaler=torch.amp.GradScaler("cpu")),
            step_fn=pf.TrainStep(precision="bf16"),
        )


def _after_one_step(step, batch, seed=0, model=None):
    model = Linear(seed) if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    outputs = step(model, optimizer, batch)
    return weights(model), outputs


def test_k_micro_batches_update_as_one_batch_k_times_larger():
    """accumulate=3 over three batches of 4 steps the weights as one batch of 12 does (mean loss)."""
    x, y = data(12)
    whole, whole_out = _after_one_step(pf.TrainStep(), (x, y))
    parts = MicroBatches([(x[i : i + 4], y[i : i + 4]) for i in (0, 4, 8)])
    accumulated, outputs = _after_one_step(pf.TrainStep(accumulate=3), parts)
    assert all(torch.allclose(whole[k], accumulated[k], atol=1e-6) for k in whole)
    assert torch.allclose(outputs["loss"], whole_out["loss"], atol=1e-6)  # the mean of equal-sized parts
    assert outputs["loss"].requires_grad is False and isinstance(outputs["lr"], float)


class WithLogits(Linear):
    """``Linear`` reporting its predictions too: an output the step hands on, not a scalar."""

    def forward(self, batch):
        outputs = super().forward(batch)
        return {**outputs, "logits": self.layer(batch[0])}


def test_one_batchs_outputs_are_its_scalars_detached_and_its_other_outputs_as_they_are():
    """Without accumulation the step returns the model's outputs with each scalar detached, and the lr; with
    ``loss_fn``, the detached loss and the lr alone."""
    x, y = data(4)
    model = WithLogits()
    _, outputs = _after_one_step(pf.TrainStep(), (x, y), model=model)
    assert sorted(outputs) == ["logits", "loss", "lr", "mae"]
    assert not outputs["loss"].requires_grad and not outputs["mae"].requires_grad
    assert outputs["logits"].shape == (4, 1) and outputs["logits"].requires_grad  # handed on as the model gave it

    supervised = pf.TrainStep(loss_fn=torch.nn.functional.mse_loss)
    _, outputs = _after_one_step(supervised, (x, y), model=torch.nn.Linear(4, 1))
    assert sorted(outputs) == ["loss", "lr"] and not outputs["loss"].requires_grad


def test_accumulating_loop_counts_optimizer_steps_and_drops_the_remainder():
    """10 batches with accumulate=3: 3 steps per epoch of 3 batches each; global_step counts optimizer steps."""
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    stepped = []
    optimizer.register_step_post_hook(lambda *args: stepped.append(1))
    run = pf.loop(
        model,
        optimizer,
        loader(40, 4),
        max_epochs=2,
        watching=pf.Watching(console=False),
        step_fn=pf.TrainStep(accumulate=3),
    )
    assert run.ctx.feed.iters_per_epoch == 3
    run()
    assert run.state.progress.global_step == 6 == len(stepped)
    assert run.state.progress.samples_seen == 6 * 3 * 4
    assert len(model.dtypes) == 18  # 3 forwards per optimizer step


def test_grouped_feed_gives_the_same_group_again_after_a_fetch_fails_inside_it():
    """A fetch that raises on the second batch of a group: the next call returns the whole group afresh."""

    class FailOnce:
        def __init__(self, data, at):
            self.data, self.at, self.calls = data, at, 0

        def __len__(self):
            return len(self.data)

        def __iter__(self):
            for batch in self.data:
                self.calls += 1
                if self.calls == self.at:
                    raise OSError("flaky fetch")
                yield batch

    torch.manual_seed(0)
    plain = Feed(loader(40, 4), group=3)
    plain.start_epoch(0)
    expected = [plain.next_batch() for _ in range(3)]
    torch.manual_seed(0)
    feed = Feed(FailOnce(loader(40, 4), at=5), group=3)
    feed.start_epoch(0)
    got = [feed.next_batch()]
    with pytest.raises(OSError):
        feed.next_batch()
    got += [feed.next_batch(), feed.next_batch()]
    assert same([tuple(g) for g in got], [tuple(e) for e in expected])
    assert batch_size(got[0]) == 12


def test_clip_grad_norm_reports_the_norm_and_bounds_the_gradients():
    """clip_grad_norm=0.01: the reported grad_norm is the norm before clipping; after it, the norm is <= 0.01."""
    model = Linear()
    outputs = pf.TrainStep(clip_grad_norm=0.01)(model, torch.optim.SGD(model.parameters(), lr=0.1), data(12))
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert isinstance(outputs["grad_norm"], torch.Tensor) and outputs["grad_norm"] > 0.01
    assert norm <= 0.01 + 1e-6


def test_clip_grad_value_bounds_every_gradient_element():
    """clip_grad_value=0.001 leaves no gradient element above 0.001 in size; the norm is reported."""
    model = Linear()
    outputs = pf.TrainStep(clip_grad_value=0.001)(model, torch.optim.SGD(model.parameters(), lr=0.1), data(12))
    assert all(p.grad.abs().max() <= 0.001 for p in model.parameters())
    assert outputs["grad_norm"] > 0.001


def test_the_nonfinite_policy_applies_to_the_steps_loss():
    """A NaN loss from a TrainStep raises NonFiniteLossError under the default on_nonfinite."""
    model = Linear()
    x, y = data(24)
    x[0, 0] = float("nan")
    data_ = DataLoader(TensorDataset(x, y), batch_size=24)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data_,
        max_epochs=1,
        watching=pf.Watching(console=False),
        hooks=[pf.log_every(1)],
        step_fn=pf.TrainStep(clip_grad_norm=1.0),
    )
    with pytest.raises(pf.NonFiniteLossError):
        run()


def test_train_step_pickles_compares_by_value_and_reprs_as_its_call():
    """A TrainStep survives pickle, equals a step of the same options, and its repr rebuilds it."""
    step = pf.TrainStep(device=torch.device("cpu"), precision="bf16", accumulate=4, clip_grad_norm=1.0)
    assert pickle.loads(pickle.dumps(step)) == step
    assert repr(step) == "TrainStep(device='cpu', precision='bf16', accumulate=4, clip_grad_norm=1.0)"
    assert eval(repr(step), {"TrainStep": pf.TrainStep}) == step
    assert hash(step) == hash(pf.TrainStep(device="cpu", precision="bf16", accumulate=4, clip_grad_norm=1.0))


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(accumulate=0), "'accumulate' must be an int >= 1 (got 0)"),
        (dict(accumulate=2.0), "'accumulate' must be an int >= 1 (got 2.0)"),
        (dict(precision="16"), "'precision' must be one of ['32', 'bf16', 'fp16'] (got '16')"),
        (dict(clip_grad_norm=1.0, clip_grad_value=0.5), "not both"),
        (dict(clip_grad_norm=-1.0), "'clip_grad_norm' must be None or a finite number > 0 (got -1.0)"),
        (dict(clip_grad_value=0), "'clip_grad_value' must be None or a finite number > 0 (got 0)"),
        (dict(device="gpu"), "'device' must be None, a device string or a torch.device (got 'gpu')"),
    ],
)
def test_each_bad_option_is_refused_at_construction_with_what_is_allowed(options, message):
    """A bad option fails when the step is built, naming the option, the allowed values and the value."""
    with pytest.raises(ValueError) as raised:
        pf.TrainStep(**options)
    assert message in str(raised.value)


def test_accumulating_step_called_with_a_plain_batch_says_what_it_takes():
    """accumulate=3 given one (x, y) batch: a TypeError naming MicroBatches, not a silent wrong update."""
    model = Linear()
    with pytest.raises(TypeError, match="MicroBatches"):
        pf.TrainStep(accumulate=3)(model, torch.optim.SGD(model.parameters(), lr=0.1), data(12))


@pytest.mark.parametrize("loss_fn", [None, torch.nn.functional.mse_loss], ids=["model's loss", "loss_fn"])
def test_an_exception_inside_an_accumulation_then_run_again_ends_as_the_uninterrupted_run(loss_fn):
    """A forward raising on the 2nd micro-batch of a step: run() again retrains that step whole, bit-identically
    (the model returning its loss, or a plain one under the supervised step)."""

    class FailsOnce(Linear):
        def __init__(self, at):
            super().__init__()
            self.at, self.calls = at, 0

        def forward(self, batch):
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt("inside the accumulation")
            return super().forward(batch) if loss_fn is None else self.layer(batch)  # a plain model takes x alone

    def build(at):
        torch.manual_seed(0)
        model = FailsOnce(at)
        return model, pf.loop(
            model,
            torch.optim.Adam(model.parameters(), lr=0.01),
            loader(40, 4),
            max_epochs=2,
            watching=pf.Watching(console=False),
            hooks=[pf.log_every(1)],
            step_fn=pf.TrainStep(accumulate=3, loss_fn=loss_fn),
        )

    reference, run = build(at=0)
    run()
    model, interrupted = build(at=8)  # step 3's second micro-batch
    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert interrupted.interrupted is not None
    interrupted()
    assert same(weights(model), weights(reference))
    assert [repr(e) for e in interrupted.trace] == [repr(e) for e in run.trace]
