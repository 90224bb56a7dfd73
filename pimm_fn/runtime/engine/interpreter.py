"""The only place effects become actions: one handler per effect type, and the context handlers act on.

``Interpreter`` is the executor ``process`` hands each event's effects to.
It runs ``MAIN`` effects on rank 0 only (but those ``ctx.everywhere`` names:
a sharded model's best write, which gathers on every rank), ``COLLECTIVE``
and ``LOCAL`` ones on every rank, records what it executed in ``trace``, and asks the agreement
guard (when on) before anything runs. Handlers are plain functions
``handler(effect, state, ctx) -> follow-up events``; pass your own to
``loop(handlers={EffectType: fn})`` to replace or add one (a ``Log`` handler
replaces how a record is shown; the run still keeps it: ``RecordedLog`` in
``pimm_fn.runtime.handlers.checkpointing``). A handler may be
an object with a ``close()`` (a writer): ``close`` closes it, with the run's
loggers and progress bar, at the end of training and on an error. An effect
class declaring ``traced = False`` (the progress bar's ``ShowProgress``)
only shows the run: it is executed but left out of ``trace``, which so
stays equal to the plan of the run's hooks.

What the effect handlers act on: the model, its optimizer, the data, the files.

What the hooks imply (evaluators, best files, the hook identities slots are
kept by) is not kept here field by field: it is one frozen ``Implied``
(``pimm_fn.runtime.engine.implied``), derived by ``loop()`` and again by
``Loop.replace``; ``hooks``, ``evaluators`` and ``best_per_metric`` read it.
"""

import collections
import warnings
from typing import Any

import attrs
import torch

from pimm_fn.checkpoint.background import BackgroundSaver
from pimm_fn.checkpoint.storage import Location
from pimm_fn.core.effects import SaveCheckpoint, Scope, WriteBest
from pimm_fn.core.trace import TraceEntry
from pimm_fn.runtime.engine.implied import Implied
from pimm_fn.runtime.errors import Advice, MissingHandlerError

__all__ = [
    "Interpreter",
    "KEEP_TRACE",
    "Context",
    "unwrap",
]


_WRITES = (SaveCheckpoint, WriteBest)  # under FaultTolerance, written by one replica group only

KEEP_TRACE = 10_000  # executed effects a run keeps in its trace by default: the newest, so a long run stays flat


class Interpreter:
    """Executes effects through ``handlers`` against ``ctx``."""

    def __init__(self, ctx, handlers: dict, guard=None, *, keep_trace: int | None = KEEP_TRACE):
        self.ctx = ctx
        self.handlers = dict(handlers)
        self.guard = guard
        # The newest ``keep_trace`` executed effects (``None``: all of them, for whoever asks).
        self.trace: collections.deque[TraceEntry] = collections.deque(maxlen=keep_trace)
        self._skipped = None  # an event whose effects diverged across ranks: they do not run

    def handler_for(self, effect):
        for cls in type(effect).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None:
                return handler
        known = ", ".join(sorted(c.__name__ for c in self.handlers))
        raise MissingHandlerError(
            f"no handler for effect {effect!r}: pass loop(handlers={{{type(effect).__name__}: fn}}) "
            f"(handlers known: {known})"
        )

    def check(self, state, event, emitted) -> None:
        if self.guard is not None and not self.guard.check(state, event, emitted):
            self._skipped = event  # the guard raises on every rank at its next sync point
        replicas = self.ctx.replicas
        if replicas is not None and replicas.agreement is not None:
            replicas.agreement.fold(event, emitted)  # compared with the other replica groups at the next vote

    def settle(self) -> None:
        """Wait for the guard's last comparison (at the end of a run, on every rank)."""
        if self.guard is not None:
            self.guard.settle()

    def skips(self, entry) -> bool:
        """Whether ``entry``'s effect is skipped here: its event's watched effects diverged across ranks."""
        return entry.event is self._skipped and self.guard.skips(entry)

    def execute(self, state, entry) -> tuple:
        if self.skips(entry):
            return ()
        effect = entry.effect
        if effect.scope is Scope.MAIN and self.ctx.rank != 0 and effect.__class__ not in self.ctx.everywhere:
            return ()
        replicas = self.ctx.replicas
        if replicas is not None and effect.__class__ in _WRITES and not replicas.writes:
            return ()  # one replica group writes each file: the quorum's participating rank 0
        handler = self.handler_for(effect)
        followups = handler(effect, state, self.ctx)
        if getattr(effect, "traced", True):  # an effect that only shows the run (the bar's) is left out
            self.trace.append(entry)
        return tuple(followups or ())

    def close(self, *, on_error: bool = False) -> None:
        """Close the run's writers (``Context.close``) and every handler object with a ``close()``.

        At the end of training and on an error; each opens again when next
        used. On an error (``on_error``) a failure to close is a warning, so
        that it does not hide the error being raised.
        """
        objects = {id(h): h for h in self.handlers.values()}.values()  # one close each, however many types it handles
        closers = [self.ctx.close] + [h.close for h in objects if callable(getattr(h, "close", None))]
        for close in closers:
            try:
                close()
            except Exception as error:  # noqa: BLE001 - every writer gets closed
                if not on_error:
                    raise
                warnings.warn(f"closing the run's writers failed while stopping on an error: {error!r}", stacklevel=2)


def unwrap(model):
    """The module inside a DDP / FSDP / compiled wrapper."""
    while True:
        inner = _wrapped(model, "module") or _wrapped(model, "_orig_mod")
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _wrapped(model, name: str):
    """``getattr(model, name, None)``; a module without a submodule, attribute or class attribute ``name`` answers
    ``None`` at once, without the AttributeError its ``__getattr__`` raises (most of a 4 µs ``unwrap``)."""
    if (
        isinstance(model, torch.nn.Module)
        and name not in model._modules
        and name not in model.__dict__
        and getattr(type(model), name, None) is None
    ):
        return None
    return getattr(model, name, None)


@attrs.define
class Context:
    """The impure objects of one run, shared by the interpreter's handlers.

    Only handlers touch it; hooks never see it. A handler of your own
    (``loop(handlers={Effect: fn})``, or a function a ``Call`` names) may
    rely on these, kept stable (``docs/hooks.md``, *Effects of your own*):
    ``model`` (inside DDP under ``Parallel(ddp=True)``: ``unwrap(ctx.model)``
    is yours, ``weights()`` its state_dict), ``optimizer`` (``named_optimizers()``
    for several), ``scheduler``, ``scaler``, ``rank``, ``world_size``,
    ``save_dir`` (a ``Path``; a ``StorePath`` for a URL; ``None`` without
    one), ``say(message)`` (a console line from rank 0, above the progress
    bar), ``evaluators`` and ``extra_state``.
    Every other field is the runtime's own and may change.
    """

    model: Any
    optimizer: Any
    feed: Any
    save_dir: Location | None  # a StorePath for a URL save_dir (pimm_fn.checkpoint.storage)
    scheduler: Any = None
    scaler: Any = None
    checkpoint_format: str = "standard"
    digests: bool = False  # record each checkpoint file's SHA-256 in its marker (loop(saving=Saving(digests=)))
    keep: Any = None  # the retention policy of iter_<step> snapshots (pimm_fn.core.retention); None: keep all
    rank: int = 0
    world_size: int = 1
    console: bool = True
    implied: Implied | None = None  # what the run's hooks imply; None: a context built by hand, without hooks
    advice: Advice | None = None  # the run's Advice, told of every evaluation
    nonfinite: Any = (
        None  # the step's NonFinite policy for a NaN/inf loss (loop(training=Training(on_nonfinite=))); None: no check
    )
    exact_retry: bool = True  # run() after an exception continues exactly (loop(training=Training(exact_retry=)))
    saver: BackgroundSaver = attrs.Factory(BackgroundSaver)  # background saves: in flight, prewarm, optimizer hooks
    sharded: bool = False  # the model keeps DTensor parameters (FSDP2): its state goes through DCP's state_dict API
    weights_file: bool = True  # a sharded model's checkpoints gather its full weights into model.pth
    everywhere: tuple = ()  # main-rank effect types every rank executes (a sharded model's WriteBest gathers)
    optimizers: dict | None = None  # loop(optimizer={name: opt}): name -> optimizer; ``optimizer`` is this dict too
    extra_state: dict = attrs.Factory(
        dict
    )  # loop(training=Training(extra_state=)) and the ema() averages: name -> object with state_dict()
    logs: Any = (
        None  # the run's Logs: its loggers, history and clock (pimm_fn.runtime.handlers.logs); the Log handler's
    )
    bar: Any = None  # the run's ProgressBar on the main rank when one is shown (pimm_fn.runtime.handlers.progress)
    lock: Any = None  # the save_dir lock (pimm_fn.checkpoint.lock): released when training ends
    stopping: Any = None  # preemption and max_time (pimm_fn.runtime.engine.preemption.Stopping); None: never asked
    replicas: Any = None  # this replica group under FaultTolerance (pimm_fn.runtime.replicas.switch); None: off

    @property
    def hooks(self) -> tuple | None:
        """The run's top-level hooks: a checkpoint keeps their slots by identity (``None``: by position)."""
        return self.implied.hooks.hooks if self.implied is not None else None

    @property
    def evaluators(self):
        """``{name: fn}`` of the evaluators the hooks provide."""
        return self.implied.evaluators if self.implied is not None else {}

    @property
    def best_per_metric(self) -> bool:
        """Several metrics' best weights are kept: one ``model_best_<metric>`` file each."""
        return self.implied is not None and self.implied.best_per_metric

    def named_optimizers(self) -> dict:
        """``{name: optimizer}``: the run's named optimizers, or ``{None: optimizer}`` for its one optimizer."""
        return self.optimizers if self.optimizers is not None else {None: self.optimizer}

    def wait_for_save(self) -> None:
        """Block until the background save in flight (if any) is published."""
        self.saver.wait()

    @property
    def model_dir(self) -> Location:
        if self.save_dir is None:
            raise ValueError(
                "this run has no save_dir, but a hook asked to write a checkpoint: pass save_dir= to loop()"
            )
        return self.save_dir / "model"

    def weights(self) -> dict:
        """The model's state_dict without DDP's ``module.`` prefix."""
        return unwrap(self.model).state_dict()

    def say(self, message: str) -> None:
        """A line for the console, from the main rank; above the progress bar while one is shown, not through it."""
        if self.console and self.rank == 0:
            if self.bar is not None and self.bar.showing:
                self.bar.write(f"[pimm_fn] {message}")
            else:
                print(f"[pimm_fn] {message}", flush=True)

    def close(self) -> None:
        """Close the run's writers (loggers, progress bar) and its background saver: at the end of training and on an error.

        Each opens again when next used, appending: a notebook's run
        continued after an exception writes on where it stopped.
        """
        if self.bar is not None:
            self.bar.close()
        if self.logs is not None:
            self.logs.close()
        self.saver.close()  # last: finishing a save's copy may raise that save's error
