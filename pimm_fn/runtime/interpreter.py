"""The only place effects become actions: one handler per effect type.

``Interpreter`` is the executor ``process`` hands each event's effects to.
It runs ``MAIN`` effects on rank 0 only (but those ``ctx.everywhere`` names:
a sharded model's best write, which gathers on every rank), ``COLLECTIVE``
and ``LOCAL`` ones on every rank, records what it executed in ``trace``, and asks the agreement
guard (when on) before anything runs. Handlers are plain functions
``handler(effect, state, ctx) -> follow-up events``; pass your own to
``loop(handlers={EffectType: fn})`` to replace or add one.
"""

from pimm_fn.core.effects import Scope
from pimm_fn.core.fold import TraceEntry

__all__ = ["Interpreter", "MissingHandlerError"]


class MissingHandlerError(LookupError):
    """An effect was requested that no handler executes."""


class Interpreter:
    """Executes effects through ``handlers`` against ``ctx``."""

    def __init__(self, ctx, handlers: dict, guard=None):
        self.ctx = ctx
        self.handlers = dict(handlers)
        self.guard = guard
        self.trace: list[TraceEntry] = []
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

    def execute(self, state, entry: TraceEntry) -> tuple:
        if entry.event is self._skipped and self.guard.skips(entry):
            return ()
        effect = entry.effect
        if effect.scope is Scope.MAIN and self.ctx.rank != 0 and effect.__class__ not in self.ctx.everywhere:
            return ()
        handler = self.handler_for(effect)
        followups = handler(effect, state, self.ctx)
        self.trace.append(entry)
        return tuple(followups or ())
