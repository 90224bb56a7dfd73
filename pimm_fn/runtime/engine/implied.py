"""What a run's hooks imply, derived once as one frozen value, and the setup every rank must share before the first step.

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

The setup every rank must share before the first step, and how to say where ranks differ.

The agreement guard compares one digest of ``setup_of(hooks, state)`` across
ranks before training; when the digests differ it gathers the setups and
raises with ``describe_setup``, which names each differing hook by position
and identity and shows each rank's value. Pure: no torch, no process group.
"""

import re
import types

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import WriteBest
from pimm_fn.core.fold import Chain
from pimm_fn.runtime.handlers.control import hooks_step_scheduler

__all__ = [
    "HookSetup",
    "Setup",
    "setup_of",
    "hook_setups",
    "schedule_of",
    "describe_setup",
    "stable",
    "Implied",
    "best_metrics",
    "named_evaluators",
]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def stable(text: str) -> str:
    """``text`` without memory addresses (``<Foo object at 0x7f..>``), which differ between processes."""
    return _ADDRESS.sub("", text)


@attrs.frozen
class HookSetup:
    """One hook as the guard compares it across ranks.

    ``key`` is its identity; ``leaves`` the identities of a composite's
    leaves (empty for a leaf); ``declared`` what it and its leaves declare
    that decides when they are called: ``every``, events, ``rank_consistent``.
    """

    key: str
    leaves: tuple = ()
    declared: tuple = ()

    def shown(self, detail: str) -> str:
        """How to show it when ranks differ at ``detail``: "key", "leaves" or "declared"."""
        text = self.key
        if detail in ("leaves", "declared") and self.leaves:
            text += f" (leaves: {', '.join(self.leaves)})"
        if detail == "declared":
            text += f" [{'; '.join(self.declared)}]"
        return text


def _declaration(hook) -> str:
    d = protocol.declared(hook)
    events = "all" if d.events is None else ", ".join(t.__name__ for t in d.events)
    return f"{stable(d.key)}: events={events}, every={d.every}, rank_consistent={d.rank_consistent}"


def _hook_setup(hook) -> HookSetup:
    inner = protocol.children(hook) is not None
    leaves = tuple(protocol.leaves([hook])) if inner else ()
    return HookSetup(
        stable(protocol.key(hook)),
        tuple(stable(protocol.key(leaf)) for leaf in leaves),
        tuple(_declaration(h) for h in (hook, *leaves)),
    )


@attrs.frozen
class Setup:
    """What one rank starts a run with: its hooks, in order, and its schedule as ``(name, value)`` pairs."""

    hooks: tuple
    schedule: tuple


def setup_of(hooks, state) -> Setup:
    """The setup of a run of ``hooks`` (top-level hooks, in order) from ``state``.

    >>> from pimm_fn.hooks import save_every
    >>> from pimm_fn.core.plan import initial_state
    >>> setup = setup_of([save_every(2)], initial_state([save_every(2)], iters_per_epoch=6, max_epochs=3))
    >>> setup.hooks[0].key, setup.schedule[:2]
    ('save_every(2)', (('iters_per_epoch', 6), ('max_epochs', 3)))
    """
    return Setup(hook_setups(hooks), schedule_of(state))


def hook_setups(hooks) -> tuple:
    """Each of ``hooks`` (top-level, in order) as the guard compares it: derived once (``Implied.setups``)."""
    return tuple(_hook_setup(h) for h in hooks)


def schedule_of(state) -> tuple:
    """The schedule every rank must share, as ``(name, value)`` pairs, from the run's ``state``."""
    p = state.progress
    return (
        ("iters_per_epoch", p.iters_per_epoch),
        ("max_epochs", p.max_epochs),
        ("epoch", p.epoch),
        ("iter_in_epoch", p.iter_in_epoch),
        ("global_step", p.global_step),
        ("position", state.position),
        ("max_steps", p.step_limit),
    )


def _ranks(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2, 5``: consecutive ranks as ranges."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _per_rank(values: list, names: list | None = None) -> str:
    """``rank 0: a; rank 1: b``, ranks with the same value grouped, in order of first appearance.

    ``names``: each entry's name (``group 0``) where the entries are not ranks.
    """
    groups: dict = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    if names is not None:
        return "; ".join(f"{', '.join(names[i] for i in ranks)}: {value}" for value, ranks in groups.items())
    return "; ".join(f"{_ranks(ranks)}: {value}" for value, ranks in groups.items())


def _detail(entries: list) -> str:
    """The coarsest level at which the ranks' entries for one position differ."""
    present = [e for e in entries if e is not None]
    if None in entries or len({e.key for e in present}) > 1:
        return "key"
    return "leaves" if len({e.leaves for e in present}) > 1 else "declared"


def _hook_lines(per_rank: list, names: list | None) -> list:
    lines = []
    for position in range(max(len(s.hooks) for s in per_rank)):
        entries = [s.hooks[position] if position < len(s.hooks) else None for s in per_rank]
        if len(set(entries)) == 1:
            continue
        detail = _detail(entries)
        shown = [e.shown(detail) if e is not None else "(no hook)" for e in entries]
        lines.append(f"  hook #{position}: {_per_rank(shown, names)}")
    return lines


def _schedule_lines(per_rank: list, names: list | None) -> list:
    lines = []
    for i, (name, _) in enumerate(per_rank[0].schedule):
        shown = [repr(s.schedule[i][1]) for s in per_rank]  # as digested: 1 and 1.0 differ
        if len(set(shown)) > 1:
            lines.append(f"  {name}: {_per_rank(shown, names)}")
    return lines


def describe_setup(per_rank: list, names: list | None = None) -> str:
    """A report of how the ranks' setups (``Setup`` values, in rank order) differ, and how to fix it.

    ``names``: each setup's name where they are not ranks' (``group 0``, a
    replica group's: ``pimm_fn.runtime.replicas.agreement``).

    >>> from pimm_fn.hooks import save_every, log_every
    >>> from pimm_fn.core.plan import initial_state
    >>> def setup(*hooks): return setup_of(hooks, initial_state(hooks, iters_per_epoch=6, max_epochs=3))
    >>> print(describe_setup([setup(save_every(2), log_every(5)), setup(save_every(3), log_every(5))]))
    ranks would start training with different hooks or schedules, so their collective effects could not agree:
      hook #0: rank 0: save_every(2); rank 1: save_every(3)
    Every rank must build the same hook list, with the same arguments, in the same order: build it from
    configuration every rank shares, never from the rank, the host or a clock. A hook of your own configured
    per rank on purpose (its own local file) can declare a rank-independent identity, hook_key = '...'.
    """
    hooks, schedule = _hook_lines(per_rank, names), _schedule_lines(per_rank, names)
    who = "rank" if names is None else "replica group"
    lines = [
        f"{who}s would start training with different hooks or schedules, so their collective effects could not agree:"
        if names is None
        else f"{who}s fold different hooks or schedules, so their collective effects could not agree:",
        *hooks,
        *schedule,
    ]
    if hooks:
        lines.append(
            f"Every {who} must build the same hook list, with the same arguments, in the same order: build it "
            f"from configuration every {who} shares, never from the {who}, the host or a clock. A hook of your "
            f"own configured per {who} on purpose (its own local file) can declare "
            f"{'a rank-independent identity' if names is None else 'one identity for every group'}, hook_key = '...'."
        )
    if not hooks and not schedule:  # the digests differ, the values look alike: show them whole
        lines.append(f"  setups: {_per_rank([repr(s) for s in per_rank], names)}")
    if schedule:
        lines.append(
            "Every rank must resume from the same checkpoint and see the same number of batches per epoch "
            "(a DistributedSampler pads the shards to equal length)."
            if names is None
            else "Every replica group must run the same schedule (max_epochs or max_steps, the same training data)."
        )
    return "\n".join(lines)


_SETUP_EVENTS = (ev.ModifyConfig, ev.BeforeTrain)  # a run's first event, fresh or resumed: the guard compares setups


def best_metrics(hooks) -> tuple:
    """The metrics whose best weights the hooks write, in hook order (``best_on``'s metrics).

    >>> from pimm_fn.hooks import best_on
    >>> best_metrics([best_on("acc"), best_on("miou"), best_on("acc")])
    ('acc', 'miou')
    """
    found: list[str] = []
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
            before the first step (``pimm_fn.runtime.engine.implied.HookSetup``).
        processed: ``{lifecycle event class: whether the loop processes it}``:
            some hook is called for it, or the guard compares it.
        ticks: some hook listens to the run's clock (``Elapsed``:
            ``save_every(minutes=...)``), so it is read at each step boundary.
        quiet_steps: steps may be trained without a walk (``pimm_fn.runtime.engine.outputs``): no
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
            hooks,
            named_evaluators(top),
            best_metrics(top),
            _readers(top),
            hook_list.saves_in_background(top),
            hooks_step_scheduler(top),
            guarded,
            watched,
            _cadences(hooks, watched),
            hook_setups(top),
            types.MappingProxyType(processed),
            bool(hooks.active(ev.Elapsed)),
            not processed[ev.BeforeStep] and not hooks.fires_every_step,
        )

    @property
    def best_per_metric(self) -> bool:
        """Several metrics' best weights are kept: one ``model_best_<metric>`` file each."""
        return len(self.best_metrics) > 1

    def compared(self, event_type) -> bool:
        """Whether the guard must see events of ``event_type``: a run's first events, or a watched hook's."""
        return _compared(self.hooks, self.watched, event_type)
