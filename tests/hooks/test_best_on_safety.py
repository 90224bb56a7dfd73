"""best_on cannot silently keep the worst model, nor take another evaluator's metric for a typo."""

import pytest

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.hooks import BestState, best_on
from _hook_helpers import at


@pytest.mark.parametrize(
    "metric", ["val_loss", "loss", "val/error", "top1_err", "ValMSE", "nll", "perplexity", "trainLoss", "val/mae"]
)
def test_a_loss_like_metric_without_a_mode_is_refused_with_the_fix(metric):
    """Its default mode='max' would keep the highest loss: refused at construction, naming mode='min'."""
    with pytest.raises(
        ValueError,
        match=rf"best_on\('{metric}'\) would keep the model with the highest '{metric}' "
        rf"\(mode='max' by default\), the worst one for a loss or an error: pass "
        rf"best_on\('{metric}', mode='min'\), or mode='max' if higher is better",
    ):
        best_on(metric)


@pytest.mark.parametrize("metric", ["mIoU", "val/acc", "score", "neg_mse", "f1", "precision"])
def test_a_higher_is_better_metric_keeps_its_default_max(metric):
    """Accuracy-like names (and a negated loss) take mode='max' unsaid."""
    hook = best_on(metric)
    assert hook.direction == "max" and repr(hook) == f"best_on({metric!r})"


def test_an_explicit_mode_is_kept_and_shown():
    """An explicit mode on a loss-like name passes either way, and the repr can be pasted back."""
    assert repr(best_on("val_loss", mode="min")) == "best_on('val_loss', mode='min')"
    assert repr(best_on("val_loss", mode="max")) == "best_on('val_loss', mode='max')"
    assert best_on("val_loss", mode="min").direction == "min" and best_on("acc", mode="max") == best_on("acc")


def test_another_evaluators_near_miss_name_is_not_a_typo():
    """best_on('val/mIoU') seeing 'val2/mIoU' (another evaluator's) raises nothing and changes nothing."""
    state = at(3, BestState())
    for values in ({"val2/mIoU": 0.5}, {"val/miou": 0.4}):
        assert best_on("val/mIoU")(state, ev.MetricsPublished(values, "val2", 3)) == (state, ())


def test_early_stop_on_a_loss_without_a_mode_is_refused_with_the_fix():
    """early_stop("val_loss", patience=3) would wait for the loss to rise: refused, naming mode='min'."""
    with pytest.raises(ValueError, match=r"early_stop\('val_loss', patience=3, mode='min'\)"):
        pf.early_stop("val_loss", patience=3)
    assert pf.early_stop("val_loss", patience=3, mode="min").mode == "min"
    assert pf.early_stop("acc", patience=3) == pf.early_stop("acc", patience=3, mode="max")
