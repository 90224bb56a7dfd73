"""Checks of the design's promises over simulated runs, with readable failure reports.

``assert_collective_agreement`` checks that every rank executes the same
collective effects in the same order (rule 3); ``assert_resume_continuity``
checks that a run resumed from a checkpoint does what the uninterrupted run
did from that point on (rule 4). Both raise ``AssertionError`` naming the
step, the event, the hook and what each rank did, so a hypothesis
counterexample reads as a diagnosis.

A run's trace against its plan: the metrics it published, and the moments both must share.

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

from collections.abc import Iterable
from typing import Any

from pimm_fn.core import dealing
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log, SaveCheckpoint, WriteBest
from pimm_fn.core.events import MetricsPublished
from pimm_fn.core.fold import Chain
from pimm_fn.core.plan import plan
from pimm_fn.testing.replicas import DealtStep, ReplicasResult, Save
from pimm_fn.testing.simulation import SimEntry, SimulationResult, past_the_end, resume_step, simulate

__all__ = [
    "assert_collective_agreement",
    "assert_resume_continuity",
    "published_metrics",
    "moments",
    "matches_plan",
    "assert_replicas_agree",
    "assert_heals_exact",
    "assert_saves_once",
    "assert_steps_rise",
    "assert_epochs_dealt_once",
    "assert_fault_tolerant",
]


_RESUMED = ev.BeforeTrain(resumed=True)


# The order of lifecycle events within one global step; with the step it
# names the same moment on every rank (``BeforeStep(k + 1)`` runs at step k).
_PHASE = {
    None: -1,
    "ModifyConfig": 0,
    "BeforeTrain": 1,
    "AfterStep": 2,
    "AfterEpoch": 3,
    "BeforeEpoch": 4,
    "BeforeStep": 5,
    "AfterTrain": 6,
}


def _same(a, b) -> bool:
    """Equal, counting NaN equal to NaN (a re-computed NaN is a new object)."""
    return a == b or repr(a) == repr(b)


def _event_label(event) -> str:
    """The rank-consistent part of an event: rank-local outputs and values left out."""
    match event:
        case ev.AfterStep(step=step):
            return f"AfterStep(step={step})"
        case ev.MetricsPublished(source=source, step=step):
            return f"MetricsPublished(source={source!r}, step={step})"
    return repr(event)


def _by_moment(result: SimulationResult, rank: int) -> dict:
    """Collective entries of ``rank`` grouped by (step, lifecycle event), in order."""
    groups: dict = {}
    for e in result.collective(rank):
        groups.setdefault((e.step, e.during), []).append((e.hook, e.effect, _event_label(e.event)))
    return groups


def _describe(result: SimulationResult, moment, wanted: list) -> str:
    hooks = result.hooks.hooks
    step, during = moment

    def render(items):
        if not items:
            return "nothing"
        return "; ".join(f"{effect!r} from hook #{i} {hooks[i]!r} on {label}" for i, effect, label in items)

    involved = set()
    for items in wanted:
        for i, effect, label in items:
            if not all(any(_same((i, effect, label), other) for other in others) for others in wanted):
                involved.add(f"#{i} {hooks[i]!r}")
    lines = [
        f"ranks disagree on the collective effects at global step {step}, during {during}; "
        f"hook(s) involved: {', '.join(sorted(involved)) or '(the order differs)'}"
    ]
    shown: dict = {}
    for rank, items in enumerate(wanted):
        shown.setdefault(render(items), []).append(rank)
    for text, ranks in shown.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        lines.append(f"  {who} wanted: {text}")
    lines.append(
        "A collective decision must depend only on rank-consistent state (progress, broadcast metrics); "
        "check the hook(s) above for rank-local inputs."
    )
    return "\n".join(lines)


def _same_items(a: list, b: list) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def assert_collective_agreement(result: SimulationResult) -> None:
    """Assert every rank executed the same ``COLLECTIVE`` effects, in the same order.

    Ranks are compared moment by moment (global step and lifecycle event).
    Rank-local parts of events (step outputs, unbroadcast metric values) are
    not compared; the effects, the emitting hooks and the event kinds are.

    Args:
        result: what ``simulate`` returned.

    Raises:
        AssertionError: at the first moment where ranks differ, naming the
            step, the event, the hook(s) (index and repr) and what each rank
            wanted; ranks that agree with each other are listed together.

    >>> from pimm_fn.hooks import evaluate_every, save_every
    >>> def f(model): return None
    >>> result = simulate([evaluate_every(2, f), save_every(3)], world_size=3, iters_per_epoch=4, max_epochs=2)
    >>> assert_collective_agreement(result)
    """
    if not isinstance(result, SimulationResult):
        raise TypeError(f"assert_collective_agreement takes what simulate() returned (got {result!r:.80})")
    per_rank = [_by_moment(result, rank) for rank in range(result.world_size)]
    moments = sorted({m for groups in per_rank for m in groups}, key=lambda m: (m[0], _PHASE.get(m[1], 7)))
    for moment in moments:
        wanted = [groups.get(moment, []) for groups in per_rank]
        if not all(_same_items(wanted[0], other) for other in wanted[1:]):
            raise AssertionError(_describe(result, moment, wanted))


def _entry_text(entry) -> str:
    if entry is None:
        return "(nothing: the trace ends)"
    return f"step {entry.step} during {entry.during}: {entry.effect!r} from hook #{entry.hook} on {entry.event!r}"


def _differing_fields(a, b) -> list:
    return [
        name
        for name in ("progress", "metrics", "best", "config", "slots", "position")
        if not _same(getattr(a, name), getattr(b, name))
    ]


def assert_resume_continuity(
    hooks: Iterable[Any] | Chain, *, resume_at: int | Iterable[int], **simulate_kwargs: Any
) -> None:
    """Assert that resuming at each checkpoint step continues exactly as the uninterrupted run.

    For each step ``k`` in ``resume_at`` (one step or an iterable of steps,
    each checked as a separate single resume), simulates the run killed at
    the checkpoint of ``k`` and resumed (see ``simulate``), and compares, per
    rank, the entries after the resume point with the uninterrupted run's
    from that point on, then the final states. Entries of the resume's own
    ``BeforeTrain(resumed=True)`` have no counterpart and are skipped. When a
    hook stops the uninterrupted run early (``early_stop``), the steps after
    the one it ended at have no checkpoint to resume from and are left out,
    so ``resume_at=range(1, max_steps + 1)`` checks every step the run reaches.

    Args:
        hooks: the hook list.
        resume_at: a step or an iterable of steps in ``[1, max steps]``.
        **simulate_kwargs: ``world_size``, ``iters_per_epoch``, ``max_epochs``
            (or ``max_steps``) and optionally ``metrics`` and ``local``, as for ``simulate``.

    Raises:
        AssertionError: naming the rank, the resume step and the first entry
            at which the two runs part (each side's entry), or the final
            state fields that differ.
        ValueError: a step outside the run's steps, or every step of
            ``resume_at`` after the step a hook stopped the run at.

    >>> from pimm_fn.hooks import best_on, evaluate_every, save_every
    >>> def f(model): return None
    >>> stack = [evaluate_every(2, f), save_every(3), best_on("mIoU")]
    >>> assert_resume_continuity(stack, resume_at=range(1, 9), world_size=2, iters_per_epoch=4,
    ...                          max_epochs=2, metrics=lambda step, rank: {"mIoU": step % 3})
    """
    baseline = simulate(hooks, **simulate_kwargs)
    ended = baseline.states[0]  # where a stop ended the run: the same step on every rank (Stop is collective)
    max_steps = ended.progress.max_steps
    if isinstance(resume_at, Iterable) and not isinstance(resume_at, (str, bytes)):
        given: tuple[object, ...] = tuple(resume_at)
    else:
        given = (resume_at,)
    points = tuple(resume_step(k, max_steps, k) for k in given)  # each a single resume: one step, checked alone
    reached = tuple(k for k in points if ended.stop is None or k <= ended.progress.global_step)
    if points and not reached:
        raise ValueError(past_the_end(points[0], ended))
    for k in reached:
        resumed = simulate(hooks, resume_at=k, **simulate_kwargs)
        for rank in range(baseline.world_size):
            _check_rank(
                rank,
                k,
                baseline.traces[rank],
                resumed.traces[rank],
                resumed.resume_index[rank][0],
                baseline.states[rank],
                resumed.states[rank],
            )


def _check_rank(rank, k, uninterrupted, stitched, resume_index, final, resumed_final) -> None:
    continued = [e for e in stitched if e.event != _RESUMED]
    for i in range(max(len(uninterrupted), len(continued))):
        a = uninterrupted[i] if i < len(uninterrupted) else None
        b = continued[i] if i < len(continued) else None
        if a is None or b is None or not _same(a, b):
            after = (
                f"entry {i - resume_index + 1} after the resume"
                if i >= resume_index
                else f"entry {i}, before the resume: the simulation itself is not deterministic"
            )
            raise AssertionError(
                f"rank {rank}, resumed from the checkpoint of step {k}: the resumed run parts from the "
                f"uninterrupted one at {after}\n"
                f"  uninterrupted: {_entry_text(a)}\n"
                f"  resumed:       {_entry_text(b)}"
            )
    fields = _differing_fields(final, resumed_final)
    if fields:
        details = "\n".join(
            f"  {name}: uninterrupted {getattr(final, name)!r:.300} / resumed {getattr(resumed_final, name)!r:.300}"
            for name in fields
        )
        raise AssertionError(
            f"rank {rank}, resumed from the checkpoint of step {k}: same effects, but the final state "
            f"differs in {', '.join(fields)}\n{details}"
        )


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
    return [
        (
            e.step,
            type(e.event).__name__,
            e.hook,
            ("Log", e.effect.step, e.effect.kind) if isinstance(e.effect, Log) else e.effect,
        )
        for e in trace
    ]


def matches_plan(trace, hooks, **schedule) -> bool:
    """Whether ``trace`` (a run's ``run.trace``) has the moments of ``plan(hooks, **schedule)``.

    The plan is given the metrics ``trace`` published; ``schedule`` is
    ``plan``'s keywords (``iters_per_epoch``, ``max_epochs`` or ``max_steps``,
    ``start_step``, ``outputs``). A run resumed or stopped early matches the
    plan of that schedule, not of the whole run.
    """
    return moments(trace) == moments(plan(hooks, metrics=published_metrics(trace), **schedule))


def _checked(result: object, name: str) -> ReplicasResult:
    if not isinstance(result, ReplicasResult):
        raise TypeError(f"{name} takes what simulate_replicas() returned (got {result!r:.80})")
    return result


def _folded(result: ReplicasResult) -> list[dict[int, list[SimEntry]]]:
    """Per replica, its entries folded while live, by moment (a fresh process's own start left out)."""
    per_replica: list[dict[int, list[SimEntry]]] = []
    for run in result.runs:
        groups: dict[int, list[SimEntry]] = {}
        for entry, tick in zip(run.trace, run.ticks):
            if tick is not None:
                groups.setdefault(tick, []).append(entry)
        per_replica.append(groups)
    return per_replica


def _entry_key(entry: SimEntry) -> tuple:
    return (entry.step, entry.during, entry.hook, entry.effect, _event_label(entry.event))


def assert_replicas_agree(result: ReplicasResult) -> None:
    """Assert every live replica folded the same trace over the steps it was live, and ended in the same state.

    Moment by moment (each event the live replicas folded), the entries of
    every replica live then are compared (effect, hook, step, event; the
    rank-local parts of events, step outputs, left out); then the final
    states of the replicas live at the end.

    Raises:
        AssertionError: at the first moment where two live replicas differ,
            naming the step, the event and what each folded.

    >>> from pimm_fn.hooks import save_every
    >>> from pimm_fn.testing.replicas import Membership, simulate_replicas
    >>> m = Membership(3, lost={1: 2}, rejoined={1: 4})
    >>> assert_replicas_agree(simulate_replicas([save_every(2)], membership=m, length=9, batch_size=1, max_epochs=2))
    """
    result = _checked(result, "assert_replicas_agree")
    folded = _folded(result)
    for tick, moment in enumerate(result.moments):
        wanted = {r: [_entry_key(e) for e in folded[r].get(tick, [])] for r in moment.live}
        first = wanted[moment.live[0]]
        parted = [r for r, keys in wanted.items() if not _same_items(keys, first)]
        if parted:
            lines = "\n".join(
                f"  replica {r}: {'; '.join(_entry_text(e) for e in folded[r].get(tick, [])) or 'nothing'}"
                for r in moment.live
            )
            raise AssertionError(
                f"live replicas fold different traces at global step {moment.step}, during {moment.event} "
                f"(replicas {moment.live} live):\n{lines}"
            )
        strays = [r for r in range(len(result.runs)) if r not in moment.live and tick in folded[r]]
        if strays:
            raise AssertionError(f"replica(s) {strays} folded entries at step {moment.step} while not live")
    if result.moments:
        last = result.moments[-1].live
        reference = result.runs[last[0]].state
        for r in last[1:]:
            fields = _differing_fields(reference, result.runs[r].state)
            if fields:
                raise AssertionError(
                    f"replicas {last[0]} and {r}, both live at the end, end in states that differ in {', '.join(fields)}"
                )


def assert_heals_exact(result: ReplicasResult) -> None:
    """Assert each rejoined replica's state at its heal equals its source's (but its rank and world size).

    Raises:
        AssertionError: naming the replica, its source, the step and the
            fields that differ; or a heal from a replica not live then.
    """
    result = _checked(result, "assert_heals_exact")
    for run in result.runs:
        for heal in run.heals:
            fields = _differing_fields(heal.sent, heal.received) + [
                name for name in ("stop",) if not _same(getattr(heal.sent, name), getattr(heal.received, name))
            ]
            if fields or not heal.received.progress.global_step == heal.sent.progress.global_step == heal.step:
                raise AssertionError(
                    f"replica {heal.replica} healed from replica {heal.source} at step {heal.step} holds another "
                    f"state: {', '.join(fields) or 'its global step'} differ(s)"
                )
            before = result.moments[heal.tick - 1].live if heal.tick else ()
            if heal.source not in before or heal.replica in before:
                raise AssertionError(
                    f"replica {heal.replica} healed at step {heal.step} from replica {heal.source}: the source must "
                    f"be live before the heal and the healed one not (live then: {before})"
                )


def assert_saves_once(result: ReplicasResult) -> None:
    """Assert each collective save (``SaveCheckpoint``, ``WriteBest``) was executed once, by participating rank 0.

    At every moment, the saves the live replicas folded were executed by
    exactly one replica, the lowest-numbered live one; no checkpoint of a
    step was written twice.

    Raises:
        AssertionError: naming the step, the event, the save and the
            replicas that executed it (none, or several).
    """
    result = _checked(result, "assert_saves_once")
    folded = _folded(result)
    executed: dict[int, list[Save]] = {}
    for save in result.saves:
        executed.setdefault(save.tick, []).append(save)
    for tick, moment in enumerate(result.moments):
        owner = moment.live[0]
        wanted = [e.effect for e in folded[owner].get(tick, []) if isinstance(e.effect, (SaveCheckpoint, WriteBest))]
        done = executed.pop(tick, [])
        if [s.effect for s in done] != wanted or any(s.replica != owner for s in done):
            raise AssertionError(
                f"at global step {moment.step}, during {moment.event}, replicas {moment.live} folded the saves "
                f"{wanted}, executed as {[(s.effect, s.replica) for s in done]}: each must be executed once, "
                f"by replica {owner} (participating rank 0)"
            )
    if executed:
        raise AssertionError(f"saves executed at no moment the replicas folded: {executed}")
    written = [s.effect for s in result.saves if isinstance(s.effect, SaveCheckpoint)]
    twice = [e for i, e in enumerate(written) if e in written[:i]]
    if twice:
        raise AssertionError(f"checkpoint(s) written twice: {twice}")


def assert_steps_rise(result: ReplicasResult) -> None:
    """Assert the committed steps are 1, 2, 3, ... and each replica's rise strictly over the steps it took part in.

    A discarded step (its vote failed) is the next one, committed after it.

    Raises:
        AssertionError: naming the replica and the steps out of order.
    """
    result = _checked(result, "assert_steps_rise")
    steps = [s.step for s in result.steps]
    if steps != list(range(1, len(steps) + 1)):
        raise AssertionError(f"the committed steps do not rise one by one: {steps}")
    for dropped in result.discarded:
        if dropped.step not in steps and dropped.step <= max(steps, default=0):
            raise AssertionError(f"step {dropped.step}, discarded, was never committed after")
    for r, run in enumerate(result.runs):
        mine = [m.step for m in result.moments if m.event == "AfterStep" and r in m.live]
        if any(a >= b for a, b in zip(mine, mine[1:])):
            raise AssertionError(f"replica {r} commits steps out of order: {mine}")
        # Where it ends: its last committed step, or the step of a later heal (the epoch may end at that boundary).
        reached = max([*mine[-1:], *(heal.step for heal in run.heals)], default=0)
        if run.state.progress.global_step != reached:
            raise AssertionError(
                f"replica {r} ends at step {run.state.progress.global_step}, but its last committed step is "
                f"{mine[-1:]} and its heals are at steps {[heal.step for heal in run.heals]}"
            )


def assert_epochs_dealt_once(result: ReplicasResult) -> None:
    """Assert each epoch's positions were consumed once, through the cursor, whatever the membership.

    Per epoch, the committed steps start at cursor 0, each takes the
    positions from the cursor on (``pimm_fn.core.dealing``) and moves it past
    them; at the epoch's end the cursor is at its length (with ``drop_last``:
    less than a full step of the replicas live then short of it), unless a
    hook stopped the run in it or its step budget (``max_steps``) ended it.

    Raises:
        AssertionError: naming the epoch and step where a position was
            skipped, repeated or left.
    """
    result = _checked(result, "assert_epochs_dealt_once")
    length, batch = result.length, result.batch_size
    epochs: dict[int, list[DealtStep]] = {}
    for dealt in result.steps:
        epochs.setdefault(dealt.epoch, []).append(dealt)
    stopped = any(  # a hook's stop, or the step budget spent: the last epoch ends where it is
        run.state.stop is not None or run.state.progress.global_step == run.state.progress.step_limit
        for run in result.runs
    )
    last_epoch = max(epochs, default=-1)
    ends = [moment.live for moment in result.moments if moment.event == "AfterEpoch"]  # one per epoch, in order
    for epoch, steps in epochs.items():
        cursor = 0
        for dealt in steps:
            n = len(dealt.participants)
            taken = dealing.step_positions(cursor, length=length, batch_size=batch, participants=n)
            if dealt.cursor != cursor or set().union(*map(set, dealt.positions)) != set(range(cursor, cursor + taken)):
                raise AssertionError(
                    f"epoch {epoch}, step {dealt.step}: dealt {dealt.positions} from cursor {dealt.cursor}; "
                    f"the positions {cursor}..{cursor + taken - 1} were due"
                )
            cursor += taken
        # The count the epoch ended for: the replicas live at its AfterEpoch (a rejoin may end it at a boundary).
        n = len(ends[epoch]) if epoch < len(ends) else len(steps[-1].participants)
        short = length - cursor
        done = short == 0 or (result.drop_last and short < batch * n)
        if not done and not (stopped and epoch == last_epoch):
            raise AssertionError(f"epoch {epoch} ended with positions {cursor}..{length - 1} never dealt")


def assert_fault_tolerant(result: ReplicasResult) -> None:
    """All of the above: agreement of the live replicas, exact heals, saves once, steps rising, epochs dealt once."""
    assert_replicas_agree(result)
    assert_heals_exact(result)
    assert_saves_once(result)
    assert_steps_rise(result)
    assert_epochs_dealt_once(result)
