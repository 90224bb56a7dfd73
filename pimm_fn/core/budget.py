"""The training budget: ``max_epochs`` epochs, or ``max_steps`` global steps.

A run trains either a number of epochs or a number of global steps
(``loop(max_steps=N)``, ``plan(..., max_steps=N)``, ``simulate(...,
max_steps=N)``), never both. With steps, ``Progress.step_limit`` holds ``N``
and one rule decides the end: the epoch in progress at global step ``N``
ends there, as if it were its last step (its ``AfterEpoch`` runs and a save
falling on step ``N`` is deferred past it, as at any epoch end), then
``AfterTrain`` follows, as after a stop. ``max_epochs`` only counts the
epochs that reach step ``N`` (the last one cut short); it is recomputed when
the epoch's length changes (a resume on another world size), while
``global_step`` alone says where training ends.

A resume keeps or changes the budget (``resumed``): a larger ``max_steps``
extends a finished run, going on with the next epoch when the cut one
already closed; a ``max_steps`` the checkpoint already reached ends the run
at once, where it is.
"""

import math
from typing import cast

import attrs

from pimm_fn.core.state import Progress, State

__all__ = ["check_budget", "fresh_progress", "epochs_reaching", "resumed", "budget_lines"]


def _int(caller: str, name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{caller}: '{name}' must be an int >= {least} (got {value!r:.80})")


def check_budget(max_epochs: int | None, max_steps: int | None, *, caller: str, min_epochs: int = 0) -> None:
    """Exactly one budget is given, and it is an int in range: a run must know when it ends.

    Raises:
        TypeError: both or neither of ``max_epochs`` and ``max_steps``.
        ValueError: ``max_epochs < min_epochs`` or ``max_steps < 1``.

    >>> check_budget(3, 100, caller="plan")
    Traceback (most recent call last):
    TypeError: plan: pass exactly one of max_epochs= (epochs to train) and max_steps= (global steps to train); got both
    """
    if (max_epochs is None) == (max_steps is None):
        got = "both" if max_steps is not None else "neither"
        raise TypeError(
            f"{caller}: pass exactly one of max_epochs= (epochs to train) and max_steps= (global steps to train); "
            f"got {got}"
        )
    if max_steps is None:
        _int(caller, "max_epochs", max_epochs, min_epochs)
    else:
        _int(caller, "max_steps", max_steps, 1)


def fresh_progress(iters_per_epoch: int, *, max_epochs: int | None = None, max_steps: int | None = None) -> Progress:
    """The progress a fresh run of either budget starts from.

    >>> fresh_progress(10, max_steps=25)
    Progress(iters_per_epoch=10, max_epochs=3, epoch=0, iter_in_epoch=0, global_step=0, samples_seen=0, step_limit=25)
    """
    if max_steps is None:
        # Without max_steps, max_epochs is given: check_budget saw to that.
        return Progress(iters_per_epoch=iters_per_epoch, max_epochs=cast(int, max_epochs))
    return Progress(
        iters_per_epoch=iters_per_epoch, max_epochs=math.ceil(max_steps / iters_per_epoch), step_limit=max_steps
    )


def epochs_reaching(state: State) -> int:
    """How many epochs (counted from the first) a step-limited ``state`` begins before its step budget is spent.

    The current epoch counts while it is open; one that already closed
    (``AfterEpoch`` ran, as when a cut epoch ended a run) does not leave
    steps to take, so the budget's rest falls to the epochs after it.

    >>> epochs_reaching(State(Progress(10, 3, epoch=2, iter_in_epoch=5, global_step=25, step_limit=50),
    ...                       position="AfterTrain"))
    6
    """
    p = state.progress
    closed = state.position in ("AfterEpoch", "AfterTrain")
    # Step-limited: the caller's promise, so step_limit is an int.
    rest = cast(int, p.step_limit) - p.global_step - (0 if closed else p.iters_per_epoch - p.iter_in_epoch)
    return p.epoch + 1 + max(math.ceil(rest / p.iters_per_epoch), 0)


def _with_limit(state: State, limit: int) -> State:
    """``state`` budgeted to global step ``limit``, its ``max_epochs`` reaching it."""
    p = state.progress
    epochs = epochs_reaching(attrs.evolve(state, progress=attrs.evolve(p, step_limit=limit)))
    if (p.step_limit, p.max_epochs) == (limit, epochs):
        return state
    return attrs.evolve(state, progress=attrs.evolve(p, step_limit=limit, max_epochs=epochs))


def _reopened(state: State) -> State:
    """A finished run given more budget goes on after its last epoch (one that stopped early closes at once)."""
    if not state.finished or state.progress.steps_left == 0:
        return state
    return attrs.evolve(state, position="AfterEpoch")  # its last epoch closed, even a cut one: the next one begins


def _epochs_done(state: State) -> int:
    """Epochs trained or begun: an epoch in progress counts, resuming would finish it."""
    p = state.progress
    started = p.iter_in_epoch > 0 or state.position in ("BeforeEpoch", "BeforeStep")
    return p.epoch + (1 if started else 0)


def resumed(state: State, *, max_epochs: int | None = None, max_steps: int | None = None) -> State:
    """``state`` as a resumed run starts from it, under the budget given (``None``, ``None``: its own).

    ``max_epochs`` makes (or keeps) an epoch budget and ``max_steps`` a step
    budget, whichever the checkpoint had. More budget continues a finished
    run with the next epoch, unless it stopped early (``State.stop``). A
    ``max_steps`` already reached ends the run at once where it is: its
    budget becomes the steps taken (and the step begun, if one is).

    Raises:
        ValueError: when ``max_epochs`` is below the epochs already trained
            or begun.
    """
    p = state.progress
    if max_steps is not None:
        floor = p.global_step + (1 if state.position == "BeforeStep" else 0)
        return _reopened(_with_limit(state, max(max_steps, floor)))
    if max_epochs is None or (max_epochs == p.max_epochs and p.step_limit is None):
        return state
    done = _epochs_done(state)
    if max_epochs < done:
        raise ValueError(
            f"max_epochs={max_epochs} is below the {done} epoch(s) this checkpoint already trained or began: "
            f"pass max_epochs >= {done}"
        )
    progress = attrs.evolve(p, max_epochs=max_epochs, step_limit=None)
    return _reopened(attrs.evolve(state, progress=progress))


def budget_lines(before: Progress, after: Progress, *, max_steps: int | None = None) -> tuple[str, ...]:
    """Console lines saying how a resume changed the budget of the checkpoint ``before`` into ``after``.

    >>> budget_lines(Progress(10, 3, global_step=25, step_limit=25), Progress(10, 5, global_step=25, step_limit=50))
    ('max_steps 25 -> max_steps 50: training goes on to step 50',)
    """

    def said(p: Progress) -> str:
        return f"max_steps {p.step_limit}" if p.step_limit is not None else f"max_epochs {p.max_epochs}"

    if max_steps is not None and after.step_limit != max_steps:
        return (
            f"max_steps={max_steps} was already reached: this checkpoint is at step {after.global_step}, "
            f"so training ends at once",
        )
    if said(before) == said(after):
        return ()
    if after.step_limit is not None:
        return (f"{said(before)} -> {said(after)}: training goes on to step {after.step_limit}",)
    return (f"{said(before)} -> {said(after)}: training goes on for {after.max_epochs} epoch(s) in all",)
