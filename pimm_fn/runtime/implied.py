"""What a run's hooks imply, derived once as one frozen value.

A hook list decides more than what its hooks emit: which evaluators the
interpreter runs, whether several metrics each keep their own best weights
file, whether some hook saves in the background, whether a hook (not the
train step) steps the scheduler, which lifecycle events the loop must
process, and what the agreement guard compares. ``Implied.of`` reads all of
it from the bound hook chain (through ``pimm_fn.core.hook``) when ``loop()``
builds a run; ``Loop.replace`` derives it again from the new hook list. The
loop, the guard and the handlers read it, never the hooks' attributes, and
nothing of it is computed per step.

>>> from pimm_fn.hooks import best_on, evaluate_every, save_every
>>> from pimm_fn.core.fold import chain
>>> def acc(model): return {"acc": 1.0, "loss": 0.5}
>>> implied = Implied.of(chain(evaluate_every(4, acc), best_on("acc"), best_on("loss", mode="min"), save_every(2)))
>>> sorted(implied.evaluators), implied.best_metrics, implied.best_per_metric, implied.steps_scheduler
(['acc'], ('acc', 'loss'), True, False)
"""

import types

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import WriteBest
from pimm_fn.core.fold import Chain
from pimm_fn.runtime.control import hooks_step_scheduler
from pimm_fn.runtime.guard_setup import hook_setups

__all__ = ["Implied", "best_metrics", "named_evaluators"]

_SETUP_EVENTS = (ev.ModifyConfig, ev.BeforeTrain)  # a run's first event, fresh or resumed: the guard compares setups


def best_metrics(hooks) -> tuple:
    """The metrics whose best weights the hooks write, in hook order (``best_on``'s metrics).

    >>> from pimm_fn.hooks import best_on
    >>> best_metrics([best_on("acc"), best_on("miou"), best_on("acc")])
    ('acc', 'miou')
    """
    found = []
    for declared in map(protocol.declared, protocol.leaves(hooks)):
        if declared.may_emit(WriteBest):
            found.extend(m for m in declared.reads_metrics if m not in found)
    return tuple(found)


def named_evaluators(hooks) -> types.MappingProxyType:
    """``{name: fn}`` of the hooks' evaluators, each under its hook's name.

    An evaluator that names its own metrics (``loader_evaluator(..., name=)``,
    which declares ``evaluator_name`` and ``named``) publishes under the name
    of the ``evaluate_every`` that runs it: one name in effects, logs and metrics.
    """
    found = hook_list.evaluators(hooks)
    return types.MappingProxyType({name: _renamed(fn, name) for name, fn in found.items()})


def _renamed(fn, name: str):
    if getattr(fn, "evaluator_name", name) == name or not callable(getattr(fn, "named", None)):
        return fn
    return fn.named(name)


def _readers(hooks) -> types.MappingProxyType:
    """``{metric: (identities of the hooks reading it, in order)}``."""
    found: dict = {}
    for d in map(protocol.declared, protocol.leaves(hooks)):
        for metric in d.reads_metrics:
            found.setdefault(metric, []).append(d.key)
    return types.MappingProxyType({metric: tuple(keys) for metric, keys in found.items()})


def _watched(hooks: Chain) -> frozenset:
    """Top-level hooks whose collective effects the guard compares per event: those not ``rank_consistent``."""
    return frozenset(i for i, h in enumerate(hooks.hooks) if not protocol.declared(h).rank_consistent)


def _compared(hooks: Chain, watched: frozenset, event_type) -> bool:
    """Whether the guard must see events of ``event_type``: a run's first events, or those a watched hook is called for."""
    if event_type in _SETUP_EVENTS:
        return True
    return any(i in watched for i in hooks.active(event_type))


def _cadences(hooks: Chain, watched: frozenset) -> tuple:
    """The distinct ``AfterStep`` cadences of the watched hooks, smallest first."""
    declared = [protocol.declared(hooks.hooks[i]) for i in watched]
    return tuple(sorted({d.every for d in declared if d.wants(ev.AfterStep)}))


@attrs.frozen
class Implied:
    """What the bound hook chain ``hooks`` implies for a run; build it with ``Implied.of``.

    Attributes:
        hooks: the bound hooks the run folds, as one ``Chain``.
        evaluators: ``{name: fn}`` the interpreter runs for an ``Evaluate``
            (each under its hook's name: ``named_evaluators``).
        best_metrics: the metrics whose best weights are written, in order.
        readers_of: ``{metric: (hook identities)}`` of the hooks reading each
            metric (``best_on``, ``early_stop``), for the run's ``Advice``.
        saves_in_background: some hook saves asynchronously (the staging
            memory is readied after the first step).
        steps_scheduler: some hook emits ``StepScheduler``, so the train
            step is handed ``scheduler=None``.
        guarded: the agreement guard checks this run.
        watched: positions of the top-level hooks the guard compares per
            event (not ``rank_consistent``).
        watched_cadences: their distinct ``AfterStep`` cadences, smallest first.
        setups: each top-level hook as the guard compares it across ranks
            before the first step (``pimm_fn.runtime.guard_setup.HookSetup``).
        processed: ``{lifecycle event class: whether the loop processes it}``:
            some hook is called for it, or the guard compares it.
        ticks: some hook listens to the run's clock (``Elapsed``:
            ``save_every(minutes=...)``), so it is read at each step boundary.
        quiet_steps: steps may be trained without a walk (``pimm_fn.runtime.quiet``): no
            ``BeforeStep`` is processed and no hook is called on every step's ``AfterStep``.
    """

    hooks: Chain
    evaluators: types.MappingProxyType
    best_metrics: tuple
    readers_of: types.MappingProxyType
    saves_in_background: bool
    steps_scheduler: bool
    guarded: bool
    watched: frozenset
    watched_cadences: tuple
    setups: tuple
    processed: types.MappingProxyType
    ticks: bool = False
    quiet_steps: bool = True

    @classmethod
    def of(cls, hooks: Chain, *, guarded: bool = False) -> "Implied":
        """Everything ``hooks`` (the run's bound ``Chain``) implies, for a run the guard checks when ``guarded``.

        Raises:
            ValueError: two different evaluators share a name.
        """
        top = hooks.hooks
        watched = _watched(hooks)
        processed = {t: bool(hooks.active(t)) or (guarded and _compared(hooks, watched, t)) for t in ev.LIFECYCLE}
        return cls(
            hooks, named_evaluators(top), best_metrics(top), _readers(top),
            hook_list.saves_in_background(top), hooks_step_scheduler(top), guarded, watched,
            _cadences(hooks, watched), hook_setups(top), types.MappingProxyType(processed),
            bool(hooks.active(ev.Elapsed)), not processed[ev.BeforeStep] and not hooks.fires_every_step,
        )

    @property
    def best_per_metric(self) -> bool:
        """Several metrics' best weights are kept: one ``model_best_<metric>`` file each."""
        return len(self.best_metrics) > 1

    def compared(self, event_type) -> bool:
        """Whether the guard must see events of ``event_type``: a run's first events, or a watched hook's."""
        return _compared(self.hooks, self.watched, event_type)
