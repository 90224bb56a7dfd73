"""A sanity evaluation before the first step, so a broken evaluator or a misspelt metric fails in seconds.

``loop(watching=Watching(sanity_check=n))`` runs every evaluator of the run
once, while ``loop()`` builds it, on every rank alike (evaluation is
collective): an evaluator that can be shortened (``limited(n)``, as
``loader_evaluator`` is) on its first ``n`` batches per rank, any other as it
is. Each result is checked as an evaluation's is (``as_metrics``), rank 0's
is broadcast, and the run's ``Advice`` judges the names: a metric a hook
reads that no evaluator publishes, beside a near-miss of it, is a
``ValueError`` on every rank. Nothing is published: no best weights, no log
record; the model's training flags and the RNG streams are put back.
"""

from pimm_fn import dist
from pimm_fn.runtime.evaluation import as_metrics, evaluating
from pimm_fn.runtime.rng import capture_rng, restore_rng

__all__ = ["sanity_check", "shortened"]


def shortened(fn, batches: int):
    """``fn`` on its first ``batches`` batches when it can be shortened (``limited``), else ``fn`` itself."""
    limited = getattr(fn, "limited", None)
    return limited(batches) if callable(limited) else fn


def sanity_check(ctx, batches: int) -> dict:
    """Run each of ``ctx.evaluators`` once (see the module docstring); returns ``{evaluator: [metric names]}``.

    Raises:
        Whatever an evaluator raises; ``TypeError`` for a result of the
        wrong kind; ``ValueError`` for a misspelt metric (``pimm_fn.runtime.advice``).
    """
    states = capture_rng()  # a DataLoader draws its seed from the RNG: training's streams stay as they were
    names = {}
    try:
        for name, fn in ctx.evaluators.items():
            with evaluating(ctx) as model:
                values = as_metrics(shortened(fn, batches)(model), name)
            values = dist.broadcast_object(values)
            names[name] = sorted(values or {})
            if ctx.advice is not None:
                ctx.advice.evaluated(name, values, consistent=True)
    finally:
        restore_rng(states)
    if names:
        ctx.say("sanity check: " + "; ".join(f"{name} publishes {published}" for name, published in names.items()))
    return names
