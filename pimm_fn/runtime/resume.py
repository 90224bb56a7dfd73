"""Putting a run back where a checkpoint left it.

Restores the model, optimizer, scheduler, scaler, RNG states, data cursor,
progress, hook slots and best values. On a different world size the
per-rank parts (RNG, data cursor) cannot be restored: the interrupted epoch
restarts from its first batch, with a warning, or an error under ``strict``.

Hook slots come back by hook identity (``pimm_fn.core.slots``): the run may
list its hooks in another order, add hooks (they start from their initial
slot) or leave some out (their slots are dropped, with a console line). A
hook whose saved slot no longer fits it is a ``ResumeError`` naming it.
"""

import warnings

import attrs

from pimm_fn import checkpoint
from pimm_fn.checkpoint.contents import SavedState, from_parts
from pimm_fn.core.slots import SlotMismatch
from pimm_fn.core.state import State
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime.feed import ResumeNotExactWarning
from pimm_fn.runtime.rng import restore_rng

__all__ = ["locate", "restore", "ResumeError"]


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed as asked."""


def locate(resume, save_dir):
    """The checkpoint to resume from, or ``None`` for a fresh start.

    Raises:
        FileExistsError: a fresh start into a ``save_dir`` that holds checkpoints.
    """
    if resume is None or resume is False:
        if save_dir is not None and checkpoint.latest_checkpoint(save_dir / "model") is not None:
            raise FileExistsError(
                f"save_dir {str(save_dir)!r} already holds checkpoints; a fresh run would overwrite them. "
                f"Pass resume='auto' to continue that run, or choose another save_dir"
            )
        return None
    if resume == "auto":
        if save_dir is None:
            raise ValueError("resume='auto' needs save_dir= to look for checkpoints in")
        return checkpoint.latest_checkpoint(save_dir / "model")
    return checkpoint.find_checkpoint(resume)


def _with_slots(saved: SavedState, hooks, info) -> tuple[State, tuple[str, ...]]:
    """The saved state with the slots of ``hooks``, and the saved keys no hook claimed."""
    try:
        return saved.restored(hooks)
    except SlotMismatch as exc:
        raise ResumeError(f"cannot resume from {info.path}: {exc}") from None


def _contents(loaded, info):
    try:
        return from_parts(loaded.trainer, loaded.local)
    except ValueError as exc:
        raise ResumeError(f"cannot resume from {info.path}: {exc}") from None


def restore(info, ctx, hooks, *, strict=False) -> State:
    """Load ``info`` into ``ctx``'s objects and return the state to continue from.

    Everything that can refuse the resume is checked before the model,
    optimizer or RNG is touched, so a refused resume changes nothing.

    Raises:
        ResumeError: a hook's saved slot no longer fits it (naming the hook,
            the slot type found and the one expected); a checkpoint written
            before slots were keyed, by another number of hooks; a resume on
            another world size mid-epoch under ``strict``.
    """
    loaded = checkpoint.load_checkpoint(info)
    held = _contents(loaded, info)
    same_world = info.world_size == ctx.world_size and held.local is not None
    saved, dropped = _with_slots(held.local.state if same_world else held.replicated.state, hooks, info)
    if not same_world and strict and _mid_epoch(saved):
        raise ResumeError(_world_message(info, ctx) + "; resume with the same world size, or pass strict_resume=False")
    unwrap(ctx.model).load_state_dict(loaded.weights)
    replicated = held.replicated
    ctx.optimizer.load_state_dict(replicated.optimizer)
    for name in ("scheduler", "scaler"):
        target, stored = getattr(ctx, name), getattr(replicated, name)
        if target is not None and stored is not None:
            target.load_state_dict(stored)
    if dropped:
        ctx.say(_dropped_message(dropped))
    state = attrs.evolve(saved, rank=ctx.rank, world_size=ctx.world_size)
    p = state.progress
    if same_world:
        restore_rng(held.local.rng)
        ctx.feed.resume(held.local.cursor, p.epoch, p.iter_in_epoch)
    else:
        state = _restart_epoch(state, ctx, info)
    if ctx.feed.iters_per_epoch != state.progress.iters_per_epoch:
        state = attrs.evolve(state, progress=attrs.evolve(state.progress, iters_per_epoch=ctx.feed.iters_per_epoch))
    return state


def _dropped_message(dropped) -> str:
    names = ", ".join(repr(k) for k in dropped)
    return (
        f"dropped the checkpointed slot(s) of {names}: no hook of this run has that identity "
        f"(a hook whose arguments changed has a new one, and starts fresh)"
    )


def _mid_epoch(state: State) -> bool:
    return state.position in ("BeforeEpoch", "BeforeStep", "AfterStep") and not state.progress.at_epoch_end


def _world_message(info, ctx) -> str:
    return (
        f"checkpoint of step {info.step} was written by {info.world_size} rank(s), this run has "
        f"{ctx.world_size}: per-rank RNG states and data positions cannot carry over"
    )


def _restart_epoch(state, ctx, info) -> State:
    if not _mid_epoch(state):
        return state
    p = state.progress
    message = _world_message(info, ctx) + f"; epoch {p.epoch} restarts from its first batch"
    warnings.warn(message, ResumeNotExactWarning, stacklevel=4)
    ctx.feed.start_epoch(p.epoch)
    progress = attrs.evolve(p, iter_in_epoch=0, iters_per_epoch=ctx.feed.iters_per_epoch)
    return attrs.evolve(state, progress=progress, position="BeforeEpoch")
