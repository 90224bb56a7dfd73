"""The handlers of the control effects, and the check ``loop`` makes of hooks that use them.

``Stop`` ends training early: its handler answers with ``StopRequested``,
as ``plan`` and the simulator do, and the core's lifecycle then runs only
the closing events. ``StepScheduler`` steps the run's learning-rate
scheduler; when a hook declares that it emits it, the default train step
leaves the scheduler alone (the loop hands it ``scheduler=None``).
"""

from collections.abc import Callable
from typing import Any

from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import Effect, StepScheduler, Stop
from pimm_fn.runtime.engine.preemption import CTRL_C

__all__ = ["stop", "step_scheduler", "CONTROL_HANDLERS", "hooks_step_scheduler", "check_scheduler_hooks"]


def stop(effect: Stop, state, ctx) -> tuple:
    """Say why training stops; ``StopRequested`` makes the lifecycle close the epoch and end."""
    ctx.say(f"stopping early at step {effect.step}: {effect.reason}")
    return (ev.StopRequested(effect.step, effect.reason),)


def step_scheduler(effect: StepScheduler, state, ctx) -> tuple:
    """``ctx.scheduler.step()``, or ``.step(value)`` for a metric (``ReduceLROnPlateau``).

    Raises:
        ValueError: the run has no scheduler, or the effect and the
            scheduler disagree on whether a metric drives it.
    """
    scheduler = ctx.scheduler
    if scheduler is None:
        raise ValueError(f"{effect!r} asks to step the scheduler, but this run has none: pass scheduler= to loop()")
    plateau = isinstance(scheduler, ReduceLROnPlateau)
    if effect.metric is None:
        if plateau:
            raise ValueError(
                f"{type(scheduler).__name__} steps on a metric's value, but {effect!r} carries none: "
                f"use step_scheduler(on='<metric>')"
            )
        with CTRL_C.holding_back():  # a schedule stepped half-way cannot be retried exactly
            scheduler.step()
    else:
        if isinstance(scheduler, LRScheduler) and not plateau:
            # Its step(x) would take the value for an epoch number.
            raise ValueError(
                f"{type(scheduler).__name__} steps by count, not on a metric, but {effect!r} carries "
                f"{effect.metric!r}: use step_scheduler('step') or step_scheduler('epoch'), or a ReduceLROnPlateau"
            )
        with CTRL_C.holding_back():
            scheduler.step(effect.value)
    return ()


CONTROL_HANDLERS: dict[type[Effect], Callable[..., Any]] = {Stop: stop, StepScheduler: step_scheduler}


def hooks_step_scheduler(hooks) -> bool:
    """Whether some hook, at any depth, declares that it emits ``StepScheduler``."""
    return hook_list.emits_any(hooks, StepScheduler)


def check_scheduler_hooks(hooks, scheduler) -> None:
    """Refuse, at construction, hooks that step a scheduler the run does not have.

    Where they stand beside the savers does not matter: a save runs after
    the other effects of its event (``SaveCheckpoint.runs_last``), so the
    checkpoint of step ``k`` holds the scheduler as stepped at ``k``.

    Raises:
        ValueError: naming the hooks and the fix.
    """
    if not hooks_step_scheduler(hooks):
        return
    declared = [protocol.declared(h) for h in protocol.leaves(hooks)]
    steppers = [d for d in declared if d.may_emit(StepScheduler)]
    if scheduler is None:
        raise ValueError(
            f"loop: hook(s) {', '.join(d.key for d in steppers)} step the learning-rate scheduler, but "
            f"scheduler is None: pass scheduler=... to loop() (or drop those hooks)"
        )
