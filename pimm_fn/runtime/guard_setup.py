"""The setup every rank must share before the first step, and how to say where ranks differ.

The agreement guard compares one digest of ``setup_of(hooks, state)`` across
ranks before training; when the digests differ it gathers the setups and
raises with ``describe_setup``, which names each differing hook by position
and identity and shows each rank's value. Pure: no torch, no process group.
"""

import re

import attrs

from pimm_fn.core import hook as protocol

__all__ = ["HookSetup", "Setup", "setup_of", "hook_setups", "schedule_of", "describe_setup", "stable"]

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
        ("iters_per_epoch", p.iters_per_epoch), ("max_epochs", p.max_epochs), ("epoch", p.epoch),
        ("iter_in_epoch", p.iter_in_epoch), ("global_step", p.global_step), ("position", state.position),
        ("max_steps", p.step_limit),
    )


def _ranks(ranks: list) -> str:
    """``rank 3`` or ``ranks 0-2, 5``: consecutive ranks as ranges."""
    runs = []
    for r in ranks:
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _per_rank(values: list) -> str:
    """``rank 0: a; rank 1: b``, ranks with the same value grouped, in order of first appearance."""
    groups: dict = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return "; ".join(f"{_ranks(ranks)}: {value}" for value, ranks in groups.items())


def _detail(entries: list) -> str:
    """The coarsest level at which the ranks' entries for one position differ."""
    present = [e for e in entries if e is not None]
    if None in entries or len({e.key for e in present}) > 1:
        return "key"
    return "leaves" if len({e.leaves for e in present}) > 1 else "declared"


def _hook_lines(per_rank: list) -> list:
    lines = []
    for position in range(max(len(s.hooks) for s in per_rank)):
        entries = [s.hooks[position] if position < len(s.hooks) else None for s in per_rank]
        if len(set(entries)) == 1:
            continue
        detail = _detail(entries)
        shown = [e.shown(detail) if e is not None else "(no hook)" for e in entries]
        lines.append(f"  hook #{position}: {_per_rank(shown)}")
    return lines


def _schedule_lines(per_rank: list) -> list:
    lines = []
    for i, (name, _) in enumerate(per_rank[0].schedule):
        shown = [repr(s.schedule[i][1]) for s in per_rank]  # as digested: 1 and 1.0 differ
        if len(set(shown)) > 1:
            lines.append(f"  {name}: {_per_rank(shown)}")
    return lines


def describe_setup(per_rank: list) -> str:
    """A report of how the ranks' setups (``Setup`` values, in rank order) differ, and how to fix it.

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
    hooks, schedule = _hook_lines(per_rank), _schedule_lines(per_rank)
    lines = ["ranks would start training with different hooks or schedules, so their collective effects could not "
             "agree:", *hooks, *schedule]
    if hooks:
        lines.append("Every rank must build the same hook list, with the same arguments, in the same order: build it "
                     "from configuration every rank shares, never from the rank, the host or a clock. A hook of your "
                     "own configured per rank on purpose (its own local file) can declare a rank-independent "
                     "identity, hook_key = '...'.")
    if not hooks and not schedule:  # the digests differ, the values look alike: show them whole
        lines.append(f"  setups: {_per_rank([repr(s) for s in per_rank])}")
    if schedule:
        lines.append("Every rank must resume from the same checkpoint and see the same number of batches per epoch "
                     "(a DistributedSampler pads the shards to equal length).")
    return "\n".join(lines)


# -- the per-event comparison -------------------------------------------------------------------------
