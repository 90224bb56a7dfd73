"""The handlers of ``SaveCheckpoint`` and ``WriteBest`` (``pimm_fn.hooks.checkpointing``), and what a save of the
live run holds.

A handler is ``handler(effect, state, ctx) -> follow-up events``; it is the
only code that touches files, process groups, the console and the model.

What a save holds, its trainer contents and its weights, is read off the
run's context here, by ``save_checkpoint`` and by the staging prewarm alike,
so both number the same tensors the same way.

A background save copies the trainer's tensors to staging memory while
training goes on; the optimizer's step hooks are where the two meet:
``prewarm_staging`` arms a post-step hook that readies that memory once
every optimizer stepped, and ``gate_optimizers`` a pre-step hook that
makes each ``step()`` wait until the save in flight has staged its copy.
"""

from pimm_fn import checkpoint, dist
from pimm_fn.checkpoint.contents import PerRank, Replicated, TrainerContents, saved_state, to_parts
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.checkpoint.saving import save_run
from pimm_fn.core import hook_list
from pimm_fn.core.effects import SaveCheckpoint, WriteBest
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.handlers.ema import EmaWeights
from pimm_fn.runtime.resume.checks import recorded
from pimm_fn.runtime.step.rng import capture_rng

__all__ = [
    "save_checkpoint",
    "write_best",
    "trainer_state",
    "trainer_contents",
    "replicated",
    "saved_weights",
    "weights_for_background",
    "prewarm_staging",
    "gate_optimizers",
]


def trainer_state(ctx, state) -> tuple[dict, dict]:
    """(replicated, rank-local) parts of a checkpoint of ``state``, as ``save_checkpoint`` takes them.

    Built as a ``pimm_fn.checkpoint.contents.TrainerContents``: the
    replicated part carries the main rank's ``State`` so a resume on a
    different world size starts from the agreed values; each rank's own
    ``State``, RNG and data cursor go in its local part. Hook slots are kept
    by the identity of ``ctx.hooks`` (by position when the context was built
    without them, and a resume then needs the same hook list).
    """
    return to_parts(trainer_contents(ctx, state))


def trainer_contents(ctx, state, *, background: bool = False, agree: bool = True) -> TrainerContents:
    """The ``TrainerContents`` of a checkpoint of ``state``; a sharded model's shards in its ``sharded``.

    ``background``: for a save that copies the tensors later (``async_save``).
    ``agree``: the replicated part holds the main rank's ``State``, broadcast
    (collective); ``False``: this rank's own, and no collective (a state sent
    to one peer, ``pimm_fn.runtime.replicas.heal``).
    """
    own = saved_state(state, ctx.hooks)
    local = PerRank(own, capture_rng(), ctx.feed.state_dict())
    shards, optimizer = sharded.state(unwrap(ctx.model), ctx.optimizer) if ctx.sharded else (None, None)
    agreed = dist.broadcast_object(own) if agree else own
    return TrainerContents(replicated(ctx, agreed, optimizer, background=background), local, shards)


def replicated(ctx, agreed, optimizer=None, *, background=False) -> Replicated:
    """The replicated part of a save of ``ctx``, with ``agreed`` (the main rank's ``State``) as its state."""
    # One function for the save and the prewarm: the same tree numbers its tensors the same way.
    several = ctx.optimizers is not None
    return Replicated(
        optimizer=None if several else ctx.optimizer.state_dict() if optimizer is None else optimizer,
        scheduler=ctx.scheduler.state_dict() if ctx.scheduler is not None else None,
        scaler=ctx.scaler.state_dict() if ctx.scaler is not None else None,
        state=agreed,
        sharded=optimizer is not None,
        optimizers={name: o.state_dict() for name, o in ctx.optimizers.items()} if several else None,
        extra={name: _extra_state(obj, background) for name, obj in ctx.extra_state.items()},
        classes=recorded(ctx),
    )


def _extra_state(obj, background: bool) -> dict:
    """``obj.state_dict()``; for a background save, its tensors copied now (what changes them does not wait)."""
    state = obj.state_dict()
    if not background or isinstance(obj, EmaWeights):  # an average's update waits for the staging (update_ema)
        return state
    return _cloned(state)


def _cloned(tree):
    if hasattr(tree, "clone") and hasattr(tree, "data_ptr"):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _cloned(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cloned(v) for v in tree)
    return tree


def saved_weights(ctx) -> dict | None:
    """The weights file's contents: a sharded model's gathered to rank 0 (collective), or ``None`` when skipped."""
    if not ctx.sharded:
        return ctx.weights()
    return sharded.full_weights(unwrap(ctx.model)) if ctx.weights_file else None


def weights_for_background(ctx) -> dict:
    """The weights, with every non-parameter tensor (BatchNorm statistics)
    copied now: the next forward changes those in place, before any
    optimizer step could wait for the background copy."""
    module = unwrap(ctx.model)
    params = {p.data_ptr() for p in module.parameters()}
    return {
        k: v if not hasattr(v, "data_ptr") or v.data_ptr() in params else v.clone()
        for k, v in module.state_dict().items()
    }


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
        ctx: the run's :class:`~pimm_fn.runtime.engine.interpreter.Context`.
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
            local={},
            pause_s=pause_s,
        )
    except (TypeError, ValueError):
        return None  # state the save cannot pack: the save itself reports it


def save_checkpoint(effect: SaveCheckpoint, state, ctx) -> tuple:
    """Read what the save holds off the run, and hand it to ``checkpoint.saving.save_run`` in one call (a background one too)."""
    saver = ctx.saver
    saver.wait()  # never two saves in flight
    if saver.prewarm is not None and saver.arming is not None:  # it fired: off the optimizer, now that it is idle
        saver.arming.remove()
        saver.arming = None
    background = effect.async_save and ctx.checkpoint_format == "standard"
    contents = trainer_contents(ctx, state, background=background)
    if background:
        gate_optimizers(ctx)  # each optimizer step waits until the save has staged its copy
    info = save_run(
        ctx.model_dir,
        effect.step,
        contents,
        weights_for_background(ctx) if background and not ctx.sharded else saved_weights(ctx),
        background=saver if background else None,
        format=ctx.checkpoint_format,
        snapshot=effect.snapshot,
        keep=ctx.keep,
        metrics=state.metrics,  # recorded in the marker: what keep_best ranks snapshots by
        digests=ctx.digests,
        saved_for=effect.saved_for,  # a preemption save (pimm_fn.runtime.engine.preemption): its marker says why
    )
    if info is None:
        ctx.say(f"saving checkpoint of step {effect.step} to {ctx.model_dir} in the background")
    else:
        ctx.say(f"saved checkpoint of step {effect.step} to {info.path}")
    return ()


def write_best(effect: WriteBest, state, ctx) -> tuple:
    """Rank 0 writes; a sharded model's weights are gathered first, by every rank (see ``Context.everywhere``)."""
    if effect.weights is not None:  # the average that was evaluated (not for sharded models: loop refuses ema)
        weights = ctx.extra_state[effect.weights].weights_of(unwrap(ctx.model))
    else:
        weights = sharded.full_weights(unwrap(ctx.model)) if ctx.sharded else ctx.weights()
    if ctx.rank != 0:
        return ()
    path = checkpoint.write_best(
        ctx.model_dir,
        weights,
        metric=effect.metric,
        value=effect.value,
        step=effect.step,
        per_metric=ctx.best_per_metric,
        digests=ctx.digests,
    )
    ctx.say(f"new best {effect.metric}={effect.value:.6g} at step {effect.step}: wrote {path}")
    return ()
