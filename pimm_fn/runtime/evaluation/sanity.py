"""A sanity evaluation before the first step, so a broken evaluator or a misspelt metric fails in seconds.

``loop()`` runs the run's evaluators once while it builds the run, before
the first step, on every rank alike (evaluation is collective), as
Lightning's ``num_sanity_val_steps=2`` does. By default
(``Watching(sanity_check=None)``) each evaluator that can be shortened
(``limited(n)``, as ``loader_evaluator`` is) runs on its first 2 batches per
rank, and an ``fn(model)`` evaluator, which cannot be shortened, is left to
its first evaluation; ``Watching(sanity_check=n)`` runs every evaluator, a
shortened one on ``n`` batches and any other as it is; ``0`` runs none.

Each result is checked as an evaluation's is (``as_metrics``), rank 0's is
broadcast, and the run's ``Advice`` judges the names: a metric a hook reads
that no evaluator publishes (``best_on("acc")`` beside ``"val/acc"``) is a
``ValueError`` on every rank, once every evaluator has run. Nothing is
published: no best weights, no log record. The model's training flags and
the RNG streams are put back, and the training data is not touched, so a
run trains to the same weights with or without the check. An evaluator over
a one-shot iterable (an iterator, not a loader) is not run: its batches
would be gone for the first evaluation.
"""

from pimm_fn import dist
from pimm_fn.runtime.errors import CollectiveDivergenceError
from pimm_fn.runtime.handlers.evaluation import as_metrics, evaluating
from pimm_fn.runtime.step.rng import rng_kept

__all__ = ["sanity_check", "shortened", "BATCHES"]

BATCHES = 2  # batches of each shortenable evaluator under the default sanity check, Lightning's number


def _agree(ctx, runs: dict) -> None:
    """Every rank is to run the same evaluators, or each raises: the check runs before the agreement guard's.

    Evaluation is collective, and the guard compares the ranks' hooks at the
    run's first event, after this: ranks built with other evaluators are
    told so here, in one gather of their names, instead of waiting in one
    evaluator's all-reduce.
    """
    if ctx.world_size == 1:
        return
    everyone = dist.all_gather_object(sorted(runs))
    if any(names != everyone[0] for names in everyone):
        per_rank = "; ".join(f"rank {r}: {names}" for r, names in enumerate(everyone))
        raise CollectiveDivergenceError(
            f"ranks would run other evaluators in the sanity check before the first step ({per_rank}): every rank "
            f"must build the same hook list, with the same arguments, in the same order"
        )


def shortened(fn, batches: int | None):
    """What the sanity check runs of evaluator ``fn`` (``batches`` as ``sanity_check``), or ``None`` to leave it out.

    One that can be shortened (``limited``) on its first batches; one that
    cannot, as it is when ``batches`` is given. ``limited`` returns ``None``
    where running would spend what the first evaluation needs (an iterator).
    """
    limited = getattr(fn, "limited", None)
    if callable(limited):
        return limited(BATCHES if batches is None else batches)
    return fn if batches is not None else None


def sanity_check(ctx, batches: int | None) -> dict:
    """Run ``ctx.evaluators`` once (see the module docstring); returns ``{evaluator: [metric names]}``.

    ``batches``: ``Watching(sanity_check=)``; ``None`` runs the shortenable
    evaluators only, on ``BATCHES`` batches.

    Raises:
        Whatever an evaluator raises; ``TypeError`` for a result of the
        wrong kind; ``ValueError`` for a metric no evaluator publishes
        (``pimm_fn.runtime.errors``); ``CollectiveDivergenceError``, on every
        rank, when ranks would run other evaluators.
    """
    names = {}
    with rng_kept():  # a DataLoader draws its seed from the RNG: training's streams stay as they were
        runs = {name: run for name, fn in ctx.evaluators.items() if (run := shortened(fn, batches)) is not None}
        _agree(ctx, runs)
        for name, run in runs.items():
            with evaluating(ctx) as model:
                values = as_metrics(run(model), name)
            values = dist.broadcast_object(values)
            names[name] = sorted(values or {})
            if ctx.advice is not None:
                ctx.advice.evaluated(name, values, consistent=True)
    if names:
        ctx.say("sanity check: " + "; ".join(f"{name} publishes {published}" for name, published in names.items()))
    return names
