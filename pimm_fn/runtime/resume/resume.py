"""Resuming: which checkpoint a run resumes from (or a fresh start), and putting the run back where it left off.

``loop(resume=...)`` takes ``None`` (fresh), ``"auto"`` or a path. pimm_fn's
own checkpoints are found and read by ``pimm_fn.checkpoint.discovery``. Another
library's layout is resumed only through a reader the run was handed with
its handlers (``pimm_fn.checkpoint.discovery``; ``pimm_fn.compat.HANDLERS``
holds pimm's), and looked for only where pimm_fn's own discovery found
nothing of its own: a run given no reader, or whose ``save_dir`` holds
pimm_fn checkpoints, never looks, and never pays a collective for it.
A fresh start is refused where its first save would replace a checkpoint:
one of ours, one a reader recognises, or a ``last/`` that is no pimm_fn
checkpoint at all (another library's, read or not).

Putting a run back where a checkpoint left it.

Restores the model, optimizer, scheduler, scaler, RNG states, data cursor,
progress, hook slots and best values.

On a different world size, or another number of steps per epoch, the
interrupted epoch continues by samples consumed where the data can be
positioned, else restarts from its first batch (``ResumeNotExactWarning``
either way; under ``strict`` a restart on another world size is a
``ResumeError``): ``pimm_fn.runtime.data.positioning`` says the rule.

The optimizer's hyper-parameters as this run built them are compared with
the checkpoint's (``pimm_fn.runtime.resume.checks``): each difference is
said once (a console line and a ``ConfigurationWarning``), and
``resume_hyperparameters`` chooses which wins: ``"checkpoint"`` (default)
or ``"new"``. A run of several named optimizers (``loop(optimizer={name: opt})``)
resumes only from a checkpoint of the same names (else a ``ResumeError``),
each optimizer from its own state, its differences said under its name.
An optimizer or scheduler of another class than the checkpoint's
(``pimm_fn.runtime.resume.checks``) is a ``ResumeError`` naming both, before
anything is loaded; under ``"new"`` that object starts fresh instead (its
state not loaded, said on the console), and the rest resumes.

Extra state (``loop(training=Training(extra_state=))``, the ``ema`` averages) comes back by
name, like hook slots: a name the checkpoint lacks keeps the object as this
run built it, a saved name this run lacks is dropped; each with a console line.

Hook slots come back by hook identity (``pimm_fn.core.slots``): the run may
list its hooks in another order, add hooks (they start from their initial
slot) or leave some out (their slots are dropped, with a console line). A
hook whose saved slot no longer fits it is a ``ResumeError`` naming it.

The state a run starts from: fresh, or the one restored from a checkpoint with this run's budget, said.

Fresh when there is no checkpoint (``resume=None``, or ``resume="auto"``
finding none: said when it starts beside best weights it will replace).
Resumed: the state ``pimm_fn.runtime.resume.resume.restore`` put back, with this
run's budget applied to it and said on the console, and a warning when that
budget is already spent. Each warning is attributed to ``loop()``'s caller.
"""

from __future__ import annotations

import pathlib
import warnings

import attrs
from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn import checkpoint, dist
from pimm_fn.checkpoint import discovery, inspection, storage
from pimm_fn.checkpoint.contents import SavedState, from_parts
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.core.budget import budget_lines
from pimm_fn.core.plan import initial_state
from pimm_fn.core.schedule import resume_from
from pimm_fn.core.slots import SlotMismatch
from pimm_fn.core.state import State
from pimm_fn.hooks.progress import BAR_KEY
from pimm_fn.runtime.data import positioning
from pimm_fn.runtime.engine import arguments
from pimm_fn.runtime.engine.arguments import replaced_best
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.errors import ConfigurationWarning, ResumeError, nothing_to_train
from pimm_fn.runtime.resume import checks
from pimm_fn.runtime.resume.checks import changed_classes, check_optimizers, check_sharding, check_weights, rng_error
from pimm_fn.runtime.step.rng import restore_rng

__all__ = [
    "locate",
    "restore",
    "fresh_state",
    "resumed_state",
]


def locate(resume, save_dir, *, say=None, iters_per_epoch=None, readers=()):
    """The checkpoint to resume from, read on every rank (``pimm_fn.checkpoint.discovery``), or ``None`` for a fresh start.

    ``resume="auto"`` takes the newest checkpoint that validates and reads
    back on every rank, skipping damaged ones with a line each (``say``,
    default: printed by rank 0). It starts fresh only when ``save_dir/model``
    holds no checkpoint, saying ``no checkpoint in <dir>: starting fresh``
    (a mistyped ``save_dir`` shows there); checkpoints that are all damaged
    are refused, never replaced.

    ``readers``: readers of other layouts (``pimm_fn.checkpoint.discovery.readers``
    of the run's handlers). Where pimm_fn's discovery finds nothing of its
    own, rank 0 asks them about ``resume`` (``"auto"``: ``save_dir/model``),
    and a checkpoint one recognises is translated and resumed.
    ``iters_per_epoch``: the run's steps per epoch, handed to the reader
    (pimm's legacy ``model_last.pth`` records none of its own).

    Raises:
        FileExistsError: a fresh start into a ``save_dir`` that holds checkpoints (a reader's included).
        CheckpointError: (on every rank) ``resume=<path>`` names a damaged
            checkpoint, or ``resume="auto"`` found checkpoints and none intact
            (``pimm_fn.checkpoint.errors.NoIntactCheckpointError``, naming each
            and why); nothing under ``save_dir`` was changed.
    """
    say = say or _say
    readers = tuple(readers)
    model_dir = storage.location(save_dir) / "model" if save_dir is not None else None  # a URL: on its store
    if resume is None or resume is False:
        _refuse_checkpoints_in(save_dir, model_dir, readers)
        return None
    if resume == "auto":
        if save_dir is None:
            raise ValueError("resume='auto' needs save_dir= to look for checkpoints in")
        return _newest(model_dir, readers, say, iters_per_epoch)
    return _at(resume, model_dir, readers, say, iters_per_epoch)


def _say(message: str) -> None:
    if dist.is_main():
        print(f"[pimm_fn] {message}", flush=True)


def _refuse_checkpoints_in(save_dir, model_dir, readers) -> None:
    """A fresh start refused where its first save would replace a checkpoint (one look, on rank 0, shared)."""
    if model_dir is not None:
        refusal = dist.run_on_main(lambda: _refusal(save_dir, model_dir, readers))
        if refusal is not None:
            raise FileExistsError(refusal)


def _refusal(save_dir, model_dir: pathlib.Path, readers) -> str | None:
    """Why a fresh run may not start in ``model_dir`` (local), or ``None``.

    It holds a usable checkpoint of ours; or one a reader recognises; or,
    where a save of ours would go (``last/``), a directory that is no
    checkpoint of ours at all: another library's, which the run could not read.
    """
    listing = discovery.candidates(model_dir)
    again = "a fresh run would overwrite them. Pass resume='auto' to continue that run, or choose another save_dir"
    if any(c.info is not None for c in listing):
        return f"save_dir {str(save_dir)!r} already holds checkpoints; {again}"
    found = discovery.recognised(readers, model_dir) if readers and model_dir.is_dir() else None
    if found is not None:
        index, path = found
        return f"save_dir {str(save_dir)!r} already holds {readers[index].name} checkpoints ({path.name}); {again}"
    strangers = [c.path.name for c in listing if c.path.is_dir() and not inspection.is_checkpoint_dir(c.path)]
    if strangers:
        return (
            f"save_dir {str(save_dir)!r} holds {', '.join(strangers)} in model/, which is not a pimm_fn checkpoint "
            f"(another library's?); a fresh run would overwrite it. Pass the handlers of the plug-in that reads "
            f"it (pimm's: handlers=pimm_fn.compat.HANDLERS) with resume='auto', or choose another save_dir"
        )
    return None


def _newest(model_dir, readers, say, iters_per_epoch):
    """``discovery.newest_readable``; where it finds nothing of ours, a checkpoint a reader recognises in ``model_dir``.

    Nothing of ours: no checkpoint at all, or none intact (another layout's
    ``last/`` is a candidate that does not validate as ours).
    """
    if not readers:
        return discovery.newest_readable(model_dir, say)
    held: list[str] = []  # its lines, said once we know whether they are true ('starting fresh', 'skipped')
    chosen, refused = None, None
    try:
        chosen = discovery.newest_readable(model_dir, held.append)
    except discovery.NoIntactCheckpointError as exc:
        refused = exc
    except BaseException:
        _say_all(say, held)
        raise
    if chosen is None:
        found = dist.run_on_main(lambda: discovery.recognised(readers, model_dir))
        if found is not None:
            return _translated(readers, found, model_dir, say, iters_per_epoch)
    _say_all(say, held)
    if refused is not None:
        raise refused
    return chosen


def _at(path, model_dir, readers, say, iters_per_epoch):
    """``discovery.read_agreed(path)``; where ``path`` is not one of ours, a checkpoint a reader recognises there."""
    try:
        return discovery.read_agreed(path)
    except (FileNotFoundError, checkpoint.CheckpointError):  # raised on every rank alike
        found = dist.run_on_main(lambda: discovery.recognised(readers, path)) if readers else None
        if found is None:
            raise
    return _translated(readers, found, model_dir, say, iters_per_epoch)


def _say_all(say, lines) -> None:
    for line in lines:
        say(line)


def _translated(readers, found, model_dir, say, iters_per_epoch):
    """The checkpoint of ours the reader that recognised ``found`` writes from it (collective)."""
    index, path = found
    return readers[index].resume_from(path, model_dir, iters_per_epoch=iters_per_epoch, say=say)


def _with_slots(saved: SavedState, hooks, info) -> tuple[State, tuple[str, ...]]:
    """The saved state with the slots of ``hooks``, and the saved keys no hook claimed."""
    try:
        return saved.restored(hooks)
    except SlotMismatch as exc:
        raise ResumeError(f"cannot resume from {info.path}: {exc}") from None


def _contents(loaded, info):
    """The checkpoint's contents, decoded (RNG states checked) on every rank; one rank's refusal raised on all.

    The per-rank part differs by rank: a refusal on one rank alone would leave the others waiting in a collective.
    """
    try:
        held, problem = from_parts(loaded.trainer, loaded.local), None
    except ValueError as exc:
        held, problem = None, ResumeError(f"cannot resume from {info.path}: {exc}")
    problem = problem or rng_error(held.local, info)
    problems = [p for p in dist.all_gather_object(problem) if p is not None]  # every rank's, on every rank
    if problems:
        raise problem or problems[0]
    return held


def restore(info, ctx, hooks, *, strict=False, hyperparameters="checkpoint") -> State:
    """Load ``info`` into ``ctx``'s objects and return the state to continue from.

    Everything that can refuse the resume is checked before the model,
    optimizer or RNG is touched, so a refused resume changes nothing.

    Args:
        strict: refuse a resume on another world size whose interrupted epoch
            cannot be positioned (it would restart from its first batch).
        hyperparameters: ``"checkpoint"`` or ``"new"``: whose optimizer
            hyper-parameters win where they differ (each difference is said);
            under ``"new"`` an optimizer or scheduler of another class than
            the checkpoint's starts fresh (said), else it is refused.

    Warns:
        ResumeNotExactWarning: another world size (per-rank RNG states do not
            carry over; the epoch continues by samples, or restarts, saying
            why); another number of steps per epoch (see above).
        ConfigurationWarning: an optimizer hyper-parameter differs from the checkpoint's.

    Raises:
        ResumeError: a hook's saved slot no longer fits it (naming the hook,
            the slot type found and the one expected); a checkpoint written
            before slots were keyed, by another number of hooks; a resume on
            another world size whose epoch would restart, under ``strict``;
            an optimizer or scheduler of another class than the checkpoint's
            (naming both), unless ``hyperparameters="new"``.
    """
    loaded = info.loaded if isinstance(info, discovery.Chosen) else None  # read by locate, on every rank
    loaded = loaded or checkpoint.load_checkpoint(info, weights=not ctx.sharded)  # shards load apart, below
    held = _contents(loaded, info)
    check_sharding(held.replicated, ctx, info)
    same_world = info.world_size == ctx.world_size and held.local is not None
    saved, dropped = _with_slots(held.local.state if same_world else held.replicated.state, hooks, info)
    cursor = None if same_world else positioning.main_cursor(held)
    offset, why = (None, "") if same_world else positioning.world_offset(saved.progress, ctx, info, cursor)
    if not same_world and strict and positioning.mid_epoch(saved) and offset is None:
        raise ResumeError(
            positioning.world_message(info, ctx)
            + f"; {why}, so epoch {saved.progress.epoch} would restart from its first "
            f"batch: resume with the same world size, or pass resuming=pimm_fn.Resuming(strict_resume=False)"
        )
    replicated = held.replicated
    if loaded.weights is not None and not replicated.sharded:  # a sharded checkpoint's shards are checked by DCP
        check_weights(unwrap(ctx.model), loaded.weights, info)
    check_optimizers(replicated, ctx, info)
    fresh = changed_classes(replicated, ctx, info, hyperparameters)  # started fresh under "new", else refused
    fresh_scheduler = any(c.what == "scheduler" for c in fresh)
    horizon = checks.horizon_problem(ctx.scheduler, None if fresh_scheduler else replicated.scheduler, info.path)
    if horizon is not None:  # a scheduler horizon the run outgrew
        raise ResumeError(f"cannot resume from {info.path}: {horizon}")
    built = {name: checks.hyperparameters(o) for name, o in ctx.named_optimizers().items()}
    _load_model_and_optimizer(loaded, checks.fresh_states(replicated, fresh, ctx), ctx, info)
    for name in ("scheduler", "scaler"):
        target, stored = getattr(ctx, name), getattr(replicated, name)
        if target is not None and stored is not None and not (name == "scheduler" and fresh_scheduler):
            target.load_state_dict(stored)
        elif (target is None) != (stored is None):  # one side only: said, as any change since the checkpoint
            ctx.say(
                f"the checkpoint {info.path} holds no {name} state: this run's {name} starts fresh"
                if stored is None
                else f"dropped the checkpoint's {name} state: this run has no {name}"
            )
    if fresh_scheduler:
        for name, optimizer in ctx.named_optimizers().items():
            checks.restart_schedule(optimizer, built[name], ctx.scheduler)
    for c in fresh:
        ctx.say(checks.fresh_line(c, info.path))
    _settle_hyperparameters(ctx, built, hyperparameters)
    _restore_extra(replicated, ctx)
    dropped = tuple(k for k in dropped if k != BAR_KEY)  # the progress bar's empty slot: shown or not, nothing lost
    if dropped:
        ctx.say(_dropped_message(dropped))
    state = attrs.evolve(saved, rank=ctx.rank, world_size=ctx.world_size)
    p = state.progress
    dealing = ctx.feed.dealer is not None  # the dealer's cursor positions the epoch, each quorum sizes it
    if not same_world:
        state = positioning.new_world(state, ctx, info, offset, why, cursor)
    elif not dealing and positioning.dealt(held.local.cursor) is not None:  # written dealing, read plainly
        restore_rng(held.local.rng)
        state = positioning.dealt_rest(state, ctx, info, held.local.cursor)
    elif dealing or ctx.feed.iters_per_epoch == p.iters_per_epoch:
        restore_rng(held.local.rng)
        ctx.feed.resume(held.local.cursor, p.epoch, p.iter_in_epoch)
    else:
        restore_rng(held.local.rng)
        state = positioning.new_epoch_length(state, ctx, info, held.local.cursor)
    resized_by_quorum = dealing and same_world  # its length left as saved: the first quorum sizes it
    if not resized_by_quorum and ctx.feed.iters_per_epoch != state.progress.iters_per_epoch:
        state = attrs.evolve(state, progress=attrs.evolve(state.progress, iters_per_epoch=ctx.feed.iters_per_epoch))
    return state


def _load_model_and_optimizer(loaded, replicated, ctx, info) -> None:
    """A sharded checkpoint's shards through DCP (any world size or sharding); else the optimizer(s), then the weights.

    The optimizers load first: ``Optimizer.load_state_dict`` changes nothing
    when it refuses a state, so a refusal leaves the run as it was built.
    """
    if replicated.sharded:
        try:
            sharded.load_into(info.path, unwrap(ctx.model), ctx.optimizer, replicated.optimizer)
        except CheckpointException as exc:  # a BaseException: said as the damaged checkpoint it is, on every rank
            raise sharded.shards_error(info.path, exc) from None
        return
    states = {None: replicated.optimizer} if ctx.optimizers is None else replicated.optimizers
    for name, optimizer in ctx.named_optimizers().items():
        _load_optimizer(optimizer, states[name], name, info)
    unwrap(ctx.model).load_state_dict(loaded.weights)


def _load_optimizer(optimizer, state, name, info) -> None:
    """``optimizer.load_state_dict(state)``; a state that does not fit it is a ``ResumeError`` naming both."""
    try:
        optimizer.load_state_dict(state)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ResumeError(
            f"cannot resume from {info.path}: its state of optimizer {name!r} does not load into this run's "
            f"{type(optimizer).__name__} ({type(exc).__name__}: {str(exc)[:160]}). Build the run with the optimizer the "
            f"checkpoint was written with, or start fresh from its weights (load_weights({str(info.path)!r}))"
        ) from None


def _settle_hyperparameters(ctx, built, winner) -> None:
    """Say each hyper-parameter the checkpoint changed, per optimizer; under ``"new"``, put this run's back."""
    for name, optimizer in ctx.named_optimizers().items():
        found = checks.differences(built[name], checks.hyperparameters(optimizer), ctx.scheduler)
        if not found:
            continue
        if winner == "new":
            checks.apply_new(optimizer, built[name], found)
        message = checks.describe(found, winner, name=name)
        ctx.say(message)
        warnings.warn(message, ConfigurationWarning, stacklevel=4)


def _restore_extra(replicated, ctx) -> None:
    """Load each extra state object from its saved state, by name; say the names on one side only."""
    saved = replicated.extra or {}
    for name, obj in ctx.extra_state.items():
        if name in saved:
            obj.load_state_dict(saved[name])
    fresh = [n for n in ctx.extra_state if n not in saved]
    dropped = [n for n in saved if n not in ctx.extra_state]
    if fresh:
        ctx.say(f"extra state {fresh} is not in the checkpoint: it goes on as this run built it")
    if dropped:
        ctx.say(f"dropped the checkpointed extra state {dropped}: this run has no extra_state (or ema) of that name")


def _dropped_message(dropped) -> str:
    names = ", ".join(repr(k) for k in dropped)
    return (
        f"dropped the checkpointed slot(s) of {names}: no hook of this run has that identity "
        f"(a hook whose arguments changed has a new one, and starts fresh)"
    )


def fresh_state(ctx, hooks, *, resume, max_epochs, max_steps, config) -> State:
    """The first state of a fresh run, its budget checked as a fresh run's."""
    arguments.check_budget(max_epochs, max_steps, fresh=True)  # resume='auto' found nothing: a fresh run
    if resume == "auto" and (said := replaced_best(ctx.save_dir)):  # said, not refused: an 'auto' restart is legal
        warnings.warn(said, ConfigurationWarning, stacklevel=3)
    return initial_state(
        hooks,
        iters_per_epoch=ctx.feed.iters_per_epoch,
        max_epochs=max_epochs,
        max_steps=max_steps,
        rank=ctx.rank,
        world_size=ctx.world_size,
        config=config,
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
