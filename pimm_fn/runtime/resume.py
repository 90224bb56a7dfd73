"""Putting a run back where a checkpoint left it.

Restores the model, optimizer, scheduler, scaler, RNG states, data cursor,
progress, hook slots and best values.

On a different world size the per-rank RNG states cannot carry over, but
the position in the epoch does, as samples consumed: ``i`` steps of ``b``
samples on ``W`` ranks consumed the first ``i * b * W`` positions of the
epoch's ``DistributedSampler`` permutation, and the epoch continues after
them, split over the new ranks (``pimm_fn.runtime.remainder``): no sample
repeated or skipped. The epoch's step is then its new steps per epoch less
the batches left, ``global_step`` and ``samples_seen`` are kept (cadences
go on by ``global_step``), and every later epoch has the new length: the
run ends after ``max_epochs`` epochs, at the step ``plan`` predicts from the
restored progress (``plan(..., start=run.state.progress)``). At an epoch
boundary only the length changes. Where the data cannot be positioned so
(another sampler, a one-shot iterator, an ``iters_per_epoch`` other than
``len(loader)``, another dataset length, a checkpoint without the record),
the interrupted epoch restarts from its first batch with a
``ResumeNotExactWarning`` saying why, or a ``ResumeError`` under ``strict``.

Steps per epoch that changed since the checkpoint (another batch size,
other data, another ``iters_per_epoch``) follow one rule, said in a
``ResumeNotExactWarning`` naming both lengths and the samples consumed:
the interrupted epoch continues *by samples consumed*. A torch
``DistributedSampler`` epoch continues at its permutation position, as on
another world size (the batch size the cursor records gives the samples
consumed). Otherwise, when the samples the epoch consumed can be told from the progress (every batch before the
interruption full), are a multiple of the new batch size, and the data can
be replayed to that point (a ``DataLoader`` over a sampler, not a one-shot
iterator), the epoch continues at the batch starting with the first
unconsumed sample: no sample is repeated or skipped. Otherwise the
interrupted epoch restarts from its first batch, and the warning says why. Either way ``global_step`` and ``samples_seen``
are kept, and the epoch is the new length from then on (so ``global_step``
no longer equals ``epoch * steps_per_epoch + step_in_epoch``; step-cadence
hooks follow ``global_step``). At an epoch boundary only the length changes.

The optimizer's hyper-parameters as this run built them are compared with
the checkpoint's (``pimm_fn.runtime.hyperparameters``): each difference is
said once (a console line and a ``ConfigurationWarning``), and
``resume_hyperparameters`` chooses which wins: ``"checkpoint"`` (default)
or ``"new"``. A run of several named optimizers (``loop(optimizers=)``)
resumes only from a checkpoint of the same names (else a ``ResumeError``),
each optimizer from its own state, its differences said under its name.
An optimizer or scheduler of another class than the checkpoint's
(``pimm_fn.runtime.class_change``) is a ``ResumeError`` naming both, before
anything is loaded; under ``"new"`` that object starts fresh instead (its
state not loaded, said on the console), and the rest resumes.

Extra state (``loop(extra_state=)``, the ``ema`` averages) comes back by
name, like hook slots: a name the checkpoint lacks keeps the object as this
run built it, a saved name this run lacks is dropped; each with a console line.

Hook slots come back by hook identity (``pimm_fn.core.slots``): the run may
list its hooks in another order, add hooks (they start from their initial
slot) or leave some out (their slots are dropped, with a console line). A
hook whose saved slot no longer fits it is a ``ResumeError`` naming it.
"""

import warnings

import attrs

from pimm_fn.runtime import class_change, hyperparameters as hp
from pimm_fn.runtime.advice import ConfigurationWarning

from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn import checkpoint
from pimm_fn.checkpoint import _layout as L
from pimm_fn.checkpoint import _standard, choice, dist, sharded
from pimm_fn.checkpoint.errors import CheckpointError
from pimm_fn.checkpoint.contents import SavedState, from_parts
from pimm_fn.core.slots import SlotMismatch
from pimm_fn.core.state import State
from pimm_fn.hooks.progress import BAR_KEY
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime import remainder
from pimm_fn.runtime.feed import ResumeNotExactWarning, changes, describe
from pimm_fn.runtime.rng import restore_rng, rng_problem

__all__ = ["locate", "restore", "ResumeError"]


class ResumeError(RuntimeError):
    """A sound checkpoint cannot be resumed as asked (other hooks, optimizers, world size under ``strict``).

    A damaged one is a ``pimm_fn.CheckpointError`` instead: the fix there is another checkpoint, here another run setup.
    """


def locate(resume, save_dir, *, say=None, iters_per_epoch=None):
    """The checkpoint to resume from, read on every rank (``pimm_fn.checkpoint.choice``), or ``None`` for a fresh start.

    ``resume="auto"`` takes the newest checkpoint that validates and reads
    back on every rank, skipping damaged ones with a line each (``say``,
    default: printed by rank 0). It starts fresh only when ``save_dir/model``
    holds no checkpoint, saying ``no checkpoint in <dir>: starting fresh``
    (a mistyped ``save_dir`` shows there); checkpoints that are all damaged
    are refused, never replaced. ``iters_per_epoch``: the run's steps per
    epoch, which pimm's legacy ``model_last.pth`` (no record of its own) is
    resumed with, as pimm does, saying so.

    Raises:
        FileExistsError: a fresh start into a ``save_dir`` that holds checkpoints.
        CheckpointError: (on every rank) ``resume=<path>`` names a damaged
            checkpoint, or ``resume="auto"`` found checkpoints and none intact
            (``pimm_fn.checkpoint.choice.NoIntactCheckpointError``, naming each
            and why); nothing under ``save_dir`` was changed.
    """
    say = say or _say
    # -- pimm's layouts (last/ with weights.pth + trainer.dcp/, model_last.pth): translated, then resumed as ours --
    from pimm_fn.compat import checkpoints as pimm_layouts  # noqa: PLC0415 - kept inside this block

    translated = pimm_layouts.locate(resume, save_dir, iters_per_epoch=iters_per_epoch, say=say)
    if translated is not None:
        return translated
    # -- end of pimm's layouts --
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
        return choice.newest_readable(save_dir / "model", say)
    return choice.read_agreed(resume)


def _say(message: str) -> None:
    if dist.is_main():
        print(f"[pimm_fn] {message}", flush=True)


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
    problem = problem or _rng_error(held.local, info)
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
    loaded = info.loaded if isinstance(info, choice.Chosen) else None  # read by locate, on every rank
    loaded = loaded or checkpoint.load_checkpoint(info, weights=not ctx.sharded)  # shards load apart, below
    held = _contents(loaded, info)
    _check_sharding(held.replicated, ctx, info)
    same_world = info.world_size == ctx.world_size and held.local is not None
    saved, dropped = _with_slots(held.local.state if same_world else held.replicated.state, hooks, info)
    cursor = None if same_world else _main_cursor(held)
    offset, why = (None, "") if same_world else _world_offset(saved.progress, ctx, info, cursor)
    if not same_world and strict and _mid_epoch(saved) and offset is None:
        raise ResumeError(
            _world_message(info, ctx) + f"; {why}, so epoch {saved.progress.epoch} would restart from its first "
            f"batch: resume with the same world size, or pass strict_resume=False"
        )
    replicated = held.replicated
    _check_optimizers(replicated, ctx, info)
    fresh = _changed_classes(replicated, ctx, info, hyperparameters)  # started fresh under "new", else refused
    fresh_scheduler = any(c.what == "scheduler" for c in fresh)
    horizon = hp.horizon_problem(ctx.scheduler, None if fresh_scheduler else replicated.scheduler, info.path)
    if horizon is not None:  # a scheduler horizon the run outgrew
        raise ResumeError(f"cannot resume from {info.path}: {horizon}")
    built = {name: hp.hyperparameters(o) for name, o in ctx.named_optimizers().items()}
    _load_model_and_optimizer(loaded, class_change.fresh_states(replicated, fresh, ctx), ctx, info)
    for name in ("scheduler", "scaler"):
        target, stored = getattr(ctx, name), getattr(replicated, name)
        if target is not None and stored is not None and not (name == "scheduler" and fresh_scheduler):
            target.load_state_dict(stored)
        elif (target is None) != (stored is None):  # one side only: said, as any change since the checkpoint
            ctx.say(f"the checkpoint {info.path} holds no {name} state: this run's {name} starts fresh" if stored is None
                    else f"dropped the checkpoint's {name} state: this run has no {name}")
    if fresh_scheduler:
        for name, optimizer in ctx.named_optimizers().items():
            hp.restart_schedule(optimizer, built[name], ctx.scheduler)
    for c in fresh:
        ctx.say(class_change.fresh_line(c, info.path))
    _settle_hyperparameters(ctx, built, hyperparameters)
    _restore_extra(replicated, ctx)
    dropped = tuple(k for k in dropped if k != BAR_KEY)  # the progress bar's empty slot: shown or not, nothing lost
    if dropped:
        ctx.say(_dropped_message(dropped))
    state = attrs.evolve(saved, rank=ctx.rank, world_size=ctx.world_size)
    p = state.progress
    if not same_world:
        state = _new_world(state, ctx, info, offset, why, cursor)
    elif ctx.feed.iters_per_epoch == p.iters_per_epoch:
        restore_rng(held.local.rng)
        ctx.feed.resume(held.local.cursor, p.epoch, p.iter_in_epoch)
    else:
        restore_rng(held.local.rng)
        state = _new_epoch_length(state, ctx, info, held.local.cursor)
    if ctx.feed.iters_per_epoch != state.progress.iters_per_epoch:
        state = attrs.evolve(state, progress=attrs.evolve(state.progress, iters_per_epoch=ctx.feed.iters_per_epoch))
    return state


def _check_sharding(replicated, ctx, info) -> None:
    """What the checkpoint says of its model is what it holds, and fits this run: checked before anything loads.

    A sharded model resumes from shards (written by a sharded model of any
    world size), never from a weights file; a sharded checkpoint resumes into
    a replicated model too (its shards read into it). The claim itself is
    checked against the DCP metadata: shards claimed are there, as tensors.
    """
    if info.format != "standard" and replicated.sharded:
        raise CheckpointError(info.path, info.path.name, "says its model was sharded, but a legacy file holds no "
                              "shards: its trainer part was altered")
    if info.format == "standard":
        sharded.check_claim(info.path, replicated.sharded)
    if ctx.sharded and not replicated.sharded:
        raise ResumeError(
            f"cannot resume this sharded model from {info.path}: that checkpoint was written by a replicated "
            f"(unsharded) model, whose optimizer state is keyed by parameter position. Resume it with the model "
            f"unsharded, or start the sharded run from its weights (load_weights({str(info.path)!r}))"
        )
    rest = replicated.optimizer
    if replicated.sharded and not (isinstance(rest, dict) and isinstance(rest.get("state"), dict)
                                   and isinstance(rest.get("param_groups"), (list, type(None)))):
        raise CheckpointError(info.path, L.TRAINER, "says its model was sharded, but its optimizer part is not "
                              "the state and param groups a sharded save writes: its trainer part was altered")


def _rng_error(local, info) -> CheckpointError | None:
    """This rank's saved RNG states do not restore (tried on scratch generators): the error, before anything loads."""
    problem = None if local is None else rng_problem(local.rng)
    if problem is None:
        return None
    return CheckpointError(info.path, L.TRAINER, f"holds RNG states of rank {dist.rank()} that do not restore "
                           f"({problem}): the checkpoint was not written by pimm_fn, or was altered")


def _load_model_and_optimizer(loaded, replicated, ctx, info) -> None:
    """A sharded checkpoint's shards through DCP (any world size or sharding); else the optimizer(s), then the weights.

    The optimizers load first: ``Optimizer.load_state_dict`` changes nothing
    when it refuses a state, so a refusal leaves the run as it was built.
    """
    if replicated.sharded:
        try:
            sharded.load_into(info.path, unwrap(ctx.model), ctx.optimizer, replicated.optimizer)
        except CheckpointException as exc:  # a BaseException: said as the damaged checkpoint it is, on every rank
            raise _standard.shards_error(info.path, exc) from None
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


def _check_optimizers(replicated, ctx, info) -> None:
    """The checkpoint holds one optimizer for a run of one, the same names for a run of several named ones."""
    saved = None if replicated.optimizers is None else sorted(replicated.optimizers)
    wanted = None if ctx.optimizers is None else sorted(ctx.optimizers)
    if saved == wanted:
        return
    said = lambda names: "one optimizer (optimizer=)" if names is None else f"optimizers {names} (optimizers=)"
    raise ResumeError(
        f"cannot resume from {info.path}: it holds the state of {said(saved)}, this run has {said(wanted)}. "
        f"Build the run with the optimizers the checkpoint was written with, or start fresh from its weights "
        f"(load_weights({str(info.path)!r}))"
    )


def _changed_classes(replicated, ctx, info, winner) -> tuple:
    """The optimizers and scheduler of another class than the checkpoint's: fresh under ``"new"``, else refused."""
    changed = class_change.changes(replicated, ctx)
    if changed and winner != "new":
        raise ResumeError(class_change.refusal(changed, info.path))
    unfit = None if any(c.what == "scheduler" for c in changed) else class_change.unfit_scheduler_state(replicated, ctx)
    if unfit is not None:
        raise ResumeError(f"cannot resume from {info.path}: {unfit}")
    return changed


def _settle_hyperparameters(ctx, built, winner) -> None:
    """Say each hyper-parameter the checkpoint changed, per optimizer; under ``"new"``, put this run's back."""
    for name, optimizer in ctx.named_optimizers().items():
        found = hp.differences(built[name], hp.hyperparameters(optimizer), ctx.scheduler)
        if not found:
            continue
        if winner == "new":
            hp.apply_new(optimizer, built[name], found)
        message = hp.describe(found, winner, name=name)
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


def _mid_epoch(state: State) -> bool:
    return state.position in ("BeforeEpoch", "BeforeStep", "AfterStep") and not state.progress.at_epoch_end


def _world_message(info, ctx) -> str:
    return (
        f"checkpoint of step {info.step} was written by {info.world_size} rank(s), this run has "
        f"{ctx.world_size}: per-rank RNG states cannot carry over"
    )


def _main_cursor(held):
    """Rank 0's data cursor on every rank: its batch size and position are the same on all ranks (collective)."""
    return dist.broadcast_object(held.local.cursor if dist.rank() == 0 and held.local is not None else None)


def _consumed(p, cursor, world: int, group: int) -> tuple[int | None, str]:
    """The positions of its permutation the interrupted epoch consumed on all ``world`` ranks, or ``None`` and why not.

    A step takes ``group`` batches (``TrainStep(accumulate=group)``, unchanged since the checkpoint).
    """
    data = (cursor or {}).get("data")
    if not data or not isinstance(data.get("batch_size"), int):
        return None, "the checkpoint does not record its loader's batch size"
    offset, first = (cursor.get("rest") or (0, 0))
    return offset + (p.iter_in_epoch - first) * group * data["batch_size"] * world, ""


def _positioning(ctx, cursor) -> str | None:
    """Why this run's data cannot continue an epoch at a position of its permutation, or ``None``."""
    feed = ctx.feed
    if feed.one_shot:
        return "the training data is a one-shot iterator"
    why = remainder.why_not(feed.data)
    if why is not None:
        return f"the training data cannot be positioned ({why})"
    if feed.iters_per_epoch != len(feed.data) // feed.group:
        return f"iters_per_epoch={feed.iters_per_epoch} differs from len(loader)={len(feed.data)} // {feed.group}"
    saved, now = ((cursor or {}).get("data") or {}).get("samples"), describe(feed.data)["samples"]
    if saved != now:
        return f"the dataset length changed ({saved} -> {now}): its permutation is another one"
    return None


def _world_offset(p, ctx, info, cursor) -> tuple[int | None, str]:
    """Where in its permutation the interrupted epoch continues on this world size, or ``None`` and why not."""
    offset, why = _consumed(p, cursor, info.world_size, ctx.feed.group)
    why = why or _positioning(ctx, cursor)
    if why:
        return None, why
    if offset >= len(ctx.feed.data.sampler.dataset):
        return None, f"its {offset} consumed samples reach past the dataset"
    return offset, ""


def _new_world(state, ctx, info, offset, why, cursor) -> State:
    """``state`` on this run's world size, by the rule of this module's docstring; the data positioned."""
    p, new = state.progress, ctx.feed.iters_per_epoch
    if not _mid_epoch(state):
        ctx.say(f"resumed on {ctx.world_size} rank(s) at an epoch boundary (written by {info.world_size}): "
                f"epochs now have {new} steps, global_step stays {p.global_step}")
        at_end = new if p.at_epoch_end else p.iter_in_epoch
        return attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=new, iter_in_epoch=at_end))
    if offset is None:
        return _restart_epoch(state, ctx, info, why)
    first = ctx.feed.continue_at(p.epoch, offset)
    changed = changes((cursor or {}).get("data"), describe(ctx.feed.data))
    warnings.warn(
        f"{_world_message(info, ctx)}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its "
        f"{p.iters_per_epoch} steps, {offset} samples consumed on all ranks{f' ({changed})' if changed else ''}: "
        f"it continues after them at step {first} of {new}, no sample repeated or skipped; "
        f"global_step stays {p.global_step}",
        ResumeNotExactWarning,
        stacklevel=4,
    )
    return attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=new, iter_in_epoch=first))


def _restart_epoch(state, ctx, info, why) -> State:
    p = state.progress
    message = _world_message(info, ctx) + f"; {why}, so epoch {p.epoch} restarts from its first batch"
    warnings.warn(message, ResumeNotExactWarning, stacklevel=5)
    ctx.feed.start_epoch(p.epoch)
    progress = attrs.evolve(p, iter_in_epoch=0, iters_per_epoch=ctx.feed.iters_per_epoch)
    return attrs.evolve(state, progress=progress, position="BeforeEpoch")


def _samples_in_epoch(p, data) -> int | None:
    """The samples the interrupted epoch consumed, when the progress pins them down; else ``None``.

    Every batch before the interruption is full (only an epoch's last batch
    may be short), so the epoch consumed ``iter_in_epoch * b`` samples for
    the old batch size ``b``, which the checkpoint does not record. It is
    found two ways, each checked against the old steps per epoch: every
    earlier epoch a full pass over the sampler's ``n`` samples (``b`` from
    ``samples_seen - epoch * n``), or every step so far one full batch
    (``b = samples_seen / global_step``, epochs capped by ``iters_per_epoch``).
    """
    try:
        n = len(data.sampler)
    except (AttributeError, TypeError):
        return None
    i, old = p.iter_in_epoch, p.iters_per_epoch
    within = p.samples_seen - p.epoch * n
    if 0 < within < n and within % i == 0:
        b = within // i
        if old in (-(-n // b), n // b):
            return within
    if p.global_step and p.samples_seen % p.global_step == 0:
        b = p.samples_seen // p.global_step
        if 0 < b and b * old <= n:
            return i * b
    return None


def _position(p, data, feed, cursor) -> tuple[int | None, str]:
    """The batch index of the new epoch length that continues the interrupted epoch, or ``None`` and why not."""
    within = _samples_in_epoch(p, data)
    if within is None:
        return None, "the samples it consumed cannot be told from the checkpoint"
    size = getattr(data, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        return None, f"{within} samples of it were consumed, but the data has no batch_size to position by"
    if within % size:
        return None, f"its {within} consumed samples are not a multiple of the new batch size {size}"
    if feed.one_shot or cursor.get("epoch_start") is None:
        return None, f"its {within} consumed samples were known, but the data cannot be replayed to that point"
    return within // size, f"{within} samples consumed / batch size {size}"


def _new_epoch_length(state, ctx, info, cursor) -> State:
    """``state`` on the new steps per epoch, by the rule of this module's docstring; the data positioned."""
    p, feed = state.progress, ctx.feed
    old, new = p.iters_per_epoch, feed.iters_per_epoch
    # A loader's own state describes batches of the old length: positions come from replay instead.
    # (The feed is handed the cursor without its loader record, "data": the warning below says the change.)
    cursor = {k: v for k, v in cursor.items() if k not in ("loader", "epoch_done")}
    head = (
        f"steps per epoch changed since the checkpoint of step {p.global_step} ({info.path}): {old} then, "
        f"{new} now (another batch size, other data or iters_per_epoch); {p.samples_seen} samples consumed in all"
    )
    if not _mid_epoch(state) or p.iter_in_epoch == 0:
        feed.resume({**cursor, "data": None}, p.epoch, 0)  # between epochs: nothing of an epoch to position
        ctx.say(f"{head}; resuming at an epoch boundary, global_step stays {p.global_step}")
        at_end = p.iter_in_epoch if not p.at_epoch_end else new
        return attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=new, iter_in_epoch=at_end))
    offset, why = _world_offset(p, ctx, info, cursor)  # a DistributedSampler epoch continues by positions
    if offset is not None:
        first = feed.continue_at(p.epoch, offset)
        warnings.warn(
            f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {old} steps, {offset} samples "
            f"consumed on all ranks: it continues after them at step {first} of {new}, with no sample repeated or "
            f"skipped; global_step stays {p.global_step}",
            ResumeNotExactWarning,
            stacklevel=4,
        )
        return attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=new, iter_in_epoch=first))
    index, why = _position(p, feed.data, feed, cursor)
    if index is None:
        warnings.warn(
            f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {old} steps, and {why}: "
            f"epoch {p.epoch} restarts from its first batch; global_step stays {p.global_step}",
            ResumeNotExactWarning,
            stacklevel=4,
        )
        feed.start_epoch(p.epoch)
        progress = attrs.evolve(p, iter_in_epoch=0, iters_per_epoch=new)
        return attrs.evolve(state, progress=progress, position="BeforeEpoch")
    index = min(index, new)  # the samples consumed reach past the new epoch: it has ended
    warnings.warn(
        f"{head}. Epoch {p.epoch} was interrupted after {p.iter_in_epoch} of its {old} steps ({why}): it continues "
        f"at batch index {index} of {new}, with no sample repeated or skipped; global_step stays {p.global_step}",
        ResumeNotExactWarning,
        stacklevel=4,
    )
    feed.resume({**cursor, "data": None}, p.epoch, index)
    return attrs.evolve(state, progress=attrs.evolve(p, iters_per_epoch=new, iter_in_epoch=index))
