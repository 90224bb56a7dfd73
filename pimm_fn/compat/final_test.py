"""pimm's ``FinalEvaluator`` as a pure hook: after training, the best (or last) weights tested once.

It asks with ``FinalTest``, carried out by ``pimm_fn.compat.HANDLERS``
(the weights loaded into a copy of the model), and logs what the tester
publishes. Which metric a pimm evaluator publishes during training:
``pimm_fn.compat.evaluators``.
"""

from typing import Any, ClassVar

import attrs

from pimm_fn.compat.effects import FinalTest
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import is_bool, is_callable, optional
from pimm_fn.hooks.evaluation import evaluator_name

__all__ = ["final_evaluator"]


@attrs.frozen(repr=False)
class _FinalEvaluator:
    factory_name: ClassVar[str] = "final_evaluator"
    emits: ClassVar[tuple] = (FinalTest, Log)
    rank_consistent: ClassVar[bool] = True
    tester: Any = attrs.field(validator=optional(is_callable))
    test_last: bool = attrs.field(default=False, validator=is_bool)
    evaluate: bool = attrs.field(default=True, validator=is_bool)

    def __attrs_post_init__(self):
        if self.evaluate and self.tester is None:
            raise TypeError("final_evaluator needs 'tester', the test fn(model) -> {metric: value} | None, "
                            "or evaluate=False (pimm's cfg.evaluate)")

    @property
    def events(self) -> tuple:
        return (ev.AfterTrain, ev.MetricsPublished) if self.evaluate else ()

    def evaluators(self) -> dict:
        return {"FinalEvaluator": self.tester} if self.evaluate else {}

    def __call__(self, state, event):
        step = state.progress.global_step
        match event:
            case ev.AfterTrain():
                return state, (FinalTest(step, "FinalEvaluator", self.test_last),)
            case ev.MetricsPublished(values=values, source="FinalEvaluator") if values:
                return state, (Log(step, "eval/FinalEvaluator", values),)
        return state, ()

    def __repr__(self):
        args = [evaluator_name(self.tester) if self.tester is not None else "None"]
        args += ["test_last=True"] if self.test_last else []
        args += ["evaluate=False"] if not self.evaluate else []
        return f"final_evaluator({', '.join(args)})"


@hook_factory
def final_evaluator(tester, *, test_last: bool = False, evaluate: bool = True):
    """pimm's ``FinalEvaluator``: after training, test ``model_best`` (``test_last``: the last weights).

    The handler (``pimm_fn.compat.HANDLERS``) loads ``save_dir/model/model_best.pth``
    (``weights_only=True``, ``strict``) into a copy of the model, so the run's
    model keeps its last weights, and calls ``tester(model)`` in eval and
    inference mode on every rank; what it returns is published as
    ``MetricsPublished(values, "FinalEvaluator")``. With ``evaluate=False``
    (pimm's ``cfg.evaluate``) it does nothing.

    Emits:
        ``FinalTest(step, "FinalEvaluator", test_last)`` at ``AfterTrain``
        (collective); ``Log(step, "eval/FinalEvaluator", values)`` for the results.

    >>> def test(model): return {"allAcc": 1.0}
    >>> final_evaluator(test, test_last=True)
    final_evaluator(test, test_last=True)
    """
    return _FinalEvaluator(tester, test_last, evaluate)
