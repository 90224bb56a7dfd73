"""The lifecycle as a pure function of the state: which event comes next.

The real driver, ``plan()`` and the simulator all walk training with
``next_event`` and ``advance``, so they cannot disagree about the order of
events, and a run restored from any checkpoint continues exactly where the
saved ``State.position`` says it stopped.
"""

from typing import Any, Protocol

import attrs

from pimm_fn.core import budget
from pimm_fn.core import events as ev
from pimm_fn.core.state import Progress, State
from pimm_fn.core.step_state import StepState, built, step_facts, stepping

__all__ = ["next_event", "advance", "resume_from", "state_at_step", "skip_to", "last_quiet_step"]


def next_event(state: State) -> ev.Event | None:
    """The next lifecycle event, or ``None`` once training has finished.

    ``AfterStep`` is returned without outputs: the driver fills them in.

    Once a stop was requested (``State.stop``, see ``pimm_fn.effects.Stop``)
    only the closing events remain: an epoch in progress (after its
    ``BeforeEpoch`` or a step) ends early with its ``AfterEpoch``, then
    ``AfterTrain``; between epochs, ``AfterTrain`` follows at once. A step
    whose ``BeforeStep`` ran still trains (its ``AfterStep`` comes first).
    A step budget (``Progress.step_limit``) spent closes the same way: the
    step that reaches it ends its epoch (``Progress.at_epoch_end``).

    >>> s = State(Progress(iters_per_epoch=2, max_epochs=1))
    >>> next_event(s)
    ModifyConfig()
    >>> mid = State(Progress(10, 3, iter_in_epoch=4, global_step=4), position="AfterStep", stop="plateau")
    >>> next_event(mid)
    AfterEpoch(epoch=0)
    """
    position = state.position
    if position == "BeforeStep" or position == "AfterStep":  # the two per-step positions first: twice a step
        # Read without building a StepState's progress (pimm_fn.core.step_state).
        global_step, at_epoch_end, epoch = step_facts(state)
        if position == "BeforeStep":
            return ev.AfterStep(global_step + 1)
        if at_epoch_end or state.stop is not None:
            return ev.AfterEpoch(epoch)
        return ev.BeforeStep(global_step + 1)
    p = state.progress
    match position:
        case None:
            return ev.ModifyConfig()
        case "ModifyConfig":
            return ev.BeforeTrain()
        case "BeforeTrain":
            return ev.BeforeEpoch(p.epoch) if _begins(p, p.epoch) and state.stop is None else ev.AfterTrain()
        case "BeforeEpoch":
            spent = p.global_step == p.step_limit
            return ev.BeforeStep(p.global_step + 1) if state.stop is None and not spent else ev.AfterEpoch(p.epoch)
        case "AfterEpoch":
            more = _begins(p, p.epoch + 1) and state.stop is None
            return ev.BeforeEpoch(p.epoch + 1) if more else ev.AfterTrain()
        case "AfterTrain":
            return None
    raise ValueError(f"State.position {state.position!r} is not a lifecycle event name")


def _begins(p: Progress, epoch: int) -> bool:
    """Whether ``epoch`` begins: within ``max_epochs``, or, under a step budget, while steps are left."""
    return epoch < p.max_epochs if p.step_limit is None else p.global_step < p.step_limit


def advance(state: Any, event: ev.Event) -> Any:
    """The core's own bookkeeping for ``event``, applied before the hooks see it.

    A step's events move a ``StepState`` as one (``pimm_fn.core.step_state``); any other event gives a ``State``.
    """
    if event.__class__ is ev.BeforeStep:  # every step a hook is called for: ahead of the match's class tests
        if state.__class__ is StepState:
            return state.at("BeforeStep")
        return state.moved(state.progress, "BeforeStep", state.slots, state.slot)
    if event.__class__ is ev.AfterStep:  # counted as a step's state counts it (its order checked there)
        after = stepping(state).stepped(event.step, event.batch_size).with_slot(state.slot)
        return after if state.__class__ is StepState else after.built()
    state = built(state)  # a step's events keep a StepState one; any other event moves a State
    match event:
        case ev.MetricsPublished(values=values):
            return attrs.evolve(state, metrics=state.metrics.merge(values))
        case ev.StopRequested(reason=reason):
            # The first request's reason is kept: a later one changes nothing.
            return state if state.stop is not None else attrs.evolve(state, stop=reason or "stop requested")
        case ev.BeforeEpoch(epoch=epoch):
            progress = attrs.evolve(state.progress, epoch=epoch, iter_in_epoch=0)
            return attrs.evolve(state, progress=progress, position="BeforeEpoch")
        case ev.BeforeTrain(resumed=True):
            return state
    name = type(event).__name__
    if isinstance(event, ev.LIFECYCLE):  # only the position moves
        return state.moved(state.progress, name, state.slots, state.slot)
    return state


def stepped_state(state: State, progress: Progress, slots: tuple[Any, ...]) -> State:
    """``state`` after an ``AfterStep``: its new ``progress`` and hook ``slots``, no running slot."""
    return state.moved(progress, "AfterStep", slots, None)


def skip_to(
    state: State, step: int, *, batch_size: int = 0, samples: int | None = None, slots: tuple[Any, ...] | None = None
) -> State:
    """``state`` after ``AfterStep(step)``, reached in one jump over steps no hook is called on.

    Exactly what walking ``BeforeStep``/``AfterStep`` of each step from
    ``global_step + 1`` to ``step`` leaves, provided none of them calls a
    hook: the progress moves on (``global_step``, ``iter_in_epoch``, and
    ``samples_seen`` by ``batch_size`` a step, or by ``samples`` in all: 0
    in ``plan`` and ``simulate``), the position is ``"AfterStep"``, the
    slots are ``slots`` (what the accumulating hooks made of the skipped
    steps' outputs) or untouched. Whether the steps are quiet is the
    caller's to know (``last_quiet_step``).

    Raises:
        ValueError: when the next event is not a ``BeforeStep``, or ``step``
            is not in ``[global_step, the epoch's last step]``.

    >>> s = skip_to(advance(State(Progress(10, 2)), ev.BeforeEpoch(0)), 7)
    >>> s.progress.global_step, s.progress.iter_in_epoch, s.position
    (7, 7, 'AfterStep')
    """
    if not isinstance(next_event(state), ev.BeforeStep):
        raise ValueError(f"skip_to: the next event must be a BeforeStep (position is {state.position!r})")
    p = state.progress
    last = p.epoch_end_step
    if not p.global_step <= step <= last:
        raise ValueError(f"skip_to: 'step' must be in [{p.global_step}, {last}] (this epoch's steps; got {step})")
    if step == p.global_step:
        return state if slots is None else attrs.evolve(state, slots=slots)
    n = step - p.global_step
    added = n * batch_size if samples is None else samples
    progress = p.advanced(n, added)
    return stepped_state(state, progress, state.slots if slots is None else slots)


class Cadenced(Protocol):
    """What ``last_quiet_step`` asks of a hook chain (a ``Chain``; the fold imports this module, not the reverse)."""

    def next_call(self, step: int) -> int: ...


def last_quiet_step(hooks: Cadenced, progress: Progress, visit: int | None = None) -> int:
    """The last step before the next one that must be walked event by event.

    That next one is where an ``AfterStep`` cadence of ``hooks`` (a
    ``Chain``) fires, the epoch's last step, or ``visit``. The steps in
    between call no hook for their ``AfterStep``; ``skip_to`` crosses them
    when no hook wants ``BeforeStep`` either.

    >>> from pimm_fn.core.fold import chain
    >>> from pimm_fn.hooks import save_every
    >>> last_quiet_step(chain(save_every(4)), Progress(10, 2, epoch=1, global_step=10))
    11
    """
    step = progress.global_step
    until = min(progress.epoch_end_step, hooks.next_call(step))
    if visit is not None and visit > step:
        until = min(until, visit)
    return until - 1


def resume_from(state: State, *, max_epochs: int | None = None, max_steps: int | None = None) -> State:
    """``state`` as a resumed run starts from it, optionally with another budget.

    A finished run given a larger ``max_epochs`` or ``max_steps`` continues
    with the next epoch, unless it stopped early (``State.stop``): that one
    stays stopped. A ``max_steps`` already reached ends the run at once.
    See ``pimm_fn.core.budget.resumed``.

    A run resumed with its own budget from the checkpoint of its last
    step is finished, even when that checkpoint was the deferred save of
    the last epoch (written before ``AfterTrain``): no hook runs again
    (``AfterTrain`` ran, or was interrupted after the last save; as pimm
    treats a checkpoint whose epoch reached ``max_epoch``).

    Raises:
        ValueError: when ``max_epochs`` is below the epochs already trained
            (an epoch in progress counts).
    """
    resumed = budget.resumed(state, max_epochs=max_epochs, max_steps=max_steps)
    # Nothing but AfterTrain left, under the budget the checkpoint was written with: the run ended.
    closing = resumed.position == "AfterEpoch" and next_event(resumed).__class__ is ev.AfterTrain
    if closing and resumed.progress == state.progress:
        return attrs.evolve(resumed, position="AfterTrain")
    return resumed


def state_at_step(state: State, step: int) -> State:
    """``state`` moved to the point a checkpoint of global step ``step`` records.

    That point is after ``AfterStep(step)``, or after ``AfterEpoch`` when
    ``step`` ends an epoch (saves there are deferred past the epoch's hooks).
    Used to start a dry run or simulation from the middle of training.
    """
    p = state.progress
    if not 0 <= step <= p.max_steps:
        raise ValueError(f"start step must be in [0, {p.max_steps}] (got {step})")
    if step == 0:
        return state
    epoch, iter_in_epoch = divmod(step, p.iters_per_epoch)
    if iter_in_epoch == 0:
        epoch, iter_in_epoch = epoch - 1, p.iters_per_epoch
    progress = Progress(
        iters_per_epoch=p.iters_per_epoch,
        max_epochs=p.max_epochs,
        epoch=epoch,
        iter_in_epoch=iter_in_epoch,
        global_step=step,
        step_limit=p.step_limit,
    )
    return attrs.evolve(state, progress=progress, position="AfterEpoch" if progress.at_epoch_end else "AfterStep")
