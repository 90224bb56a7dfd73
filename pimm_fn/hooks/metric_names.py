"""What a metric's name says: whether lower is better, and which published name a near miss meant.

Shared by the hooks that read a metric by name (``best_on``,
``early_stop``) and by plug-ins that read published metrics the same way.
"""

import difflib
import re

from pimm_fn.core import events as ev  # noqa: F401 - the docstring's examples use it
from pimm_fn.core.effects import Log

__all__ = ["lower_is_better", "check_spelling"]


# Words that name a quantity where lower is better: best_on of one with no mode would keep the worst model.
_LOWER_IS_BETTER = frozenset(
    {
        "loss",
        "losses",
        "error",
        "errors",
        "err",
        "mse",
        "rmse",
        "mae",
        "mape",
        "nll",
        "perplexity",
        "ppl",
        "wer",
        "cer",
        "ter",
        "bce",
        "ce",
        "kl",
        "kld",
        "huber",
        "distance",
        "epe",
        "regret",
        "cost",
    }
)


def lower_is_better(metric: str) -> bool:
    """Whether ``metric`` names a loss-like quantity (a word of it, or its end, is ``loss``, ``error``, ``mse``...).

    A negated one (``neg_mse``, ``negative_loss``) is not.

    >>> [lower_is_better(m) for m in ("val_loss", "val/mIoU", "valLoss", "top1_err", "ValMSE", "accuracy", "neg_mse")]
    [True, False, True, True, True, False, False]
    """
    words = re.findall(r"[a-z0-9]+", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", metric).lower())
    if any(w in ("neg", "negative", "minus") for w in words):
        return False
    return any(w in _LOWER_IS_BETTER for w in words) or metric.lower().endswith(("loss", "error"))


def check_spelling(caller: str, metric: str, event, step: int) -> tuple:
    """Refuse a near-miss of ``metric`` among the published names: a typo the hook ``caller`` would never see.

    Only for a hook that reads what one evaluator publishes (its own
    ``source``): a hook reading every evaluator's metrics cannot tell a typo
    from another evaluator's name in one event; the run's ``Advice`` checks
    those once every evaluator has published (``pimm_fn.runtime.errors``).

    Raised when every rank holds the same values (so every rank raises
    alike); with rank-local values only some ranks could see the typo, so
    it becomes a warning ``Log`` instead of a lone raising rank. Returns the
    effects to emit (none when no name is close).

    >>> check_spelling("best_on('miou')", "miou", ev.MetricsPublished({"loss": 1.0}), 3)
    ()
    """
    values = event.values
    lowered = {name.lower(): name for name in values}
    guess = lowered.get(metric.lower()) or next(
        iter(difflib.get_close_matches(metric, list(values), n=1, cutoff=0.8)), None
    )
    if guess is None:
        return ()
    message = f"{caller} got metrics {sorted(values)}: did you mean {guess!r}?"
    if event.consistent:
        raise ValueError(message)
    return (Log(step, "warning", {"message": message}),)
