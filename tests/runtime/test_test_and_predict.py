"""run.test and run.predict after training, on the final weights or the best ones, which stay apart from the model."""

import os
import pathlib
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from pimm_fn import checkpoint

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402


def _data():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 3, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.layer(x)


def squared_error(outputs, batch):
    return {"mse": ((outputs - batch[1]) ** 2).sum(), "count": len(batch[1])}


def _step(model, optimizer, batch, *, scheduler=None, scaler=None):
    loss = ((model(batch[0]) - batch[1]) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach()}


def _mse(weights) -> float:
    model = Regressor()
    model.load_state_dict(weights)
    x, y = _data().tensors
    with torch.no_grad():
        return float(((model(x) - y) ** 2).mean())


@pytest.fixture
def trained(tmp_path):
    """A run whose validation error rises after its first evaluation (lr too high), so best != final."""
    model = Regressor()
    val = pf.loader_evaluator(DataLoader(_data(), batch_size=5), squared_error)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.6),
        DataLoader(_data(), batch_size=4),
        step_fn=_step,
        hooks=[pf.evaluate_every(1, val), pf.best_on("val/mse", mode="min")],
        max_epochs=2,
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=False),
    )
    run()
    return run, val, model


def test_test_evaluates_the_best_or_the_final_weights_and_keeps_the_models_own(trained, tmp_path):
    """weights='best' reads model_best.pth for the call; the model holds its final weights before and after."""
    run, val, model = trained
    final = {k: v.clone() for k, v in model.state_dict().items()}
    best = checkpoint.load_weights_file(tmp_path / "model" / "model_best.pth")
    assert _mse(best) < _mse(final)
    assert run.test(val, weights="best") == {"val/mse": pytest.approx(_mse(best))}
    assert run.test(val) == {"val/mse": pytest.approx(_mse(final))}
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in final.items()) and model.training
    assert run.test(val, weights="best") == {"val/mse": pytest.approx(run.state.best["val/mse"])}


def test_predict_returns_each_batchs_outputs_on_the_cpu(trained, tmp_path):
    """The outputs of model(x) per batch, under eval mode, for the final or the best weights."""
    run, _, model = trained
    x, _ = _data().tensors
    outputs = run.predict(DataLoader(_data(), batch_size=5))
    assert [len(o) for o in outputs] == [5, 5, 2]
    with torch.no_grad():
        assert torch.allclose(torch.cat(outputs), model(x))
        best = Regressor()
        best.load_state_dict(checkpoint.load_weights_file(tmp_path / "model" / "model_best.pth"))
        assert torch.allclose(torch.cat(run.predict(DataLoader(_data(), batch_size=5), weights="best")), best(x))


def test_unknown_weights_or_a_missing_best_file_are_said_with_the_fix(tmp_path):
    """weights='ema' is not one of the two; a run that wrote no model_best says so."""
    model = Regressor()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        DataLoader(_data(), batch_size=4),
        step_fn=_step,
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=False),
    )
    run()
    val = pf.loader_evaluator(DataLoader(_data(), batch_size=5), squared_error)
    with pytest.raises(ValueError, match="'weights' must be 'final' .* or 'best' .* \\(got 'ema'\\)"):
        run.test(val, weights="ema")
    with pytest.raises(
        FileNotFoundError, match="no best weights in .*: the run writes model_best with a best_on\\(metric\\) hook"
    ):
        run.test(val, weights="best")


@pytest.mark.parametrize(
    "record, problem",
    [
        (None, "model_best.json is a FIFO, not a regular file"),
        ("[" * 100000, "model_best.json is damaged (ValueError: nested too deeply to parse)"),
        ("[1]", "model_best.json is damaged (ValueError: holds a JSON list"),
        (
            '{"metric": ["val/mse"], "step": 3, "value": 1.0}',
            "model_best.json is damaged (ValueError: 'metric' must be",
        ),
    ],
)
def test_a_damaged_best_record_is_named_with_the_fix_not_called_missing(trained, tmp_path, record, problem):
    """model_best.pth beside a FIFO, too deep or not-a-record .json: a CheckpointError naming the .json and what to
    do, never "the run writes no model_best", never a wait; the final weights still test."""
    run, val, _ = trained
    meta = tmp_path / "model" / "model_best.json"
    meta.unlink()
    if record is None:
        os.mkfifo(meta)
    else:
        meta.write_text(record)
    with within(60), pytest.raises(checkpoint.CheckpointError) as caught:
        run.test(val, weights="best")
    assert (caught.value.path, caught.value.file) == (str(tmp_path / "model" / "model_best.pth"), "model_best.json")
    assert f"{caught.value.file} {caught.value.problem}".startswith(problem)
    assert caught.value.advice.startswith("Restore model_best.json") and "weights='final'" in caught.value.advice
    assert "python -m pimm_fn ls" not in str(caught.value)  # the fix is the best file's, not a resume's
    with within(60), pytest.raises(checkpoint.CheckpointError, match="model_best.json"):
        run.test(val, weights="best", metric="val/mse")
    assert run.test(val) == {"val/mse": pytest.approx(run.state.metrics["val/mse"])}
