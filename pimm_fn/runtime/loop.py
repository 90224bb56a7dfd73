"""The driver: a training loop you can call, step, inspect and resume.

``Loop`` owns the impure work (iterating data, the train step) and walks the
lifecycle the pure core defines, handing each event to ``process`` with the
interpreter as executor. Its ``state`` is always a plain value, so a notebook
can look at it between steps.
"""

import warnings
from pathlib import Path

import torch

from pimm_fn.checkpoint import dist
from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.fold import chain, process
from pimm_fn.core.plan import initial_state
from pimm_fn.core.schedule import advance, next_event, resume_from
from pimm_fn.runtime import arguments
from pimm_fn.runtime.advice import Advice, ConfigurationWarning, saver_before_evaluator
from pimm_fn.runtime.context import Context, unwrap
from pimm_fn.runtime.control import check_scheduler_hooks, hooks_step_scheduler
from pimm_fn.runtime.feed import Feed
from pimm_fn.runtime.guard import AgreementGuard
from pimm_fn.runtime.handlers import DEFAULT_HANDLERS, prewarm_staging
from pimm_fn.runtime.interpreter import Interpreter
from pimm_fn.runtime.resume import locate, restore
from pimm_fn.runtime.step import _optimize, scalar_outputs, train_step, train_step_scalars

__all__ = ["Loop", "loop"]

_CLOSING = (ev.AfterEpoch, ev.AfterTrain)  # the events a step() runs after its AfterStep
_Tensor = torch.Tensor


def _batch_size(batch) -> int:
    cls = batch.__class__
    if (cls is tuple or cls is list) and batch:  # the common (inputs, targets) batch, without a getattr miss
        first = batch[0]
        if first.__class__ is _Tensor:  # a plain tensor: its shape, without a call
            shape = first.shape
            return shape[0] if shape else 0
        return _batch_size(first)
    shape = getattr(batch, "shape", None)
    if shape:
        return int(shape[0])
    if isinstance(batch, dict):
        return max((_batch_size(v) for v in batch.values()), default=0)
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    return 0


def _default_quiet(model, optimizer, batch, scheduler, scaler) -> dict:
    _optimize(model, optimizer, batch, scheduler, scaler)
    return {}


def _runner(step_fn, read: bool):
    """``run(model, optimizer, batch, scheduler, scaler) -> scalar outputs`` for ``step_fn``.

    Only hooks read the outputs: when none listens to ``AfterStep`` (``read``
    False) the conversion, a device sync on GPU, is skipped. The default step
    converts its own outputs, knowing which entries are scalars.
    """
    if step_fn is train_step:
        return train_step_scalars if read else _default_quiet
    if read:
        def run(model, optimizer, batch, scheduler, scaler):
            return scalar_outputs(step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler))
    else:
        def run(model, optimizer, batch, scheduler, scaler):
            step_fn(model, optimizer, batch, scheduler=scheduler, scaler=scaler)
            return {}
    return run


class Loop:
    """A training run in progress. Build it with ``loop(...)``.

    When a hook declares that it emits ``StepScheduler``, the step function
    is handed ``scheduler=None``: the hook's effects step the scheduler.

    Attributes:
        state: the current ``State`` (progress, metrics, best values, slots).
        trace: the effects executed so far, as ``TraceEntry`` values.
    """

    def __init__(self, ctx: Context, hooks, state, step_fn, interpreter):
        self.ctx = ctx
        self.hooks = hooks
        self.state = state
        self._step_fn = step_fn
        self._interpreter = interpreter
        self._peeked = (None, None)  # (state, next_event(state)): the step's tail computes the next head
        # Event classes that process() must see: some hook wants them, or the guard compares them.
        guard = getattr(interpreter, "guard", None)
        self._processed = {
            cls: bool(hooks.active(cls)) or (guard is not None and guard.watches(cls)) for cls in ev.LIFECYCLE
        }
        self._run_step = _runner(step_fn, self._processed[ev.AfterStep])
        self._scheduler_in_step = not hooks_step_scheduler(hooks.hooks)  # else the hooks step it

    @property
    def trace(self) -> list:
        return list(self._interpreter.trace)

    @property
    def finished(self) -> bool:
        return self.state.finished

    def _dispatch(self, event) -> None:
        if self._processed.get(event.__class__, True):
            self.state = process(self.hooks, self.state, event, self._interpreter)
        else:  # no hook wants it and no guard compares it: process() would only advance
            self.state = advance(self.state, event)

    def _next_event(self) -> ev.Event | None:
        """``next_event(self.state)``, computed once per state."""
        state, event = self._peeked
        if state is not self.state:
            event = next_event(self.state)
            self._peeked = (self.state, event)
        return event

    def _train(self, step: int) -> ev.AfterStep:
        """Train global step ``step``; returns its ``AfterStep``."""
        ctx = self.ctx
        batch = ctx.feed.next_batch()
        scheduler = ctx.scheduler if self._scheduler_in_step else None
        scalars = self._run_step(ctx.model, ctx.optimizer, batch, scheduler, ctx.scaler)
        return ev.after_step(step, scalars, _batch_size(batch))

    def _advance(self) -> ev.Event | None:
        """Run the next lifecycle event; returns it, or None when training is over."""
        event = self._next_event()
        cls = event.__class__  # next_event builds exact lifecycle classes
        if cls is ev.AfterStep:
            event = self._train(event.step)
        elif cls is ev.BeforeEpoch:
            self.ctx.feed.start_epoch(event.epoch)
        elif cls is ev.AfterEpoch:
            self.ctx.feed.end_epoch()
        elif event is None:
            return None
        self._dispatch(event)
        if cls is ev.AfterTrain:
            self._interpreter.settle()  # every rank learns of a divergence in the last events
            self.ctx.wait_for_save()  # training ends with every checkpoint published
        return event

    def step(self) -> "Loop":
        """Train one step, with the events around it (epoch end, training end).

        After a stop was requested (``State.stop``) the epoch closes and
        training ends within this call; a call on a stopped run that had not
        closed yet (resumed from a checkpoint of the stopping step) only
        runs the closing events.
        """
        state = self.state
        p = state.progress
        position = state.position
        mid_epoch = position == "BeforeEpoch" or (position == "AfterStep" and p.iter_in_epoch < p.iters_per_epoch)
        if mid_epoch and state.stop is None:
            # Mid-epoch: the next events are BeforeStep and AfterStep of the next step.
            step = p.global_step + 1
            if self._processed[ev.BeforeStep]:
                self._dispatch(ev.BeforeStep(step))
            # Else BeforeStep's only effect would be State.position = "BeforeStep", which
            # the AfterStep below overwrites: skipped. A step that raises then leaves the
            # state as it was before the step, and the next step() trains it again.
            self._dispatch(self._train(step))
            if not self.state.progress.at_epoch_end and self.state.stop is None:
                return self  # the next event is a BeforeStep: nothing closes
        else:
            while True:
                event = self._advance()
                if event is None or event.__class__ is ev.AfterStep:
                    break
        while self._next_event().__class__ in _CLOSING:
            self._advance()
        return self

    def run(self, steps: int | None = None):
        """Train ``steps`` more steps, or to the end; returns the state."""
        p = self.state.progress
        if self.finished or p.global_step >= p.max_steps:
            # A checkpoint of the last step may predate AfterTrain (its save was the deferred
            # epoch-end one): then only the closing events remain, and no step to train.
            self.ctx.say(f"training already finished at step {p.global_step}: nothing to do")
            if self.finished:
                return self.state
        done = 0
        while not self.finished and (steps is None or done < steps):
            self.step()
            done += 1
        self.ctx.wait_for_save()  # what run() returns is on disk, as a notebook expects
        return self.state

    def __call__(self):
        """Train to the end; returns the final state."""
        return self.run()

    def __repr__(self):
        p = self.state.progress
        return f"<Loop step {p.global_step}/{p.max_steps}, epoch {p.epoch}, hooks={list(self.hooks.hooks)!r}>"


def _wrap_ddp(model):
    """``model`` in DistributedDataParallel, when a process group exists and it is not wrapped yet."""
    if not dist.is_initialized() or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def loop(
    model,
    optimizer,
    train_data,
    *,
    hooks=(),
    max_epochs: int,
    save_dir=None,
    step_fn=None,
    scheduler=None,
    scaler=None,
    resume=None,
    iters_per_epoch: int | None = None,
    checkpoint_format: str = "standard",
    keep_snapshots: int | None = None,
    check_agreement: bool | None = None,
    strict_resume: bool = False,
    handlers=None,
    config=None,
    console: bool = True,
    ddp: bool = False,
) -> Loop:
    """A training loop over ``train_data`` driven by ``hooks``.

    Args:
        model, optimizer: what trains; the model may be wrapped in DDP.
        train_data: a DataLoader, a StatefulDataLoader (exact mid-epoch
            resume), or any re-iterable with ``len``.
        hooks: a list (or tuple) of hooks, run in this order for every
            event; chains nest freely. Each hook's identity must be unique
            in its list (see ``pimm_fn.chain(..., name=)``).
        max_epochs: epochs to train (>= 1 for a fresh run).
        save_dir: where checkpoints (``model/``) and ``log.jsonl`` go.
        step_fn: ``step_fn(model, optimizer, batch, *, scheduler, scaler)``
            returning a mapping of outputs; default ``train_step``.
        scheduler, scaler: stepped by the default step and checkpointed.
            When a hook steps the scheduler (``step_scheduler(...)``, or any
            hook declaring it emits ``StepScheduler``), the step function is
            handed ``scheduler=None`` and the hook's effects step it instead;
            such a hook needs a ``scheduler``.
        resume: ``None`` (fresh), ``"auto"`` (latest complete checkpoint in
            ``save_dir``, fresh if none) or a checkpoint path.
        iters_per_epoch: steps per epoch (default ``len(train_data)``).
        checkpoint_format: ``"standard"`` (weights + DCP directory) or
            ``"legacy"`` (one file).
        keep_snapshots: keep only the newest N ``iter_<step>`` snapshots.
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
        handlers: ``{EffectType: handler}`` overriding or adding handlers.
        config: initial ``State.config``.
        console: print progress lines on the main rank.
        ddp: wrap ``model`` in ``DistributedDataParallel`` when a process
            group is initialized (a no-op without one, or when it is already
            wrapped); the wrapper is ``run.ctx.model``. Build the optimizer on
            ``model.parameters()`` before or after: DDP keeps the same tensors.

    Warns:
        ConfigurationWarning: once each, when a saver precedes an evaluator
            acting on the same mid-epoch step, when an evaluator returns
            ``None`` in a single-process run, and when a metric a hook reads
            (``best_on``, ``early_stop``) is not among what the evaluators
            publish. With several ``best_on`` metrics each keeps its own
            ``model_best_<metric>.pth``.

    Raises:
        TypeError, ValueError: a malformed argument, said before anything is
            built: ``hooks`` not a list, an uncalled hook factory, a ``resume``
            that is not ``None``/``"auto"``/a path, a saving hook without
            ``save_dir``, ``max_epochs < 1`` on a fresh run, a hook stepping
            the scheduler with ``scheduler=None`` or after a saver.
        FileExistsError: a fresh run into a ``save_dir`` that holds checkpoints.
    """
    if checkpoint_format not in ("standard", "legacy"):
        raise ValueError(f"checkpoint_format must be 'standard' or 'legacy' (got {checkpoint_format!r})")
    hooks = protocol.check_hooks(hooks)
    arguments.check_resume(resume)
    arguments.check_max_epochs(max_epochs, fresh=resume is None)
    arguments.check_save_dir(hooks, save_dir)
    check_scheduler_hooks(hooks, scheduler)
    if ddp:
        model = _wrap_ddp(model)
    hooks = chain(*protocol.bind(hooks, unwrap(model)))
    save_dir = Path(save_dir) if save_dir is not None else None
    feed = Feed(train_data, iters_per_epoch)
    ctx = Context(
        model=model, optimizer=optimizer, feed=feed, save_dir=save_dir, scheduler=scheduler, scaler=scaler,
        evaluators=protocol.evaluators(hooks.hooks), checkpoint_format=checkpoint_format, keep_snapshots=keep_snapshots,
        rank=dist.rank(), world_size=dist.world_size(), console=console,
        hooks=hooks.hooks,
        best_per_metric=len(arguments.best_metrics(hooks.hooks)) > 1,
        advice=Advice(hooks.hooks, world_size=dist.world_size()),
    )
    guarded = dist.is_initialized() and check_agreement is not False
    interpreter = Interpreter(ctx, {**DEFAULT_HANDLERS, **(handlers or {})}, AgreementGuard(hooks) if guarded else None)
    for message in saver_before_evaluator(hooks.hooks, iters_per_epoch=feed.iters_per_epoch, max_epochs=max_epochs):
        warnings.warn(message, ConfigurationWarning, stacklevel=2)
    info = locate(resume, save_dir)
    if info is None:
        arguments.check_max_epochs(max_epochs, fresh=True)  # resume='auto' found nothing: a fresh run
        state = initial_state(
            hooks.hooks, iters_per_epoch=feed.iters_per_epoch, max_epochs=max_epochs,
            rank=ctx.rank, world_size=ctx.world_size, config=config,
        )
    else:
        state = restore(info, ctx, hooks.hooks, strict=strict_resume)
        state = resume_from(state, max_epochs=max_epochs)
        ctx.say(f"resumed from {info.path} at step {state.progress.global_step}")
    prewarm_staging(ctx, hooks.hooks)  # when a hook saves in the background: its memory, after the first step
    run = Loop(ctx, hooks, state, step_fn or train_step, interpreter)
    if info is not None:
        run._dispatch(ev.BeforeTrain(resumed=True))
    return run
