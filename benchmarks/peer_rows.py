"""pimm_fn rows for the peers' harness (``../shared/bench/overhead.py``) beyond its own adapter's.

``N_CALLBACKS`` as the harness passes it: ``n >= 0`` is ``n`` no-op hooks
(each its own function), ``-1`` the standard stack (``evaluate_every``,
``save_every``, ``best_on``, ``log_every``, cadences beyond the run), ``-2``
the standard stack with ``Training(exact_retry=False)``.

Run from ``../shared/bench`` with this checkout on ``PYTHONPATH``::

    python overhead.py --steps 3000 --reps 3 --no-micro \\
      --runner 'pimm_fn=benchmarks.peer_rows:run' --extra-row 'pimm_fn+std=pimm_fn:-1' \\
      --extra-row 'pimm_fn+std-noexact=pimm_fn:-2' --extra-row 'pimm_fn+1=pimm_fn:1' \\
      --extra-row 'pimm_fn+10=pimm_fn:10'
"""

import tempfile

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


def run(ctx) -> None:
    wl, n = ctx.wl, len(ctx.batches)
    training = pf.Training(exact_retry=ctx.n_callbacks != -2)
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
        run_ = pf.loop(_LossModule(wl), wl.opt, ctx.batches, hooks=hooks, max_epochs=1, save_dir=d, training=training)
        run_.run(steps=n)
