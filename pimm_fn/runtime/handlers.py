"""The default handler of each built-in effect.

A handler is ``handler(effect, state, ctx) -> follow-up events``; it is the
only code that touches files, process groups, the console and the model.
"""

import importlib

from pimm_fn import checkpoint
from pimm_fn.checkpoint import sharded
from pimm_fn.checkpoint.contents import to_parts
from pimm_fn.core.effects import Call, Evaluate, LoadWeights, Log, SaveCheckpoint, WriteBest
from pimm_fn.runtime.background_staging import gate_optimizers
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime.ema import EMA_HANDLERS
from pimm_fn.runtime.loggers import run_loggers
from pimm_fn.runtime.log_feed import Logs
from pimm_fn.runtime.evaluation import evaluate  # the Evaluate handler, with the evaluator's mode
from pimm_fn.runtime.interpreter import MissingHandlerError
from pimm_fn.runtime.save_contents import saved_weights, trainer_contents, weights_for_background

__all__ = [
    "DEFAULT_HANDLERS", "save_checkpoint", "write_best", "evaluate", "log", "load_weights", "call", "resolve",
    "RecordedLog", "run_handlers",
]


def save_checkpoint(effect: SaveCheckpoint, state, ctx) -> tuple:
    saver = ctx.saver
    saver.wait()  # never two saves in flight
    if saver.prewarm is not None and saver.arming is not None:  # it fired: off the optimizer, now that it is idle
        saver.arming.remove()
        saver.arming = None
    background = effect.async_save and ctx.checkpoint_format == "standard"
    contents = trainer_contents(ctx, state, background=background)
    replicated, local = to_parts(contents)
    if background:
        gate_optimizers(ctx)
        saver.save(
            ctx.model_dir,
            step=effect.step,
            weights=saved_weights(ctx) if ctx.sharded else weights_for_background(ctx),
            trainer=replicated,
            local=local,
            snapshot=effect.snapshot,
            sharded=contents.sharded,
            keep=ctx.keep,
            metrics=state.metrics,  # recorded in the marker: what keep_best ranks snapshots by
            digests=ctx.digests,
        )
        ctx.say(f"saving checkpoint of step {effect.step} to {ctx.model_dir} in the background")
        return ()
    info = checkpoint.save_checkpoint(
        ctx.model_dir,
        step=effect.step,
        weights=saved_weights(ctx),
        trainer=replicated,
        local=local,
        format=ctx.checkpoint_format,
        snapshot=effect.snapshot,
        sharded=contents.sharded,
        keep=ctx.keep,
        metrics=state.metrics,
        digests=ctx.digests,
        saved_for=effect.saved_for,  # a preemption save (pimm_fn.runtime.preemption): its marker says why
    )
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
        ctx.model_dir, weights, metric=effect.metric, value=effect.value, step=effect.step,
        per_metric=ctx.best_per_metric, digests=ctx.digests,
    )
    ctx.say(f"new best {effect.metric}={effect.value:.6g} at step {effect.step}: wrote {path}")
    return ()


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


def log(effect: Log, state, ctx) -> tuple:
    """Rank 0 hands the record to the run's loggers and history, then says it with the time and pace.

    Under ``loop(watching=Watching(log_reduce="mean"))`` every rank runs it (``ctx.everywhere``)
    and averages a training record over the ranks first (``Logs.over_ranks``).
    """
    logs = _logs(ctx)
    effect = logs.over_ranks(effect)
    if ctx.rank != 0:
        return ()
    logs.write(effect)
    fields = " ".join(f"{k}={_format(v)}" for k, v in effect.values.items())
    ctx.say(f"step {effect.step} {effect.kind}: {fields}{logs.pace(effect.kind, state.progress)}")
    return ()


def _logs(ctx) -> Logs:
    if ctx.logs is None:  # a context built by hand: the console, and save_dir's log.jsonl appended to (none on a store)
        ctx.logs = Logs(run_loggers(ctx.save_dir, ()), save_dir=ctx.save_dir, say=ctx.say, rank=ctx.rank,
                        world_size=ctx.world_size)
    return ctx.logs


class RecordedLog:
    """A ``Log`` handler of the user's (``loop(handlers={Log: show})``), with the run still remembering each record.

    ``show`` replaces how a record is shown (the default's console line),
    not whether the run keeps it: each record, averaged over the ranks
    first under ``log_reduce="mean"``, reaches ``run.history``,
    ``log.jsonl`` and the ``loggers=`` once, after ``show`` returned (a
    ``show`` that raises is retried with the step, and nothing is kept
    twice). ``show`` is handed that record; one that calls the default
    ``pimm_fn.runtime.handlers.log`` itself keeps it through that call.
    """

    def __init__(self, show):
        self.show = show

    def __call__(self, effect: Log, state, ctx) -> tuple:
        logs = _logs(ctx)
        record = logs.over_ranks(effect)
        written = logs.written
        followups = self.show(record, state, ctx)
        if ctx.rank == 0 and logs.written == written:
            logs.write(record)
        return followups

    def close(self) -> None:
        close = getattr(self.show, "close", None)
        if callable(close):
            close()

    def __repr__(self):
        return f"RecordedLog({self.show!r})"


def run_handlers(given) -> dict:
    """The run's handlers: the defaults, overridden or added to by ``given`` (a user's ``Log`` handler recorded)."""
    given = dict(given or {})
    if Log in given and given[Log] is not log and not isinstance(given[Log], RecordedLog):
        given[Log] = RecordedLog(given[Log])
    return {**DEFAULT_HANDLERS, **profiler_handlers(), **given}  # a profiler of its own for each run


def load_weights(effect: LoadWeights, state, ctx) -> tuple:
    """Warm start in pimm_fn's dialect; another dialect's request goes to the handler its plug-in provides."""
    if effect.dialect != "pimm_fn":
        raise MissingHandlerError(
            f"no handler for {effect!r}: a warm start in the {effect.dialect!r} dialect is carried out by the "
            f"handlers of the plug-in that asks for it; pass them to the loop (for 'pimm': "
            f"loop(handlers=pimm_fn.compat.HANDLERS))"
        )
    module = unwrap(ctx.model)
    source = checkpoint.load_weights_file(effect.path)
    targets = module.state_dict().keys()
    remapped, report = checkpoint.remap_state_dict(source, dict(effect.replacements) or None, targets)
    if not report.loaded:
        raise ValueError(
            f"load_weights({effect.path!r}): after remapping, no key of the file matches the model "
            f"(file keys look like {list(remapped)[:3]}, model keys like {list(targets)[:3]}); "
            f"pass replacements={{old_prefix: new_prefix}} to map them"
        )
    if ctx.sharded:
        sharded.load_full_weights(module, remapped, strict=effect.strict)
    else:
        module.load_state_dict(remapped, strict=effect.strict)
    ctx.say(f"loaded weights from {effect.path}: {report.summary()}")
    return ()


_MISSING = object()


def resolve(effect: Call):
    """The callable ``effect.function`` names (``"module:qualname"``), its module imported if need be.

    Raises:
        LookupError: the module cannot be imported, holds no such name, or
            the name is not callable; saying which, and the fix.
    """
    module, _, qualname = effect.function.partition(":")
    fix = "name a function defined at the top level of a module; Call.of(fn, step) writes its name"
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise LookupError(f"{effect!r}: module {module!r} cannot be imported ({error}): {fix}") from None
    for name in qualname.split("."):
        inner = getattr(found, name, _MISSING)
        if inner is _MISSING:
            raise LookupError(
                f"{effect!r}: {getattr(found, '__name__', found)!r} has no attribute {name!r}, so "
                f"{effect.function!r} names nothing: {fix}"
            )
        found = inner
    if not callable(found):
        raise LookupError(
            f"{effect!r}: {effect.function!r} names {found!r:.60} ({type(found).__name__}), not a function: {fix}"
        )
    return found


def call(effect: Call, state, ctx) -> tuple:
    """``fn(state, ctx, *args, **kwargs)`` of the function ``effect`` names; what it returns is not used (see ``Call``)."""
    resolve(effect)(state, ctx, *effect.args, **effect.kwargs)
    return ()


from pimm_fn.runtime.control import CONTROL_HANDLERS  # noqa: E402 - Stop and StepScheduler, in their own module
from pimm_fn.hooks.progress import ShowProgress  # noqa: E402 - the progress bar's effect, with its hook
from pimm_fn.runtime.progress_bar import show_progress  # noqa: E402
from pimm_fn.runtime.profiler import profiler_handlers  # noqa: E402 - pimm_fn.profile's effects, one Profiler a run

DEFAULT_HANDLERS = {
    SaveCheckpoint: save_checkpoint,
    WriteBest: write_best,
    Evaluate: evaluate,
    Log: log,
    LoadWeights: load_weights,
    Call: call,
    **CONTROL_HANDLERS,
    **EMA_HANDLERS,
    ShowProgress: show_progress,
}
