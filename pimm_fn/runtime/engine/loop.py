"""``loop()``: a training run built from a model, an optimizer, data and hooks, its option keywords included.

It takes the arguments a user writes every day as keywords and the rest as a
few frozen values (``Saving``, ``Resuming``, ``Watching``, ``Parallel``,
``Training``: ``pimm_fn.runtime.engine.options``); a keyword that moved into one is
refused with a ``TypeError`` naming it. Every argument is checked before
anything is built, loaded or written; then
the hooks are bound to the model, the context and interpreter made, and the
run restored from a checkpoint or started fresh. The run itself is a
``Loop`` (``pimm_fn.runtime.engine.run``).

``loop()``'s option keywords: each given as its value, and the keywords that moved into one or went.

A keyword ``loop()`` took before its options were values (``MOVED``) is
refused with a ``TypeError`` naming the value it moved to; one that went
without a value of its own (``GONE``: ``keep_snapshots=``, ``optimizers=``)
with what to pass instead. An option given as something other than its
value (``saving={...}``) is refused the same way.
"""

import datetime
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import discovery, files, storage
from pimm_fn.checkpoint import lock as save_dir_lock
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core import validate as v
from pimm_fn.core.effects import Log, WriteBest
from pimm_fn.core.fold import chain
from pimm_fn.core.hook_list import check_hooks
from pimm_fn.hooks.progress import bar_cadence
from pimm_fn.hooks.progress import progress_bar as progress_hook
from pimm_fn.runtime.data.feed import Feed
from pimm_fn.runtime.engine import arguments, options
from pimm_fn.runtime.engine.arguments import check_bucket, check_fresh_save_dir, check_save_dir
from pimm_fn.runtime.engine.guard import AgreementGuard
from pimm_fn.runtime.engine.implied import Implied
from pimm_fn.runtime.engine.interpreter import Context, Interpreter, unwrap
from pimm_fn.runtime.engine.options import Parallel, Preemption, Resuming, Saving, Training, Watching
from pimm_fn.runtime.engine.preemption import Stopping
from pimm_fn.runtime.engine.run import Loop
from pimm_fn.runtime.errors import Advice, ConfigurationWarning, configuration_messages
from pimm_fn.runtime.evaluation.sanity import sanity_check
from pimm_fn.runtime.handlers import progress as progress_bar
from pimm_fn.runtime.handlers.checkpointing import prewarm_staging
from pimm_fn.runtime.handlers.control import check_scheduler_hooks
from pimm_fn.runtime.handlers.dispatch import run_handlers
from pimm_fn.runtime.handlers.logs import Logs
from pimm_fn.runtime.logs.loggers import check_loggers, run_loggers
from pimm_fn.runtime.replicas import switch as replicas
from pimm_fn.runtime.replicas.manager import check_group
from pimm_fn.runtime.resume.resume import fresh_state, locate, restore, resumed_state
from pimm_fn.runtime.step import stateful_objects
from pimm_fn.runtime.step.configurable import built_in, loop_scaler
from pimm_fn.runtime.step.devices import use_local_cuda_device, wrap_ddp
from pimm_fn.runtime.step.nonfinite import NonFinite
from pimm_fn.runtime.step.train_step import check_step_fn, train_step

__all__ = [
    "MOVED",
    "GONE",
    "refuse_moved",
    "check_options",
    "Loop",
    "loop",
]


# The keywords loop() took before its options became values: where each went (keep_snapshots went away).
MOVED = {
    **{name: ("saving", "Saving") for name in ("checkpoint_format", "keep", "weights_file", "digests")},
    **{name: ("resuming", "Resuming") for name in ("strict_resume", "resume_hyperparameters")},
    **{name: ("watching", "Watching") for name in ("console", "progress", "log_reduce", "keep_trace")},
    **{name: ("parallel", "Parallel") for name in ("ddp", "check_agreement")},
    **{
        name: ("training", "Training")
        for name in ("on_nonfinite", "scaler", "extra_state", "config", "iters_per_epoch")
    },
}


# The keywords that went without a value of their own: what to pass instead.
GONE = {
    "keep_snapshots": "saving=pimm_fn.Saving(keep=pimm_fn.keep_last(n)), the same policy",
    "optimizers": "optimizer={name: optimizer, ...}, which a custom step_fn receives as its 'optimizer'",
}


def refuse_moved(given: Mapping) -> None:
    """Raise the ``TypeError`` for the first keyword ``loop()`` does not take, saying where a moved one went.

    >>> refuse_moved({"checkpoint_format": "legacy"})
    Traceback (most recent call last):
    TypeError: loop() no longer takes checkpoint_format=: pass saving=pimm_fn.Saving(checkpoint_format=...)
    >>> refuse_moved({"keep_snapshots": 3})
    Traceback (most recent call last):
    TypeError: loop() no longer takes keep_snapshots=: pass saving=pimm_fn.Saving(keep=pimm_fn.keep_last(n)), the same policy
    >>> refuse_moved({"optimizers": {}})
    Traceback (most recent call last):
    TypeError: loop() no longer takes optimizers=: pass optimizer={name: optimizer, ...}, which a custom step_fn receives as its 'optimizer'
    """
    for name in given:
        if name in GONE:
            raise TypeError(f"loop() no longer takes {name}=: pass {GONE[name]}")
        if name in MOVED:
            keyword, value = MOVED[name]
            raise TypeError(f"loop() no longer takes {name}=: pass {keyword}=pimm_fn.{value}({name}=...)")
        raise TypeError(f"loop() got an unexpected keyword argument {name!r}")


def check_options(**values) -> None:
    """Each of loop()'s option values is of its type (``saving=`` a ``Saving``...), refused with the fix otherwise.

    >>> check_options(watching={"console": False})
    Traceback (most recent call last):
    TypeError: loop: 'watching' must be a pimm_fn.Watching (got {'console': False}); pass watching=pimm_fn.Watching(...)
    """
    for name, value in values.items():
        kind = _KINDS[name]
        v.instance_of(kind, expected=f"a pimm_fn.{kind.__name__}").with_hint(
            f"pass {name}=pimm_fn.{kind.__name__}(...)"
        ).check(value, name, owner="loop")


_KINDS = {
    "saving": Saving,
    "resuming": Resuming,
    "watching": Watching,
    "parallel": Parallel,
    "training": Training,
    "preemption": Preemption,
}


def loop(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer] | None = None,
    train_data: Iterable[Any] | None = None,
    *,
    hooks: Sequence[Any] = (),
    max_epochs: int | None = None,
    max_steps: int | None = None,
    max_time: float | datetime.timedelta | None = None,
    save_dir: str | os.PathLike | None = None,
    step_fn: Callable[..., Mapping[str, Any]] | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    resume: str | os.PathLike | None = None,
    loggers: Iterable[Any] = (),
    handlers: Mapping[type, Callable[..., Any]] | None = None,
    saving: Saving = Saving(),
    resuming: Resuming = Resuming(),
    watching: Watching = Watching(),
    parallel: Parallel = Parallel(),
    training: Training = Training(),
    preemption: Preemption = Preemption(),
    **moved: Any,
) -> Loop:
    """A training loop over ``train_data`` driven by ``hooks``.

    Args:
        model: what trains; it may be wrapped in DDP.
        optimizer: what steps it; it may be a dict of named ones for a custom ``step_fn``
            (a GAN's ``{"g": opt_g, "d": opt_d}``), which receives the dict
            as its ``optimizer``. Each is checkpointed under its name; a
            resume needs the same names (``pimm_fn.runtime.step.stateful_objects``).
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
        max_time: besides the budget, the wall-clock time this process may
            train (seconds or a ``datetime.timedelta``, counted from
            ``loop()`` on rank 0's clock): the run stops at the last step
            boundary that leaves ``preemption.margin`` before it, saves that
            step and raises ``pimm_fn.Preempted`` (exit code
            ``preemption.exit_code``), as on a preemption signal; a resumed
            run gets its own ``max_time``.
        save_dir: where checkpoints (``model/``) and ``log.jsonl`` go. One run
            at a time: a run that will write takes ``save_dir/pimm_fn.lock``
            first (``pimm_fn.checkpoint.lock``); a finished run opened to be
            read takes none and writes nothing (read-only storage works).
            A URL (``"s3://bucket/exp1"``, ``"gs://..."``, ``"memory://..."``)
            puts the checkpoints on that fsspec store
            (``pimm_fn.checkpoint.storage``; ``pip install 'pimm_fn[s3]'``);
            the logs then stay local: no ``log.jsonl`` is written there.
        step_fn: ``step_fn(model, optimizer, batch, *, scheduler=None,
            scaler=None)``, one optimizer step returning its outputs
            (``{"loss": loss, ...}``); one that cannot take those keywords is
            refused here. Default ``train_step``: ``model(batch)`` with the
            whole batch returns ``{"loss": loss, ...}``. A ``TrainStep``
            configures device, precision, accumulation and clipping; with
            ``loss_fn`` it trains on ``loss_fn(model(input), target)`` of
            ``(input, target)`` batches (``pimm_fn.runtime.step.train_step``);
            with ``accumulate=k`` each step is fed ``k`` batches.
        scheduler: stepped by the default step and checkpointed. When a hook
            steps the scheduler (``step_scheduler(...)``, or any hook declaring
            it emits ``StepScheduler``), the step function is handed
            ``scheduler=None`` and the hook's effects step it instead; such a
            hook needs a ``scheduler``.
        resume: ``None`` (fresh), ``"auto"`` (latest complete checkpoint in
            ``save_dir``; fresh, said, if it holds none; a ``CheckpointError``
            if it holds only damaged ones) or a checkpoint path.
        handlers: ``{EffectType: handler}`` overriding or adding handlers. A
            handler that reads another checkpoint layout (``pimm_fn.checkpoint.discovery``,
            ``pimm_fn.compat.HANDLERS``) lets ``resume`` continue from it. A
            ``Log`` handler replaces the console line only: ``run.history``,
            ``log.jsonl`` and ``loggers`` still get each record
            (``pimm_fn.runtime.handlers.dispatch.RecordedLog``).
        loggers: more destinations of the ``Log`` records, each opened once
            and closed at the end of training and on an error:
            ``pimm_fn.CSVLogger()``, ``TensorBoardLogger()``, ``WandbLogger()``,
            ``MLFlowLogger()``, or any object with ``open``/``write``/``close``
            (``pimm_fn.runtime.logs.loggers``). ``save_dir/log.jsonl`` is always
            written with a ``save_dir``: truncated to the resumed step on
            resume, and a fresh run sets an earlier run's file aside
            (``log.1.jsonl``). ``run.history`` holds the same records.
        saving: how to save (``pimm_fn.Saving``: ``checkpoint_format``, which
            snapshots to ``keep``, ``weights_file``, ``digests``); when to save
            is the hooks'.
        resuming: how a resume treats what changed (``pimm_fn.Resuming``:
            ``strict_resume``, ``resume_hyperparameters``).
        watching: what is shown and kept of the run (``pimm_fn.Watching``:
            ``console``, ``progress``, ``log_reduce``, ``keep_trace``,
            ``sanity_check``: each loader_evaluator on 2 batches before the
            first step, by default).
        parallel: how the run spreads over ranks (``pimm_fn.Parallel``:
            ``ddp``, ``check_agreement``, ``fault_tolerant``: replica groups
            that go on when one fails, ``pimm_fn.FaultTolerance``).
        training: what trains beside the model and optimizer, and how long
            an epoch is (``pimm_fn.Training``: ``on_nonfinite``, ``scaler``,
            ``extra_state``, ``config``, ``iters_per_epoch``).
        preemption: how the run stops when its cluster asks
            (``pimm_fn.Preemption``: ``signals``, ``exit_code``,
            ``save_on_interrupt``, ``margin``, ``check_every``;
            ``pimm_fn.runtime.engine.preemption``).
        **moved: refused: each keyword ``loop()`` took before its options
            were values raises a ``TypeError`` naming the value it moved to
            (``optimizers=`` is ``optimizer={name: opt}``).

    Warns:
        ConfigurationWarning: once each, when a saver precedes an evaluator
            acting on the same mid-epoch step, when an evaluator returns
            ``None`` in a single-process run, and when a metric a hook reads
            (``best_on``, ``early_stop``) is not among what rank-local
            evaluators (``broadcast=False``) publish. With several ``best_on`` metrics each keeps its own
            ``model_best_<metric>.pth``. On resume, for each optimizer
            hyper-parameter that differs from the checkpoint's. When a hook
            reads a metric and no hook evaluates anything; when a resumed
            run's budget is already spent (nothing to train); when
            ``resume="auto"`` starts fresh beside an earlier ``model_best``
            it will replace.
        NonFiniteMetricWarning: each time an evaluation publishes NaN or
            +/-inf for a metric a hook reads, naming it and the step; it
            never becomes the best and training goes on
            (``pimm_fn.runtime.errors``).
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
            scheduler or scaler of the wrong kind, a non-callable ``step_fn``
            or one whose signature cannot take ``scheduler=``/``scaler=``,
            ``handlers`` not mapping effect types to callables
            (``pimm_fn.runtime.engine.arguments``); no optimizer, or a dict of them
            with the built-in step; an option that is not its value
            (``saving=`` not a ``Saving``), or a keyword that moved into one
            (``iters_per_epoch=``, the ``TypeError`` names where;
            ``keep_snapshots=`` is ``saving=Saving(keep=keep_last(n))``). The
            values refuse a bad field when they are made
            (``Training(iters_per_epoch=0)``).
        ValueError: two hooks writing the best weights of one metric (two
            ``best_on`` of it, or pimm's ``CheckpointSaver`` beside one); an
            optimizer holding none of the model's parameters; in the sanity
            check before the first step (``Watching(sanity_check=)``), a
            metric a hook reads that no evaluator publishes
            (``best_on("acc")`` beside ``"val/acc"``), and whatever an
            evaluator raises; while training, such a metric once every
            evaluator has published (``pimm_fn.runtime.errors``).
        NotADirectoryError: ``save_dir`` is a file.
        NonFiniteLossError: (while training) a NaN or infinite loss under
            ``on_nonfinite="raise"``.
        FileExistsError: a fresh run into a ``save_dir`` that holds checkpoints
            or best weights (``model_best*``).
        SaveDirLockError: (on every rank) another run holds ``save_dir``, or
            it cannot be written and this run would train.
        CheckpointStorageError: (on every rank) ``save_dir`` is on a store
            whose bucket does not exist (``Saving(create_bucket=True)``
            creates it), or a rank that writes there cannot (a probe
            created, renamed and deleted before the first step:
            ``pimm_fn.checkpoint.files``); while training, a save the
            storage refused, naming the path and the fix.
        CheckpointError: (on every rank) ``resume=<path>`` is damaged, or
            ``resume="auto"`` found checkpoints and none intact (each named).
        ImportError: ``Parallel(fault_tolerant=...)`` without torchft
            installed (``pip install 'pimm_fn[ft]'``).
        ReplicaError: under ``FaultTolerance``, the lighthouse unreachable
            within ``connect_timeout``; while training, fewer than
            ``min_replicas`` replica groups within ``quorum_timeout``.
    """
    # Every argument is checked here, before anything is built, loaded or written (pimm_fn.runtime.engine.arguments).
    if moved:
        refuse_moved(moved)  # a keyword loop() took before its options were values: where it went
    check_options(
        saving=saving, resuming=resuming, watching=watching, parallel=parallel, training=training, preemption=preemption
    )
    max_time = options.seconds(max_time, "max_time") if max_time is not None else None
    arguments.check_model(model)
    arguments.check_optimizer(optimizer)
    arguments.check_train_data(train_data)
    hooks = check_hooks(hooks)
    arguments.check_best_trackers(hooks)  # one best tracker per metric
    arguments.check_resume(resume)
    arguments.check_arguments(step_fn=step_fn, scheduler=scheduler, handlers=handlers)
    arguments.check_budget(max_epochs, max_steps, fresh=resume is None)
    check_save_dir(hooks, save_dir)
    if (
        storage.is_url(save_dir) and saving.checkpoint_format == "legacy"
    ):  # it publishes by a rename, which a store lacks
        raise ValueError(
            f"loop: Saving(checkpoint_format='legacy') publishes by a rename, which save_dir {save_dir!r} "
            f"(an fsspec store) does not have; use checkpoint_format='standard' there"
        )
    custom_step = not built_in(step_fn)  # a built-in step can leave an update out, and reads the loss before it
    if custom_step:
        check_step_fn(step_fn)  # it takes the loop's call: step_fn(model, optimizer, batch, *, scheduler, scaler)
    arguments.check_on_nonfinite(training.on_nonfinite, custom_step=custom_step)
    check_scheduler_hooks(hooks, scheduler)
    show_bar = progress_bar.wanted(watching.progress, watching.console)  # this process's wish; rank 0's decides, below
    loggers = check_loggers(loggers, watching.log_reduce)
    shards = sharded.is_sharded(unwrap(model))
    arguments.check_sharding(
        shards, ddp=parallel.ddp, checkpoint_format=saving.checkpoint_format, weights_file=saving.weights_file
    )
    optimizer, optimizers = stateful_objects.check_optimizers(optimizer, step_fn, sharded=shards)
    arguments.check_trains_model(model, optimizers or {"optimizer": optimizer})  # not another model's parameters
    extra_state = stateful_objects.extra_state(training.extra_state, hooks, sharded=shards)
    check_fresh_save_dir(resume, save_dir)  # the arguments are right; is save_dir free for a fresh run?
    use_local_cuda_device(model)  # LOCAL_RANK's GPU, before DDP, the guard or DCP allocate on the current one
    if parallel.ddp:
        model = wrap_ddp(model)
    feed = Feed(
        train_data, training.iters_per_epoch, group=getattr(step_fn, "accumulate", 1), exact=training.exact_retry
    )  # k micro-batches a step
    # Rank 0 decides, so every hook list is alike; about 200 moves an epoch keep a long epoch's steps quiet.
    shown = (progress_hook(bar_cadence(feed.iters_per_epoch)),) if dist.broadcast_object(show_bar) else ()
    hook_chain = chain(*protocol.bind(hooks, unwrap(model)), *shown)
    save_dir = storage.location(save_dir) if save_dir is not None else None  # a StorePath for a URL
    scaler = loop_scaler(
        step_fn, training.scaler, model
    )  # a TrainStep(precision="fp16")'s own, checkpointed as scaler=
    tolerant = parallel.fault_tolerant
    if tolerant is not None:  # torchft installed, the group and lighthouse known, what it cannot run refused
        replicas.check(
            tolerant,
            sharded=shards,
            scaler=scaler is not None and scaler.is_enabled(),
            custom_step=custom_step,
        )
        check_group(model)  # a torchrun group's ranks train one model, in DDP
    guarded = dist.is_initialized() and parallel.check_agreement is not False
    # what the hooks imply, derived once (pimm_fn.runtime.engine.implied)
    implied = Implied.of(hook_chain, guarded=guarded)
    averaged = (
        watching.log_reduce == "mean" and dist.world_size() > 1
    )  # every rank joins the average of each training record
    ctx = Context(
        model=model,
        optimizer=optimizer,
        feed=feed,
        save_dir=save_dir,
        scheduler=scheduler,
        scaler=scaler,
        checkpoint_format=saving.checkpoint_format,
        keep=saving.keep,
        rank=dist.rank(),
        world_size=dist.world_size(),
        console=watching.console,
        implied=implied,
        advice=Advice(implied, world_size=dist.world_size()),
        nonfinite=NonFinite(
            training.on_nonfinite,
            world_size=dist.world_size(),
            can_skip=not custom_step,
            replicated=tolerant is not None and not custom_step,  # every group decides alike, before the update
        ),
        exact_retry=training.exact_retry,
        sharded=shards,
        weights_file=saving.weights_file,
        digests=saving.digests,
        everywhere=((WriteBest,) if shards else ()) + ((Log,) if averaged else ()),
        optimizers=optimizers,
        extra_state=extra_state,
    )
    # logs stay local: no log.jsonl on a store (Logs and run_loggers leave a store save_dir out; a logger says so)
    log_dir = replicas.log_dir(save_dir, tolerant) if tolerant is not None else save_dir  # a replica group's own
    ctx.logs = Logs(
        run_loggers(log_dir, loggers),
        save_dir=log_dir,
        say=ctx.say,
        rank=ctx.rank,
        world_size=ctx.world_size,
        reduce=watching.log_reduce,
    )
    ctx.bar = progress_bar.ProgressBar() if shown and ctx.rank == 0 else None
    ctx.replicas = (
        replicas.Replicas(tolerant, ctx.say, feed, agree=parallel.check_agreement is not False)
        if tolerant is not None
        else None
    )
    ctx.stopping = Stopping(
        preemption,
        max_time=max_time,
        world_size=ctx.world_size,
        ticks=implied.ticks,
        tell=ctx.console and ctx.rank == 0,
    )  # its clock: what max_time counts from
    interpreter = Interpreter(
        ctx, run_handlers(handlers), AgreementGuard(implied) if guarded else None, keep_trace=watching.keep_trace
    )
    for message in configuration_messages(hook_chain.hooks):
        warnings.warn(message, ConfigurationWarning, stacklevel=2)
    check_bucket(save_dir, create=saving.create_bucket, say=ctx.say)  # a mistyped bucket: refused, never created
    # Before anything is written there; rank 0's, told to all. Replica groups share save_dir, each its own lock.
    lock_name = replicas.lock_name(ctx.replicas.group) if ctx.replicas is not None else save_dir_lock.LOCK_NAME
    lock = save_dir_lock.take(save_dir, say=ctx.say, name=lock_name)
    with lock.released_on_error():
        # skipped checkpoints said on the console, as any line; a pimm legacy file takes this run's steps per epoch
        info = locate(
            resume,
            save_dir,
            say=ctx.say,
            iters_per_epoch=feed.iters_per_epoch,
            readers=discovery.readers((handlers or {}).values()),
        )  # a plug-in's, with its handlers
        if info is None:  # resume=None, or 'auto' found nothing: a fresh run
            state = fresh_state(
                ctx, hook_chain.hooks, resume=resume, max_epochs=max_epochs, max_steps=max_steps, config=training.config
            )
        else:  # restored here, so what restore() warns is attributed to loop()'s caller
            state = resumed_state(
                restore(
                    info,
                    ctx,
                    hook_chain.hooks,
                    strict=resuming.strict_resume,
                    hyperparameters=resuming.resume_hyperparameters,
                ),
                info,
                ctx,
                max_epochs=max_epochs,
                max_steps=max_steps,
            )
        writes = info is None or not state.finished  # a finished run opened to be read (run.history) writes nothing
        ctx.lock = lock.settle(writes=writes)  # the refusal raised when it will write; else released at once
        if writes and save_dir is not None:  # every rank that writes can write there, before the first step
            files.check_writable(save_dir, every_rank=saving.checkpoint_format == "standard")
        ctx.logs.start(state.progress, resumed=info is not None, writes=writes)  # logs truncated or set aside; history
        prewarm_staging(ctx)  # when a hook saves in the background: its memory, after the first step
        run = Loop(ctx, state, step_fn or train_step, interpreter, resume=resume, resumed=info is not None)
        ctx.nonfinite.where = lambda: run.state.progress  # a NaN loss is reported at the step being trained
        if ctx.replicas is not None:  # the lighthouse joined at this run's step; healed, if behind, at the first quorum
            ctx.replicas.connect(run)
        if watching.sanity_check != 0 and not run.finished:  # evaluators once, their names checked; nothing published
            sanity_check(ctx, watching.sanity_check)
        if info is not None and not run.finished:  # a finished run resumed with its own budget runs no hook at all
            run._dispatch(ev.BeforeTrain(resumed=True))
    weakref.finalize(run, save_dir_lock.release_when_collected, ctx.lock)  # and at training's end (Loop), or at exit
    return run
