"""pimm_fn rows for the peers' harness (``../shared/bench/overhead.py``) beyond its own adapter's.

``N_CALLBACKS`` as the harness passes it: ``n >= 0`` is ``n`` no-op hooks
(each its own function), ``-1`` the standard stack (``evaluate_every``,
``save_every``, ``best_on``, ``log_every``, cadences beyond the run), ``-2``
the standard stack with ``Training(exact_retry=False)``, ``-3`` that again
with ``step_fn=pf.TrainStep(loss_fn=...)`` on the workload's own model
(``model(x)``, then the loss: no module around it, as Ignite's row calls
the workload's step directly).

Run from ``../shared/bench`` with this checkout on ``PYTHONPATH``::

    python overhead.py --steps 3000 --reps 3 --no-micro \\
      --runner 'pimm_fn=benchmarks.peer_rows:run' --extra-row 'pimm_fn+std=pimm_fn:-1' \\
      --extra-row 'pimm_fn+std-noexact=pimm_fn:-2' --extra-row 'pimm_fn+1=pimm_fn:1' \\
      --extra-row 'pimm_fn+10=pimm_fn:10' --extra-row 'pimm_fn+std-noexact-trainstep=pimm_fn:-3'
"""

import tempfile

import torch.nn.functional as F
from torch import nn

import pimm_fn as pf


def _noops(n):
    """``n`` no-op hooks, each its own function (hooks resume by identity, so repeats are refused)."""

    def make(i):
        def noop(state, event):
            return state, ()

        noop.__name__ = noop.__qualname__ = f"noop_{i}"
        return noop

    return [make(i) for i in range(n)]


class _LossModule(nn.Module):
    """The harness's workload as the loop's default step takes it (``model(batch)["loss"]``)."""

    def __init__(self, wl):
        super().__init__()
        self.net = wl.model
        self._loss_fn = wl.loss_fn

    def forward(self, batch):
        return {"loss": self._loss_fn(batch)}


def _ticking_loss(wl):
    """The workload's loss on ``(model(x), y)``, stamping the step's clock as the workload's own loss does."""

    def loss(output, target):
        wl.tick()  # once a step, as the other rows stamp it: the intervals are the same steps'
        return F.cross_entropy(output, target)

    return loss


def run(ctx) -> None:
    wl, n = ctx.wl, len(ctx.batches)
    training = pf.Training(exact_retry=ctx.n_callbacks not in (-2, -3))
    model, step_fn = (
        (wl.model, pf.TrainStep(loss_fn=_ticking_loss(wl))) if ctx.n_callbacks == -3 else (_LossModule(wl), None)
    )
    if ctx.n_callbacks < 0:
        far = 10 * n + 7
        hooks = [
            pf.evaluate_every(far, lambda model: {"acc": 0.0}),
            pf.save_every(far),
            pf.best_on("acc"),
            pf.log_every(far),
        ]
    else:
        hooks = _noops(ctx.n_callbacks)
    with tempfile.TemporaryDirectory() as d:
        run_ = pf.loop(
            model, wl.opt, ctx.batches, hooks=hooks, max_epochs=1, save_dir=d, training=training, step_fn=step_fn
        )
        run_.run(steps=n)
