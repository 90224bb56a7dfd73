"""The state a run starts from: fresh, or the one restored from a checkpoint with this run's budget, said.

Fresh when there is no checkpoint (``resume=None``, or ``resume="auto"``
finding none: said when it starts beside best weights it will replace).
Resumed: the state ``pimm_fn.runtime.resume.restore`` put back, with this
run's budget applied to it and said on the console, and a warning when that
budget is already spent. Each warning is attributed to ``loop()``'s caller.
"""

import warnings

from pimm_fn.core.budget import budget_lines
from pimm_fn.core.plan import initial_state
from pimm_fn.core.schedule import resume_from
from pimm_fn.core.state import State
from pimm_fn.runtime import arguments
from pimm_fn.runtime.advice import ConfigurationWarning, nothing_to_train
from pimm_fn.runtime.save_dir_checks import replaced_best

__all__ = ["fresh_state", "resumed_state"]


def fresh_state(ctx, hooks, *, resume, max_epochs, max_steps, config) -> State:
    """The first state of a fresh run, its budget checked as a fresh run's."""
    arguments.check_budget(max_epochs, max_steps, fresh=True)  # resume='auto' found nothing: a fresh run
    if resume == "auto" and (said := replaced_best(ctx.save_dir)):  # said, not refused: an 'auto' restart is legal
        warnings.warn(said, ConfigurationWarning, stacklevel=3)
    return initial_state(
        hooks, iters_per_epoch=ctx.feed.iters_per_epoch, max_epochs=max_epochs, max_steps=max_steps,
        rank=ctx.rank, world_size=ctx.world_size, config=config,
    )


def resumed_state(restored: State, info, ctx, *, max_epochs, max_steps) -> State:
    """``restored`` (from the checkpoint ``info``) under this run's budget, said on the console."""
    saved, state = restored.progress, resume_from(restored, max_epochs=max_epochs, max_steps=max_steps)
    ctx.say(f"resumed from {info.path} at step {state.progress.global_step}")
    for line in budget_lines(saved, state.progress, max_steps=max_steps):
        ctx.say(line)
    if (said := nothing_to_train(state, info.path)) is not None:  # legal, pointless: said once
        warnings.warn(said, ConfigurationWarning, stacklevel=3)
    return state
