"""What ``simulate`` returns: each rank's executed effects (``SimEntry``) and where each rank ended."""

import attrs

from pimm_fn.core.effects import Effect, Scope
from pimm_fn.core.events import Event
from pimm_fn.core.fold import Chain, TraceEntry

__all__ = ["SimEntry", "SimulationResult"]


@attrs.frozen
class SimEntry:
    """One effect a rank executed.

    Attributes:
        step: the global step when it executed.
        event: the event whose hooks emitted it (rank-local ``AfterStep``
            outputs included).
        effect: what was requested.
        hook: the emitting hook's index in the hook list.
        rank: the rank that executed it.
        during: the lifecycle event (by name) being processed, which is the
            entry's own event or the one whose follow-up (``MetricsPublished``)
            emitted it. ``(step, during)`` names the same moment on every rank.
    """

    step: int
    event: Event
    effect: Effect
    hook: int
    rank: int
    during: str | None = None

    def to_trace_entry(self) -> TraceEntry:
        """This entry as ``plan`` reports it."""
        return TraceEntry(self.step, self.event, self.effect, self.hook)


@attrs.frozen
class SimulationResult:
    """What every rank executed, and where it ended.

    Attributes:
        hooks: the simulated hooks, as one ``Chain``.
        traces: one tuple of ``SimEntry`` per rank, in execution order.
        states: each rank's final ``State``.
        resume_at: the steps at which the run was killed and resumed.
        resume_index: per rank, the trace length at each resume: entries
            before it come from the run that was killed.
        preempted: per rank, the ``(step, reason)`` of each preemption or
            time-budget stop (``preempt``, ``max_time``), where that rank
            saved, stopped and was resumed.
    """

    hooks: Chain
    traces: tuple
    states: tuple
    resume_at: tuple = ()
    resume_index: tuple = ()
    preempted: tuple = ()

    @property
    def world_size(self) -> int:
        return len(self.traces)

    def collective(self, rank: int) -> tuple:
        """The ``COLLECTIVE`` entries of ``rank``'s trace (identical on every rank when all is well)."""
        return tuple(e for e in self.traces[rank] if e.effect.scope is Scope.COLLECTIVE)

    def effects(self, rank: int = 0, kind: type = Effect) -> tuple:
        """The effects of type ``kind`` that ``rank`` executed, in order."""
        return tuple(e.effect for e in self.traces[rank] if isinstance(e.effect, kind))
