"""What a save of the live run holds: its trainer contents and its weights file, read off the run's context.

The ``save_checkpoint`` handler (``pimm_fn.runtime.handlers``) and the
staging prewarm (``pimm_fn.runtime.background_staging``) build a
checkpoint's contents here, so both number the same tensors the same way.
"""

from pimm_fn import dist
from pimm_fn.checkpoint import sharded
from pimm_fn.checkpoint.contents import PerRank, Replicated, TrainerContents, saved_state, to_parts
from pimm_fn.runtime.class_change import recorded
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime.ema import EmaWeights
from pimm_fn.runtime.rng import capture_rng

__all__ = ["trainer_state", "trainer_contents", "replicated", "saved_weights", "weights_for_background"]


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


def trainer_contents(ctx, state, *, background: bool = False) -> TrainerContents:
    """The ``TrainerContents`` of a checkpoint of ``state``; a sharded model's shards in its ``sharded``.

    ``background``: for a save that copies the tensors later (``async_save``).
    """
    own = saved_state(state, ctx.hooks)
    local = PerRank(own, capture_rng(), ctx.feed.state_dict())
    shards, optimizer = sharded.state(unwrap(ctx.model), ctx.optimizer) if ctx.sharded else (None, None)
    return TrainerContents(replicated(ctx, dist.broadcast_object(own), optimizer, background=background), local, shards)


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
    return {k: v if not hasattr(v, "data_ptr") or v.data_ptr() in params else v.clone()
            for k, v in module.state_dict().items()}
