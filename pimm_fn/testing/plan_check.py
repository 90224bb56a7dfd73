"""A run's trace against its plan: the metrics it published, and the moments both must share.

``plan`` cannot know what an evaluator returns, nor what a loss is: given the
metrics a run published (``published_metrics``), the plan of the same hooks
has every effect of the run's ``trace``, at the same step, during the same
event, from the same hook; only the numbers in ``Log`` records differ (a dry
run logs placeholders), so ``moments`` shows a ``Log`` as its step and kind.
``matches_plan`` puts the two together. Pure: no torch, no files.

    >>> import pimm_fn as pf
    >>> hooks = [pf.save_every(2), pf.log_every(2)]
    >>> trace = pf.plan(hooks, iters_per_epoch=2, max_epochs=2)
    >>> published_metrics(trace), matches_plan(trace, hooks, iters_per_epoch=2, max_epochs=2)
    ({}, True)
"""

from pimm_fn.core.effects import Log
from pimm_fn.core.events import MetricsPublished
from pimm_fn.core.plan import plan

__all__ = ["published_metrics", "moments", "matches_plan"]


def published_metrics(trace) -> dict:
    """``{step: {name: value}}``: what each evaluation of ``trace`` published, as ``plan(metrics=)`` takes it.

    >>> from pimm_fn.core.fold import TraceEntry
    >>> from pimm_fn.core.effects import WriteBest
    >>> published_metrics([TraceEntry(4, MetricsPublished({"acc": 0.5}, "val", 4), WriteBest("acc", 0.5, 4), 1)])
    {4: {'acc': 0.5}}
    """
    return {e.event.step: dict(e.event.values) for e in trace if isinstance(e.event, MetricsPublished)}


def moments(trace) -> list:
    """Each entry as ``(step, event type name, hook, effect)``; a ``Log`` as ``("Log", step, kind)``.

    What a plan predicts of a run: the numbers a ``Log`` carries (losses)
    exist only in the real run.
    """
    return [(e.step, type(e.event).__name__, e.hook,
             ("Log", e.effect.step, e.effect.kind) if isinstance(e.effect, Log) else e.effect)
            for e in trace]


def matches_plan(trace, hooks, **schedule) -> bool:
    """Whether ``trace`` (a run's ``run.trace``) has the moments of ``plan(hooks, **schedule)``.

    The plan is given the metrics ``trace`` published; ``schedule`` is
    ``plan``'s keywords (``iters_per_epoch``, ``max_epochs`` or ``max_steps``,
    ``start_step``, ``outputs``). A run resumed or stopped early matches the
    plan of that schedule, not of the whole run.
    """
    return moments(trace) == moments(plan(hooks, metrics=published_metrics(trace), **schedule))
