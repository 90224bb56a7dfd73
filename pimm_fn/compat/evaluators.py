"""pimm's evaluator hooks as pure hooks: when to evaluate, and which metric is pimm's "current metric".

pimm's evaluators compute their metrics themselves, from the validation
loader. In pimm_fn the metrics come from a callable ``fn(model) -> {name:
value}`` (the ``evaluate=`` given to ``build_hooks``); the hook keeps pimm's
cadence and names the metric pimm would publish as its "current metric",
which the savers track for ``model_best`` (``PIMM.md`` 2.3):

==================================  =================================  =========
pimm type                           current metric                     direction
==================================  =================================  =========
``SemSegEvaluator``                 ``mIoU``                           max
``InstanceSegmentationEvaluator``   ``<prefix>/ins_det_f1`` (prefix    max
                                    ``val`` or ``val/<primary label>``)
 ... ``select_metric="val_head_loss"``  ``val/head_loss_total``        min
``MAEEvaluator``                    ``neg_val_loss``                   max
``PretrainEvaluator``               ``mF1``                            max
==================================  =================================  =========

Cadence, as pimm's: with ``every_n_steps > 0`` after every global step it
divides, with ``0`` at each epoch's end; never with ``evaluate=False``
(pimm's ``cfg.evaluate``). Evaluations are broadcast from the main rank, so
the best value is one agreed value (pimm publishes most metrics on rank 0
only, ``PIMM.md`` 6.2). The pimm keywords that say *how* pimm computes its
metrics (``ignore_index``, ``class_names`` ...) are kept on the hook
(``hook.options``) for ``fn``'s author to read.

>>> def score(model): return {"mIoU": 0.5}
>>> pimm_evaluator("SemSegEvaluator", score, every_n_steps=100)
pimm_evaluator('SemSegEvaluator', score, every_n_steps=100)
>>> current_metric("InstanceSegmentationEvaluator", {"labels": ("particle", "interaction")})
('val/particle/ins_det_f1', 'max')

pimm's ``FinalEvaluator`` as a pure hook: after training, the best (or last) weights tested once.

It asks with ``FinalTest``, carried out by ``pimm_fn.compat.HANDLERS``
(the weights loaded into a copy of the model), and logs what the tester
publishes. Which metric a pimm evaluator publishes during training:
``pimm_fn.compat.evaluators``.
"""

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from pimm_fn.compat.effects import FinalTest
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, Log
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, is_callable, non_empty_str, optional
from pimm_fn.hooks.evaluation import Evaluator, evaluator_name
from pimm_fn.hooks.metric_names import check_spelling

__all__ = [
    "pimm_evaluator",
    "current_metric",
    "EVALUATOR_DEFAULTS",
    "deep_freeze",
    "final_evaluator",
]


# Every keyword of pimm's registered evaluators, with pimm's defaults (``PIMM.md`` 2.3).
EVALUATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "SemSegEvaluator": dict(
        write_cls_iou=False, every_n_steps=0, ignore_index=-1, macro_ignore_class_ids=None, per_instance_metrics=False
    ),
    "InstanceSegmentationEvaluator": dict(
        every_n_steps=0,
        stuff_threshold=0.5,
        mask_threshold=0.5,
        class_names=None,
        stuff_classes=None,
        iou_thresh=0.5,
        require_class_for_match=False,
        labels=None,
        prefix=None,
        primary_label=None,
        set_current_metric=True,
        instance_key=None,
        segment_key=None,
        segment_fallback_key=None,
        log_ari=True,
        select_metric="det_f1",
        log_val_loss=False,
    ),
    "MAEEvaluator": dict(every_n_steps=0, max_batches=None, log_pointclouds=True),
    "PretrainEvaluator": dict(
        label="segment",
        write_cls_iou=True,
        every_n_steps=1,
        max_train_events=250,
        max_test_events=250,
        class_names=None,
        prefix="",
        train_config=None,
    ),
}


def deep_freeze(value):
    """``value`` with every dict a ``FrozenMap`` and every list a tuple, at any depth: hashable config values.

    >>> deep_freeze({"a": [1, {"b": [2]}]})
    FrozenMap({'a': (1, FrozenMap({'b': (2,)}))})
    """
    if isinstance(value, Mapping):
        return FrozenMap({k: deep_freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(deep_freeze(v) for v in value)
    return value


def current_metric(type_name: str, options: Mapping) -> tuple[str, str] | None:
    """``(name, "max" | "min")`` of the metric pimm's ``type_name`` publishes as current, or ``None``.

    >>> current_metric("SemSegEvaluator", {}), current_metric("InstanceSegmentationEvaluator", {"set_current_metric": False})
    (('mIoU', 'max'), None)
    """
    options = {**EVALUATOR_DEFAULTS.get(type_name, {}), **options}
    if type_name == "SemSegEvaluator":
        return "mIoU", "max"
    if type_name == "MAEEvaluator":
        return "neg_val_loss", "max"
    if type_name == "PretrainEvaluator":
        return "mF1", "max"
    if type_name != "InstanceSegmentationEvaluator" or not options["set_current_metric"]:
        return None
    if options["select_metric"] == "val_head_loss":
        return "val/head_loss_total", "min"
    labels = options["labels"]
    labels = (None,) if labels is None else (labels,) if isinstance(labels, str) else tuple(labels)
    primary = options["primary_label"] if options["primary_label"] is not None else (labels[0] if labels else None)
    prefix = options["prefix"]
    prefix = ("val" if primary is None else f"val/{primary}") if prefix is None else prefix
    return f"{str(prefix).strip('/')}/ins_det_f1", "max"


def _select_metric(instance, attribute, value):
    chosen = value.get("select_metric", "det_f1")
    if instance.type == "InstanceSegmentationEvaluator" and chosen not in ("det_f1", "val_head_loss"):
        raise ValueError(
            f"InstanceSegmentationEvaluator: 'select_metric' must be 'det_f1' or 'val_head_loss' (got {chosen!r})"
        )


@attrs.frozen(repr=False)
class _PimmEvaluator:
    factory_name: ClassVar[str] = "pimm_evaluator"
    emits: ClassVar[tuple] = (Evaluate, Log)
    rank_consistent: ClassVar[bool] = True  # decides from the global step or epoch alone
    type: str = attrs.field(validator=non_empty_str)
    fn: Any = attrs.field(validator=optional(is_callable))
    every_n_steps: int = attrs.field(default=0, validator=int_at_least(0))
    evaluate: bool = attrs.field(default=True, validator=is_bool)
    options: FrozenMap = attrs.field(default=FrozenMap(), converter=deep_freeze, validator=_select_metric)

    def __attrs_post_init__(self):
        if self.evaluate and self.fn is None:
            raise TypeError(
                f"pimm_evaluator: {self.type} needs 'fn', the evaluation fn(model) -> {{metric: value}}, "
                f"or evaluate=False (pimm's cfg.evaluate)"
            )

    @property
    def metric(self) -> tuple[str, str] | None:
        """``(name, mode)`` of pimm's current metric for this evaluator."""
        return current_metric(self.type, self.options)

    @property
    def events(self) -> tuple:
        if not self.evaluate:
            return ()
        return ((ev.AfterStep,) if self.every_n_steps else (ev.AfterEpoch,)) + (ev.MetricsPublished, ev.AfterTrain)

    @property
    def every(self) -> int:
        return self.every_n_steps or 1

    def evaluators(self) -> dict:
        return {self.type: self.fn} if self.evaluate else {}

    def with_evaluator(self, name: str, fn) -> "_PimmEvaluator":
        if name != self.type:
            raise ValueError(f"pimm_evaluator provides evaluator {self.type!r}, not {name!r}")
        return attrs.evolve(self, fn=fn)

    def __call__(self, state, event):
        match event:
            case ev.AfterStep(step=step) if self.every_n_steps:
                return state, (Evaluate(self.type, step),)
            case ev.AfterEpoch() if not self.every_n_steps:
                return state, (Evaluate(self.type, state.progress.global_step),)
            case ev.MetricsPublished(values=values, source=source) if source == self.type:
                step = state.progress.global_step
                said = (Log(step, f"eval/{self.type}", values),) if values else ()  # pimm's "Val result" line
                name = self.metric[0] if self.metric else None
                if name is not None and name not in values:  # the saver would never see it: say so, or refuse
                    warning = check_spelling(f"{self.type}", name, event, step) or (
                        Log(
                            step,
                            "warning",
                            FrozenMap(
                                {
                                    "message": f"{self.type} published {sorted(values)} without {name!r}, pimm's current "
                                    f"metric for it: no model_best follows from this evaluation"
                                }
                            ),
                        ),
                    )
                    said += warning
                return state, said
            case ev.AfterTrain() if self.type == "SemSegEvaluator" and "mIoU" in state.best:
                step = state.progress.global_step
                return state, (Log(step, "info", FrozenMap({"message": f"Best mIoU: {state.best['mIoU']:.4f}"})),)
        return state, ()

    def __repr__(self):
        args = [repr(self.type), evaluator_name(self.fn) if self.fn is not None else "None"]
        if self.every_n_steps != EVALUATOR_DEFAULTS.get(self.type, {}).get("every_n_steps", 0):
            args.append(f"every_n_steps={self.every_n_steps}")
        args += ["evaluate=False"] if not self.evaluate else []
        args += [f"{k}={v!r}" for k, v in self.options.items()]
        return f"pimm_evaluator({', '.join(args)})"


@hook_factory
def pimm_evaluator(
    type: str, fn: Evaluator | None, *, every_n_steps: int | None = None, evaluate: bool = True, **options: Any
) -> _PimmEvaluator:
    """One of pimm's evaluators (``type``) running ``fn`` on its cadence.

    Args:
        type: ``"SemSegEvaluator"``, ``"InstanceSegmentationEvaluator"``,
            ``"MAEEvaluator"`` or ``"PretrainEvaluator"``.
        fn: ``fn(model) -> {metric: value}``, run as ``evaluate_every``'s
            (eval mode, inference mode, on every rank, the main rank's result
            broadcast). It should return pimm's current metric (module docstring).
        every_n_steps: evaluate after every global step it divides; ``0``: at
            each epoch's end; ``None``: pimm's default for ``type``.
        evaluate: pimm's ``cfg.evaluate``; ``False`` never evaluates.
        **options: the other keywords of ``type``'s pimm config, kept on the
            hook (``hook.options``) for ``fn``.

    Emits:
        ``Evaluate(type, step)`` (collective); ``Log(step, "eval/<type>", values)``
        for its published results, and a warning ``Log`` when they lack the
        current metric (a near miss is an error).
    """
    defaults = EVALUATOR_DEFAULTS.get(type, {})
    n = defaults.get("every_n_steps", 0) if every_n_steps is None else every_n_steps
    return _PimmEvaluator(type, fn, n, evaluate, options)


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
            raise TypeError(
                "final_evaluator needs 'tester', the test fn(model) -> {metric: value} | None, "
                "or evaluate=False (pimm's cfg.evaluate)"
            )

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
def final_evaluator(tester: Evaluator | None, *, test_last: bool = False, evaluate: bool = True) -> _FinalEvaluator:
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
