"""``loop()``: a training run built from a model, an optimizer, data and hooks.

Every argument is checked before anything is built, loaded or written; then
the hooks are bound to the model, the context and interpreter made, and the
run restored from a checkpoint or started fresh. The run itself is a
``Loop`` (``pimm_fn.runtime.run``).
"""

import warnings
import weakref
from pathlib import Path

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import foreign, sharded
from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Log, WriteBest
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import initial_state
from pimm_fn.core.retention import resolve as retention_policy
from pimm_fn.core.budget import budget_lines
from pimm_fn.core.schedule import resume_from
from pimm_fn.runtime import arguments, extras
from pimm_fn.runtime import lock as save_dir_lock
from pimm_fn.runtime.advice import Advice, ConfigurationWarning, configuration_messages, nothing_to_train
from pimm_fn.runtime.context import Context, unwrap
from pimm_fn.runtime.control import check_scheduler_hooks
from pimm_fn.runtime.device import use_local_cuda_device
from pimm_fn.runtime.feed import Feed
from pimm_fn.runtime.guard import AgreementGuard
from pimm_fn.runtime.handlers import DEFAULT_HANDLERS, prewarm_staging
from pimm_fn.runtime.implied import Implied
from pimm_fn.hooks.progress import bar_cadence, progress_bar as progress_hook
from pimm_fn.runtime import progress_bar
from pimm_fn.runtime.interpreter import KEEP_TRACE, Interpreter
from pimm_fn.runtime.loggers import check_loggers, run_loggers
from pimm_fn.runtime.logs import Logs
from pimm_fn.runtime.locate import locate
from pimm_fn.runtime.resume import restore
from pimm_fn.runtime.step import NonFinite, train_step
from pimm_fn.runtime.train_step import loop_scaler
from pimm_fn.runtime.run import Loop

__all__ = ["Loop", "loop"]


def _wrap_ddp(model):
    """``model`` in DistributedDataParallel, when a process group exists and it is not wrapped yet."""
    if not dist.is_initialized() or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def loop(
    model,
    optimizer=None,
    train_data=None,
    *,
    optimizers=None,
    extra_state=None,
    hooks=(),
    max_epochs: int | None = None,
    max_steps: int | None = None,
    save_dir=None,
    step_fn=None,
    scheduler=None,
    scaler=None,
    resume=None,
    iters_per_epoch: int | None = None,
    checkpoint_format: str = "standard",
    keep_snapshots: int | None = None,
    keep=None,
    check_agreement: bool | None = None,
    strict_resume: bool = False,
    resume_hyperparameters: str = "checkpoint",
    on_nonfinite: str = "raise",
    handlers=None,
    keep_trace: int | None = KEEP_TRACE,
    config=None,
    console: bool = True,
    ddp: bool = False,
    weights_file: bool = True,
    digests: bool = False,
    progress: bool | None = None,
    loggers=(),
    log_reduce: str | None = None,
) -> Loop:
    """A training loop over ``train_data`` driven by ``hooks``.

    Args:
        model, optimizer: what trains; the model may be wrapped in DDP.
        optimizers: several named optimizers instead of ``optimizer``
            (``optimizer=None``), for a custom ``step_fn`` (a GAN's
            ``{"g": opt_g, "d": opt_d}``), which receives the dict as its
            ``optimizer``. Each is checkpointed under its name; a resume
            needs the same names (``pimm_fn.runtime.extras``).
        extra_state: ``{name: obj}`` of objects with ``state_dict()`` and
            ``load_state_dict()`` checkpointed with the run and restored
            exactly (the same on every rank: rank 0's is written). The
            ``ema()`` hooks' averages join it under their names.
        train_data: a DataLoader, a StatefulDataLoader (exact mid-epoch
            resume), or any re-iterable with ``len``.
        hooks: a list (or tuple) of hooks, run in this order for every
            event; chains nest freely. Each hook's identity must be unique
            in its list (see ``pimm_fn.chain(..., name=)``).
        max_epochs: epochs to train (>= 1 for a fresh run).
        max_steps: instead of ``max_epochs`` (give exactly one), global
            steps to train (>= 1). The epoch in progress at step ``max_steps``
            ends there, as its last step: its ``AfterEpoch`` runs (epoch-end
            evaluations and logs; a save falling on that step is deferred
            past them, as at any epoch end), then ``AfterTrain`` and the
            final save, at step ``max_steps``. It holds on resume, also on
            another world size (epochs of another length): pass the same
            ``max_steps``, a larger one to extend a finished run (from the
            next epoch), or a smaller one already reached to end at once.
            ``plan`` and ``pimm_fn.testing.simulate`` take it too.
        save_dir: where checkpoints (``model/``) and ``log.jsonl`` go. One run
            at a time: a run that will write takes ``save_dir/pimm_fn.lock``
            first (``pimm_fn.runtime.lock``); a finished run opened to be
            read takes none and writes nothing (read-only storage works).
        step_fn: ``step_fn(model, optimizer, batch, *, scheduler, scaler)``
            returning a mapping of outputs; default ``train_step``. A
            ``TrainStep`` configures device, precision, accumulation and
            clipping; with ``accumulate=k`` each step is fed ``k`` batches.
        scheduler, scaler: stepped by the default step and checkpointed.
            When a hook steps the scheduler (``step_scheduler(...)``, or any
            hook declaring it emits ``StepScheduler``), the step function is
            handed ``scheduler=None`` and the hook's effects step it instead;
            such a hook needs a ``scheduler``. With ``scaler=None``, a
            ``TrainStep(precision="fp16")`` makes its own, checkpointed the
            same way; ``TrainStep`` under ``"32"``/``"bf16"`` refuses one.
        resume: ``None`` (fresh), ``"auto"`` (latest complete checkpoint in
            ``save_dir``; fresh, said, if it holds none; a ``CheckpointError``
            if it holds only damaged ones) or a checkpoint path.
        iters_per_epoch: steps per epoch (default ``len(train_data)``, or
            ``len(train_data) // k`` for a step accumulating ``k`` batches).
        checkpoint_format: ``"standard"`` (weights + DCP directory) or
            ``"legacy"`` (one file).
        keep_snapshots: keep only the newest N ``iter_<step>`` snapshots
            (the same as ``keep=keep_last(N)``).
        keep: which ``iter_<step>`` snapshots (``save_every(n,
            snapshots=True)``) to keep, as a retention policy from
            ``pimm_fn.core.retention``: ``keep_last(n)``, ``keep_every(k)``,
            ``keep_best(k, "mIoU", mode="max")``, or several joined with
            ``any_of`` (or ``|``). Applied by the main rank after each save
            is published; ``last``, the ``model_best`` files and the newest
            complete checkpoint are never deleted. ``keep_best`` ranks a
            snapshot by the metrics the run had published at that save
            (recorded in its marker). ``None`` (default) keeps all.
        check_agreement: compare collective effects across ranks before
            running them, raising ``CollectiveDivergenceError`` on every rank
            instead of hanging (default ``None``: on whenever a process group
            is initialized; ``False`` turns it off). Before the first step it
            compares, in one all-reduce, each hook's identity and arguments
            (``save_every(2)`` against ``save_every(3)``), in order, and the
            schedule (steps per epoch, epochs, progress), naming the hook and
            each rank's value on a difference. Then it compares only the
            collective effects of hooks not declared ``rank_consistent`` (the
            built-ins are), with one small asynchronous all-reduce where such
            a hook is called: on its ``AfterStep`` cadence (``every``) and on
            the other events it listens to. Free with built-in hooks; about
            one collective's latency (a few hundred us) per call of a hook of
            your own, so per step for one called every step and a hundredth
            of that for one with ``every = 100`` (``benchmarks/guard.py``).
        strict_resume: refuse a resume that cannot restore the data position.
            Steps per epoch that changed since the checkpoint (another batch
            size) continue the interrupted epoch by samples consumed where
            that is exact, else restart it; ``global_step`` is kept and a
            ``ResumeNotExactWarning`` says which (``pimm_fn.runtime.positioning``).
        resume_hyperparameters: whose optimizer hyper-parameters win on
            resume where this run's optimizer (``lr``, ``weight_decay``,
            ``momentum``, ``betas``...) differs from the checkpoint's:
            ``"checkpoint"`` (default) or ``"new"`` (applied after loading
            the optimizer state). Each difference is said either way. A
            scheduler's state still comes from the checkpoint and moves
            ``lr`` on from it (``pimm_fn.runtime.hyperparameters``). An
            optimizer or scheduler of another class than the checkpoint's is
            a ``ResumeError`` under ``"checkpoint"``; under ``"new"`` it
            starts fresh, said on the console (``pimm_fn.runtime.class_change``).
        on_nonfinite: what a NaN or infinite training loss does:
            ``"raise"`` (default; ``NonFiniteLossError`` naming the global
            step), ``"skip"`` (the default step leaves the batch out of the
            update; the step still counts; each occurrence warns) or
            ``"warn"`` (warns and goes on). ``"raise"``/``"warn"`` read the
            losses with the outputs, where a hook reads them and at each
            epoch's end (no host sync on other steps); ``"skip"`` reads each
            loss before the backward (a sync per step), and is refused with
            a custom ``step_fn``, whose loss comes after its step
            (``pimm_fn.runtime.step``).
        handlers: ``{EffectType: handler}`` overriding or adding handlers. A
            handler that reads another checkpoint layout (``pimm_fn.checkpoint.foreign``,
            ``pimm_fn.compat.HANDLERS``) lets ``resume`` continue from it.
        keep_trace: how many executed effects ``run.trace`` keeps, the
            newest (default 10 000, so a long run's memory stays flat);
            ``None`` keeps every one.
        config: initial ``State.config``.
        console: print progress lines on the main rank.
        ddp: wrap ``model`` in ``DistributedDataParallel`` when a process
            group is initialized (a no-op without one, or when it is already
            wrapped); the wrapper is ``run.ctx.model``. Build the optimizer on
            ``model.parameters()`` before or after: DDP keeps the same tensors.
            A sharded model (FSDP2, ``fully_shard``) is passed as it is,
            without ``ddp``: its checkpoints keep each rank's shards through
            DCP and resume on any world size (``pimm_fn.checkpoint.sharded``).
        weights_file: with a sharded model, gather its full weights into each
            checkpoint's ``model.pth`` (collective; loadable by anyone with
            ``torch.load``). ``False`` skips the gather for a model too large
            for rank 0's memory: the checkpoint then holds the shards only,
            and ``pimm_fn.checkpoint.load_weights_file`` assembles them.
            Replicated models always write ``model.pth``.
        digests: record each checkpoint file's SHA-256 in its ``COMPLETE``
            marker (standard format): the weights file hashed as it is
            written, the others in one streamed pass each (a background save
            hashes on its worker thread). ``resume`` (``"auto"`` or a path)
            and ``python -m pimm_fn verify`` then check them, so bytes changed
            at the same size are refused like any other damage; sizes are
            recorded and checked either way. Off by default: SHA-256 adds
            about a third to a synchronous save (``benchmarks/RESULTS.md``).
        progress: a progress bar on the main rank (step/total, it/s, time
            left, the latest loss ``log_every`` read and metrics): ``None``
            (default) shows it where someone watches (rank 0's stderr is a
            terminal, or a notebook) with ``console`` on; ``True``/``False``
            force it. It adds no host sync (``pimm_fn.runtime.progress_bar``);
            its hook joins ``run.hooks``, last, but not ``run.trace``.
        loggers: more destinations of the ``Log`` records, each opened once
            and closed at the end of training and on an error:
            ``pimm_fn.CSVLogger()``, ``TensorBoardLogger()``, ``WandbLogger()``,
            ``MLFlowLogger()``, or any object with ``open``/``write``/``close``
            (``pimm_fn.runtime.loggers``). ``save_dir/log.jsonl`` is always
            written with a ``save_dir``: truncated to the resumed step on
            resume, and a fresh run sets an earlier run's file aside
            (``log.1.jsonl``). ``run.history`` holds the same records.
        log_reduce: ``"mean"`` logs the training outputs (``train`` and
            ``epoch`` records) averaged over the ranks, with one all-reduce
            per such record, on the steps that log only; ``None`` (default)
            logs rank 0's. With several ranks each such record says which in
            its ``over`` field (``"rank 0"`` or ``"mean of 4 ranks"``).

    Warns:
        ConfigurationWarning: once each, when a saver precedes an evaluator
            acting on the same mid-epoch step, when an evaluator returns
            ``None`` in a single-process run, and when a metric a hook reads
            (``best_on``, ``early_stop``) is not among what the evaluators
            publish. With several ``best_on`` metrics each keeps its own
            ``model_best_<metric>.pth``. On resume, for each optimizer
            hyper-parameter that differs from the checkpoint's. When a hook
            reads a metric and no hook evaluates anything; when a resumed
            run's budget is already spent (nothing to train); when
            ``resume="auto"`` starts fresh beside an earlier ``model_best``
            it will replace.
        NonFiniteMetricWarning: each time an evaluation publishes NaN or
            +/-inf for a metric a hook reads, naming it and the step; it
            never becomes the best and training goes on
            (``pimm_fn.runtime.advice``).
        ResumeNotExactWarning: a resume that cannot put the data back
            exactly (another world size or steps per epoch, one-shot data).
        NonFiniteLossWarning: a NaN or infinite loss, under ``"skip"``/``"warn"``.

    Raises:
        TypeError, ValueError: a malformed argument, said before anything is
            built: ``hooks`` not a list, an uncalled hook factory, a ``resume``
            that is not ``None``/``"auto"``/a path, a saving hook without
            ``save_dir``, both or neither of ``max_epochs`` and ``max_steps``,
            ``max_epochs < 1`` on a fresh run, ``max_steps < 1``, a hook stepping
            the scheduler with ``scheduler=None`` or after a saver, an unknown
            ``on_nonfinite`` or ``resume_hyperparameters``, ``"skip"`` with a
            custom ``step_fn``; a model that is not a ``Module``, an optimizer,
            scheduler or scaler of the wrong kind, a non-callable ``step_fn``,
            ``handlers`` not mapping effect types to callables, a flag that is
            not a bool (``console="no"``), ``iters_per_epoch`` or
            ``keep_snapshots`` out of range (``pimm_fn.runtime.arguments``).
        NotADirectoryError: ``save_dir`` is a file.
        NonFiniteLossError: (while training) a NaN or infinite loss under
            ``on_nonfinite="raise"``.
        FileExistsError: a fresh run into a ``save_dir`` that holds checkpoints
            or best weights (``model_best*``).
        SaveDirLockError: (on every rank) another run holds ``save_dir``, or
            it cannot be written and this run would train.
        CheckpointError: (on every rank) ``resume=<path>`` is damaged, or
            ``resume="auto"`` found checkpoints and none intact (each named).
    """
    # Every argument is checked here, before anything is built, loaded or written (pimm_fn.runtime.arguments).
    arguments.check_model(model)
    arguments.check_optimizer(optimizer)
    arguments.check_train_data(train_data)
    hooks = protocol.check_hooks(hooks)
    arguments.check_resume(resume)
    arguments.check_arguments(
        step_fn=step_fn, scheduler=scheduler, scaler=scaler, iters_per_epoch=iters_per_epoch,
        checkpoint_format=checkpoint_format, check_agreement=check_agreement, strict_resume=strict_resume,
        console=console, ddp=ddp, weights_file=weights_file, handlers=handlers, config=config,
        keep_trace=keep_trace, digests=digests,
    )
    arguments.check_budget(max_epochs, max_steps, fresh=resume is None)
    arguments.check_save_dir(hooks, save_dir)
    arguments.check_on_nonfinite(on_nonfinite, custom_step=step_fn not in (None, train_step))
    arguments.check_resume_hyperparameters(resume_hyperparameters)
    check_scheduler_hooks(hooks, scheduler)
    show_bar = progress_bar.wanted(progress, console)  # this process's wish; rank 0's decides, below
    loggers = check_loggers(loggers, log_reduce)
    keep = retention_policy(keep, keep_snapshots, caller="loop")
    shards = sharded.is_sharded(unwrap(model))
    arguments.check_sharding(shards, ddp=ddp, checkpoint_format=checkpoint_format, weights_file=weights_file)
    optimizer, optimizers = extras.check_optimizers(optimizer, optimizers, step_fn, sharded=shards)
    extra_state = extras.extra_state(extra_state, hooks, sharded=shards)
    arguments.check_fresh_save_dir(resume, save_dir)  # the arguments are right; is save_dir free for a fresh run?
    use_local_cuda_device(model)  # LOCAL_RANK's GPU, before DDP, the guard or DCP allocate on the current one
    if ddp:
        model = _wrap_ddp(model)
    feed = Feed(train_data, iters_per_epoch, group=getattr(step_fn, "accumulate", 1))  # k micro-batches a step
    # Rank 0 decides, so every hook list is alike; about 200 moves an epoch keep a long epoch's steps quiet.
    shown = (progress_hook(bar_cadence(feed.iters_per_epoch)),) if dist.broadcast_object(show_bar) else ()
    hooks = chain(*protocol.bind(hooks, unwrap(model)), *shown)
    save_dir = Path(save_dir) if save_dir is not None else None
    scaler = loop_scaler(step_fn, scaler, model)  # a TrainStep(precision="fp16")'s own, checkpointed as scaler=
    guarded = dist.is_initialized() and check_agreement is not False
    implied = Implied.of(hooks, guarded=guarded)  # what the hooks imply, derived once (pimm_fn.runtime.implied)
    averaged = log_reduce == "mean" and dist.world_size() > 1  # every rank joins the average of each training record
    ctx = Context(
        model=model, optimizer=optimizer, feed=feed, save_dir=save_dir, scheduler=scheduler, scaler=scaler,
        checkpoint_format=checkpoint_format, keep=keep, rank=dist.rank(), world_size=dist.world_size(),
        console=console, implied=implied, advice=Advice(implied, world_size=dist.world_size()),
        nonfinite=NonFinite(on_nonfinite, world_size=dist.world_size()),
        sharded=shards, weights_file=weights_file, digests=digests,
        everywhere=((WriteBest,) if shards else ()) + ((Log,) if averaged else ()),
        optimizers=optimizers, extra_state=extra_state,
    )
    ctx.logs = Logs(run_loggers(save_dir, loggers), save_dir=save_dir, say=ctx.say, rank=ctx.rank,
                    world_size=ctx.world_size, reduce=log_reduce)
    ctx.bar = progress_bar.ProgressBar() if shown and ctx.rank == 0 else None
    interpreter = Interpreter(ctx, {**DEFAULT_HANDLERS, **(handlers or {})},
                              AgreementGuard(implied) if guarded else None, keep_trace=keep_trace)
    epochs = max_epochs if max_steps is None else -(-max_steps // feed.iters_per_epoch)
    for message in configuration_messages(hooks.hooks, iters_per_epoch=feed.iters_per_epoch, max_epochs=epochs):
        warnings.warn(message, ConfigurationWarning, stacklevel=2)
    lock = save_dir_lock.take(save_dir, say=ctx.say)  # before anything is written there; rank 0's, told to all
    with lock.released_on_error():
        # skipped checkpoints said on the console, as any line; a pimm legacy file takes this run's steps per epoch
        info = locate(resume, save_dir, say=ctx.say, iters_per_epoch=feed.iters_per_epoch,
                      readers=foreign.readers((handlers or {}).values()))  # a plug-in's, with its handlers
        if info is None:
            arguments.check_budget(max_epochs, max_steps, fresh=True)  # resume='auto' found nothing: a fresh run
            if resume == "auto" and arguments.replaced_best(save_dir):  # said, not refused: an 'auto' restart is legal
                warnings.warn(arguments.replaced_best(save_dir), ConfigurationWarning, stacklevel=2)
            state = initial_state(
                hooks.hooks, iters_per_epoch=feed.iters_per_epoch, max_epochs=max_epochs, max_steps=max_steps,
                rank=ctx.rank, world_size=ctx.world_size, config=config,
            )
        else:
            state = restore(info, ctx, hooks.hooks, strict=strict_resume, hyperparameters=resume_hyperparameters)
            saved, state = state.progress, resume_from(state, max_epochs=max_epochs, max_steps=max_steps)
            ctx.say(f"resumed from {info.path} at step {state.progress.global_step}")
            for line in budget_lines(saved, state.progress, max_steps=max_steps):
                ctx.say(line)
            if nothing_to_train(state, info.path) is not None:  # legal, pointless: said once
                warnings.warn(nothing_to_train(state, info.path), ConfigurationWarning, stacklevel=2)
        writes = info is None or not state.finished  # a finished run opened to be read (run.history) writes nothing
        ctx.lock = lock.settle(writes=writes)  # the refusal raised when it will write; else released at once
        ctx.logs.start(state.progress, resumed=info is not None, writes=writes)  # logs truncated or set aside; history
        prewarm_staging(ctx)  # when a hook saves in the background: its memory, after the first step
        run = Loop(ctx, state, step_fn or train_step, interpreter)
        ctx.nonfinite.where = lambda: run.state.progress  # a NaN loss is reported at the step being trained
        if info is not None and not run.finished:  # a finished run resumed with its own budget runs no hook at all
            run._dispatch(ev.BeforeTrain(resumed=True))
    weakref.finalize(run, ctx.lock.release)  # and at the end of training (Loop), or at exit
    return run
