"""The lifecycle as a pure function of the state: which event comes next.

The real driver, ``plan()`` and the simulator all walk training with
``next_event`` and ``advance``, so they cannot disagree about the order of
events, and a run restored from any checkpoint continues exactly where the
saved ``State.position`` says it stopped.
"""

from pimm_fn.core import budget
from pimm_fn.core import events as ev
from pimm_fn.core.state import Progress, State, evolvers, replace, setter

__all__ = ["next_event", "advance", "resume_from", "state_at_step", "skip_to"]


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
    p = state.progress
    match state.position:  # the two per-step positions first: this runs twice a step
        case "BeforeStep":
            return ev.AfterStep(p.global_step + 1)
        case "AfterStep":
            if p.at_epoch_end or state.stop is not None:
                return ev.AfterEpoch(p.epoch)
            return ev.BeforeStep(p.global_step + 1)
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


def advance(state: State, event: ev.Event) -> State:
    """The core's own bookkeeping for ``event``, applied before the hooks see it."""
    match event:
        case ev.AfterStep():
            return evolvers[state.__class__](state, progress=stepped(state.progress, event), position="AfterStep")
        case ev.BeforeStep():
            return evolvers[state.__class__](state, position="BeforeStep")
        case ev.MetricsPublished(values=values):
            return replace(state, metrics=state.metrics.merge(values))
        case ev.StopRequested(reason=reason):
            # The first request's reason is kept: a later one changes nothing.
            return state if state.stop is not None else replace(state, stop=reason or "stop requested")
        case ev.BeforeEpoch(epoch=epoch):
            progress = replace(state.progress, epoch=epoch, iter_in_epoch=0)
            return replace(state, progress=progress, position="BeforeEpoch")
        case ev.BeforeTrain(resumed=True):
            return state
    name = type(event).__name__
    if isinstance(event, ev.LIFECYCLE):
        return replace(state, position=name)
    return state


_stepped = setter(Progress, "global_step", "iter_in_epoch", "samples_seen")
_stepped_state = setter(State, "progress", "position", "slots", "slot")


def stepped_state(state: State, progress: Progress, slots: tuple) -> State:
    """``state`` after an ``AfterStep``: its new ``progress`` and hook ``slots``, no running slot."""
    if state.__class__ is State:  # every step: the copy without keyword handling
        return _stepped_state(state, progress, "AfterStep", slots, None)
    return evolvers[state.__class__](state, progress=progress, position="AfterStep", slots=slots, slot=None)


def stepped(p: Progress, event: ev.AfterStep) -> Progress:
    """``p`` after the step of ``event``: ``advance``'s progress for an ``AfterStep``."""
    step = event.step
    if step != p.global_step + 1:
        raise ValueError(f"AfterStep(step={step}) out of order: global_step is {p.global_step}")
    if p.__class__ is Progress:  # every step: the copy without keyword handling
        return _stepped(p, step, p.iter_in_epoch + 1, p.samples_seen + event.batch_size)
    return evolvers[p.__class__](
        p, global_step=step, iter_in_epoch=p.iter_in_epoch + 1, samples_seen=p.samples_seen + event.batch_size
    )


def skip_to(state: State, step: int, *, batch_size: int = 0) -> State:
    """``state`` after ``AfterStep(step)``, reached in one jump over steps no hook is called on.

    Exactly what walking ``BeforeStep``/``AfterStep`` of each step from
    ``global_step + 1`` to ``step`` leaves, provided none of them calls a
    hook or accumulates an output: the progress moves on (``global_step``,
    ``iter_in_epoch``, and ``samples_seen`` by ``batch_size`` a step: 0 in
    ``plan`` and ``simulate``), the position is ``"AfterStep"``, the slots
    are untouched. Whether the steps are quiet is the caller's to know
    (``run_schedule`` asks the hooks' subscriptions).

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
        return state
    n = step - p.global_step
    samples = p.samples_seen + n * batch_size
    if p.__class__ is Progress:  # once per jump: the copy ``stepped`` makes, without keyword handling
        progress = _stepped(p, step, p.iter_in_epoch + n, samples)
    else:
        progress = replace(p, global_step=step, iter_in_epoch=p.iter_in_epoch + n, samples_seen=samples)
    return stepped_state(state, progress, state.slots)


def resume_from(state: State, *, max_epochs: int | None = None, max_steps: int | None = None) -> State:
    """``state`` as a resumed run starts from it, optionally with another budget.

    A finished run given a larger ``max_epochs`` or ``max_steps`` continues
    with the next epoch, unless it stopped early (``State.stop``): that one
    stays stopped. A ``max_steps`` already reached ends the run at once.
    See ``pimm_fn.core.budget.resumed``.

    Raises:
        ValueError: when ``max_epochs`` is below the epochs already trained
            (an epoch in progress counts).
    """
    return budget.resumed(state, max_epochs=max_epochs, max_steps=max_steps)


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
    return replace(state, progress=progress, position="AfterEpoch" if progress.at_epoch_end else "AfterStep")
