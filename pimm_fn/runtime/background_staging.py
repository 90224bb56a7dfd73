"""Background saves and the optimizer: staging readied after the first step, a step held until a copy is staged.

A background save copies the trainer's tensors to staging memory while
training goes on; the optimizer's step hooks are where the two meet:
``prewarm_staging`` arms a post-step hook that readies that memory once
every optimizer stepped, and ``gate_optimizers`` a pre-step hook that
makes each ``step()`` wait until the save in flight has staged its copy.
"""

from pimm_fn.checkpoint.contents import TrainerContents, to_parts
from pimm_fn.core import hook_list
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime.save_contents import replicated

__all__ = ["prewarm_staging", "gate_optimizers"]


class _Handles:
    """The step hooks registered on each of a run's optimizers, removed together."""

    def __init__(self, handles):
        self.handles = tuple(handles)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def gate_optimizers(ctx) -> None:
    """Make each optimizer's ``step()`` wait until a background save has staged its copy."""
    saver = ctx.saver
    if saver.gate is None:
        def wait_for_staging(optimizer, args, kwargs):
            saver.wait_staged()

        saver.gate = _Handles(o.register_step_pre_hook(wait_for_staging) for o in ctx.named_optimizers().values())


def prewarm_staging(ctx, hooks=None, *, pause_s: float = 0.0) -> None:
    """Ready the staging memory of background saves after the first optimizer step, when some hook saves so.

    A hook declares that it emits background saves with a true ``async_save``
    attribute (``save_every(n, async_save=True)`` does). Then, right after
    the first ``optimizer.step()`` (when the optimizer state exists), the
    keys, shapes and dtypes of the weights and trainer tensors are taken and
    a background thread allocates and writes the staging tensors, so that the
    first background save copies into ready memory instead of faulting fresh
    pages in beside the next forward and backward. Training never waits for
    it; a save arriving first takes over (``ctx.saver``, a ``pimm_fn.checkpoint.BackgroundSaver``).
    A no-op without such a hook, with the legacy format, a sharded model, or
    an optimizer that takes no step hooks. Calling it again replaces an arming that has
    not fired yet.

    Args:
        ctx: the run's :class:`~pimm_fn.runtime.context.Context`.
        hooks: hooks to look at instead of the run's (``ctx.implied``, derived once).
        pause_s: seconds the prewarm sleeps after each chunk (tests).
    """
    background = ctx.implied.saves_in_background if hooks is None else hook_list.saves_in_background(hooks)
    if ctx.checkpoint_format != "standard" or ctx.sharded or not background:
        return  # a sharded model's shards are copied apart from the staging area: nothing to ready
    optimizers = list(ctx.named_optimizers().values())
    if not all(hasattr(o, "register_step_post_hook") for o in optimizers) or ctx.saver.prewarm is not None:
        return
    saver = ctx.saver.open()
    if saver.arming is not None:
        saver.arming.remove()
    stepped = set()  # the optimizers that stepped: their state exists once all did

    def after_first_step(optimizer, args, kwargs):
        # Not removed here, while the optimizer iterates its hooks: it idles until the next save removes it.
        stepped.add(id(optimizer))
        if saver.prewarm is None and len(stepped) == len(optimizers):
            saver.prewarm = _start_prewarm(ctx, pause_s) or False

    saver.arming = _Handles(o.register_step_post_hook(after_first_step) for o in optimizers)


def _start_prewarm(ctx, pause_s: float):
    """The prewarm of what a background save of ``ctx`` stages (RNG states and cursor, a few KB, are left to the save)."""
    try:
        return ctx.saver.warm(
            weights=unwrap(ctx.model).state_dict(),
            trainer=to_parts(TrainerContents(replicated(ctx, None, background=True), None))[0],
            local={}, pause_s=pause_s
        )
    except (TypeError, ValueError):
        return None  # state the save cannot pack: the save itself reports it
