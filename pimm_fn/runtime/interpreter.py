"""The only place effects become actions: one handler per effect type.

``Interpreter`` is the executor ``process`` hands each event's effects to.
It runs ``MAIN`` effects on rank 0 only (but those ``ctx.everywhere`` names:
a sharded model's best write, which gathers on every rank), ``COLLECTIVE``
and ``LOCAL`` ones on every rank, records what it executed in ``trace``, and asks the agreement
guard (when on) before anything runs. Handlers are plain functions
``handler(effect, state, ctx) -> follow-up events``; pass your own to
``loop(handlers={EffectType: fn})`` to replace or add one (a ``Log`` handler
replaces how a record is shown; the run still keeps it: ``RecordedLog`` in
``pimm_fn.runtime.handlers``). A handler may be
an object with a ``close()`` (a writer): ``close`` closes it, with the run's
loggers and progress bar, at the end of training and on an error. An effect
class declaring ``traced = False`` (the progress bar's ``ShowProgress``)
only shows the run: it is executed but left out of ``trace``, which so
stays equal to the plan of the run's hooks.
"""

import collections
import warnings

from pimm_fn.core.effects import Scope

__all__ = ["Interpreter", "MissingHandlerError", "KEEP_TRACE"]

KEEP_TRACE = 10_000  # executed effects a run keeps in its trace by default: the newest, so a long run stays flat


class MissingHandlerError(LookupError):
    """An effect was requested that no handler executes."""


class Interpreter:
    """Executes effects through ``handlers`` against ``ctx``."""

    def __init__(self, ctx, handlers: dict, guard=None, *, keep_trace: int | None = KEEP_TRACE):
        self.ctx = ctx
        self.handlers = dict(handlers)
        self.guard = guard
        # The newest ``keep_trace`` executed effects (``None``: all of them, for whoever asks).
        self.trace = collections.deque(maxlen=keep_trace)
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

    def settle(self) -> None:
        """Wait for the guard's last comparison (at the end of a run, on every rank)."""
        if self.guard is not None:
            self.guard.settle()

    def execute(self, state, entry) -> tuple:
        if entry.event is self._skipped and self.guard.skips(entry):
            return ()
        effect = entry.effect
        if effect.scope is Scope.MAIN and self.ctx.rank != 0 and effect.__class__ not in self.ctx.everywhere:
            return ()
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
