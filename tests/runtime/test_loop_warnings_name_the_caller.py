"""Warnings that ``loop()`` gives while it builds a run point at the line that called it."""

import warnings

import torch

import pimm_fn as pf
from pimm_fn.runtime.errors import ConfigurationWarning


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


def _build(save_dir, lr=0.1):
    model = _Model()
    data = [torch.randn(4, 2) for _ in range(2)]
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=lr),
        data,
        max_epochs=1,
        save_dir=save_dir,
        resume="auto",
        hooks=[pf.save_every(1)],
        watching=pf.Watching(console=False),
    )


def _caught(build):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    return [w for w in caught if issubclass(w.category, ConfigurationWarning)]


def test_fresh_restart_resume_and_spent_budget_warnings_point_at_the_caller(tmp_path):
    """A fresh 'auto' start beside model_best, a changed lr and a spent budget are each attributed to this file."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model_best.pth").write_bytes(b"")
    fresh = _caught(lambda: _build(tmp_path).run())
    assert [w.filename for w in fresh if "model_best" in str(w.message)] == [__file__]
    resumed = _caught(lambda: _build(tmp_path, lr=0.5))
    assert {w.filename for w in resumed} == {__file__}
    assert any("lr" in str(w.message) for w in resumed)
    assert any("already spent" in str(w.message) for w in resumed)
