"""pf.ema: the hook's cadence, the average's arithmetic, evaluation and model_best on it, and its checks."""

import pickle
import sys
import pathlib

import pytest
import torch

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.core import events as ev
from pimm_fn.core.effects import UpdateEma
from pimm_fn.core.state import Progress, State
from pimm_fn.runtime.handlers.ema import EmaWeights

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "runtime"))
from _tiny_workload import TinyNet, loader, negative_mse  # noqa: E402


def test_ema_requests_an_update_on_its_cadence():
    """ema(d, every=k) emits UpdateEma(name, step, d) on AfterStep, declares every=k, and nothing else."""
    hook = pf.ema(0.9, every=3, name="slow")
    state = State(Progress(10, 2))
    assert hook(state, ev.AfterStep(6)) == (state, (UpdateEma("slow", 6, 0.9),))
    assert hook(state, ev.BeforeStep(6)) == (state, ())
    assert hook.every == 3 and hook.averages() == {"slow": 0.9}


def test_ema_repr_reads_like_the_call_and_pickles():
    """The repr pastes back, and the hook survives pickling by value."""
    hook = pf.ema(0.99, every=4, name="slow")
    assert repr(hook) == "ema(0.99, every=4, name='slow')"
    assert pickle.loads(pickle.dumps(hook)) == hook


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"decay": 1.0}, "'decay' must be a number in \\[0, 1\\)"),
        ({"decay": float("nan")}, "'decay'"),
        ({"decay": 0.9, "every": 0}, "'every' must be an int >= 1"),
        ({"decay": 0.9, "name": ""}, "'name' must be a non-empty str"),
    ],
)
def test_ema_arguments_are_checked_at_construction(kwargs, match):
    """A decay outside [0, 1), every < 1 or an empty name fails at once."""
    with pytest.raises((ValueError, TypeError), match=match):
        pf.ema(**kwargs)


def test_the_average_follows_the_formula_and_copies_buffers():
    """avg starts at the weights, then avg = d*avg + (1-d)*w per update; buffers are the last ones seen."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    avg = EmaWeights()
    w0 = net[0].weight.detach().clone()
    avg.update(net, 0.75)
    with torch.no_grad():
        net[0].weight.add_(4.0)
        net[1].running_mean.fill_(7.0)
    avg.update(net, 0.75)
    got = avg.weights_of(net)
    assert torch.allclose(got["0.weight"], 0.75 * w0 + 0.25 * (w0 + 4.0))
    assert torch.equal(got["1.running_mean"], torch.full((2,), 7.0)) and avg.updates == 2


def test_an_update_with_grad_enabled_records_no_graph_and_leaves_the_weights_alone():
    """The update runs outside no_grad: its tensors are detached, so the average has no grad_fn and the
    parameters keep their version (nothing wrote them)."""
    net = torch.nn.Linear(3, 2)
    avg = EmaWeights()
    avg.update(net, 0.5)
    versions = [p._version for p in net.parameters()]
    assert torch.is_grad_enabled()
    avg.update(net, 0.5)
    assert all(not t.requires_grad and t.grad_fn is None for t in avg.params.values())
    assert [p._version for p in net.parameters()] == versions
    loss = net(torch.ones(1, 3)).sum()
    loss.backward()  # the parameters' graph is untouched by the update
    assert net.weight.grad is not None


def test_an_update_reads_nothing_back_to_the_host(monkeypatch):
    """Updating the average calls no Tensor.item / tolist / cpu (no host sync per step)."""
    net = torch.nn.Linear(8, 8)
    avg = EmaWeights()
    avg.update(net, 0.9)
    calls = []
    for name in ("item", "tolist", "cpu", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: calls.append(_n) or _o(self, *a, **k)
        )
    for _ in range(5):
        avg.update(net, 0.9)
    assert calls == []


def _run(save_dir, hooks, *, max_epochs=1):
    torch.manual_seed(0)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        loader(),
        hooks=hooks,
        max_epochs=max_epochs,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
    )
    return model, run


def test_evaluation_sees_the_average_and_training_keeps_its_own_weights(tmp_path):
    """weights='ema': the evaluator gets the average's weights; training goes on exactly as without the swap."""
    seen = []

    def look(model):
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"x": 1.0}

    model, run = _run(tmp_path / "a", [pf.ema(0.5), pf.evaluate_every(2, look, weights="ema")])
    run.run(steps=2)
    expected = run.ctx.extra_state["ema"].weights_of(model)
    assert all(torch.equal(seen[0][k], expected[k]) for k in expected)
    assert not torch.equal(model.hidden.weight, expected["hidden.weight"])
    run()
    plain, reference = _run(tmp_path / "b", [pf.ema(0.5), pf.evaluate_every(2, look)])
    reference()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_an_evaluator_that_raises_gets_the_weights_swapped_back(tmp_path):
    """The model's own weights come back even when the evaluator of the average raises (and changed them)."""

    def broken(model):
        with torch.no_grad():
            model.hidden.weight.zero_()
        raise RuntimeError("evaluator bug")

    model, run = _run(tmp_path / "a", [pf.ema(0.5), pf.evaluate_every(2, broken, name="val", weights="ema")])
    with pytest.raises(RuntimeError, match="evaluator bug"):
        run.run(steps=2)
    reference, plain = _run(tmp_path / "b", [pf.ema(0.5)])
    plain.run(steps=2)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


def test_best_on_writes_the_weights_that_were_evaluated(tmp_path):
    """With weights='ema', model_best holds the average at the best step, not the raw weights."""
    written = {}

    def score(model):
        written["ema"] = {k: v.clone() for k, v in model.state_dict().items()}
        return {"score": float(len(written))}

    model, run = _run(tmp_path, [pf.ema(0.5), pf.evaluate_every(2, score, weights="ema"), pf.best_on("score")])
    run.run(steps=2)
    best = checkpoint.load_weights_file(tmp_path / "model" / "model_best.pth")
    assert all(torch.equal(best[k], written["ema"][k]) for k in best)
    assert not torch.equal(best["hidden.weight"], model.hidden.weight)


@pytest.mark.parametrize("saver_first", [False, True])
def test_the_average_resumes_exactly(tmp_path, saver_first):
    """A resume from step 3 holds the average as it was at step 3, bit for bit, wherever the saver stands."""
    hooks = [pf.save_every(3), pf.ema(0.7)] if saver_first else [pf.ema(0.7), pf.save_every(3)]
    _, run = _run(tmp_path, hooks)
    run.run(steps=3)
    saved = run.ctx.extra_state["ema"].state_dict()
    torch.manual_seed(0)
    model = TinyNet()
    resumed = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.05),
        loader(),
        hooks=hooks,
        max_epochs=1,
        save_dir=tmp_path,
        resume="auto",
        watching=pf.Watching(console=False),
    )
    back = resumed.ctx.extra_state["ema"].state_dict()
    assert back["updates"] == saved["updates"] == 3
    assert all(torch.equal(back["params"][k], saved["params"][k]) for k in saved["params"])


def test_an_ema_after_an_evaluator_of_its_average_is_refused():
    """ema after the evaluate_every that reads it: that evaluation would miss its step's update, so loop refuses."""
    model = TinyNet()
    with pytest.raises(ValueError, match=r"ema\(0.9\) comes after evaluate_every\(2, negative_mse"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            hooks=[pf.evaluate_every(2, negative_mse, weights="ema"), pf.ema(0.9)],
            max_epochs=1,
        )


def test_evaluating_an_average_no_ema_keeps_is_refused():
    """evaluate_every(weights='ema') without pf.ema() says what to add."""
    model = TinyNet()
    with pytest.raises(ValueError, match=r"weights='ema', but no ema\(name='ema'\)"):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            hooks=[pf.evaluate_every(2, negative_mse, weights="ema")],
            max_epochs=1,
        )
