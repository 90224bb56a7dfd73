"""The default step, the conversion of step outputs to numbers, and the batch size the loop counts."""

import warnings

import pytest
import torch

from pimm_fn.runtime.step.driver import batch_size as _batch_size
from pimm_fn.runtime.step.train_step import scalar_outputs, train_step, train_step_scalars


class Net(torch.nn.Module):
    """A linear model whose forward returns the loss and whatever ``extra(loss, y)`` adds."""

    def __init__(self, extra):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3, 2)
        self.extra = extra

    def forward(self, batch):
        y = self.lin(batch)
        loss = y.pow(2).mean()
        return self.extra(loss, y)


EXTRAS = {
    "loss only": lambda loss, y: {"loss": loss},
    "aux and logits": lambda loss, y: {"aux": y.sum(), "loss": loss, "logits": y, "n": 3, "flag": True},
    "own lr entry": lambda loss, y: {"lr": y, "loss": loss},
    "int tensor": lambda loss, y: {"loss": loss, "count": torch.tensor(4)},
}


@pytest.mark.parametrize("name", list(EXTRAS))
@pytest.mark.parametrize("lr", [0.1, torch.tensor(0.1)])
def test_train_step_scalars_equals_scalar_outputs_of_train_step(name, lr):
    """The loop's fused default step gives scalar_outputs(train_step(...)): same values, same key order."""
    results = []
    for step in (lambda *a: scalar_outputs(train_step(*a)), lambda *a: train_step_scalars(*a)):
        model = Net(EXTRAS[name])
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        results.append([list(step(model, optimizer, torch.ones(4, 3) * i).items()) for i in range(3)])
    assert results[0] == results[1]
    assert all(type(v) is float for _, v in results[1][0])


def test_scalar_outputs_reads_tensors_that_require_grad_without_a_warning():
    """A one-element tensor still attached to the graph becomes a float, and torch does not warn."""
    x = torch.tensor([2.0], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = scalar_outputs({"loss": x * 3, "steps": torch.tensor(7), "ok": torch.tensor(True), "v": x.expand(2)})
    assert out == {"loss": 6.0, "steps": 7.0, "ok": 1.0} and all(type(v) is float for v in out.values())


@pytest.mark.parametrize(
    "batch, size",
    [
        ((torch.zeros(5, 2), torch.zeros(5)), 5),
        ([torch.zeros(6, 2)], 6),
        ((torch.tensor(1.0), torch.zeros(3)), 0),
        (((torch.zeros(4, 1), torch.zeros(4)), torch.zeros(4)), 4),
        ((torch.nn.Parameter(torch.zeros(2, 1)),), 2),
        ({"x": torch.zeros(3, 1), "y": torch.zeros(8)}, 8),
        (torch.zeros(9, 2), 9),
        (([1, 2], 3), 0),
        ((), 0),
    ],
)
def test_batch_size_counts_the_leading_dimension(batch, size):
    """The samples of a batch: the first tensor's leading dimension (the largest over a dict's values)."""
    assert _batch_size(batch) == size and type(_batch_size(batch)) is int
