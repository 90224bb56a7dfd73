"""When a run stops for its cluster: the rules every rank applies alike, with no clock and no signal.

A signal (Slurm's ``--signal=USR1@90``, Kubernetes' ``SIGTERM``) may reach
some ranks only, at different steps; a time budget is read on one clock. The
runtime (``pimm_fn.runtime.engine.preemption``) turns both into values at step
boundaries and the ranks agree through one small reduction; this module
holds the rules it applies, so ``pimm_fn.testing.simulate`` applies the
same ones to a fake clock and fake signals.

The boundary of step ``k`` is the moment after ``k``'s events (and the
closing events of an epoch it ends) ran: a checkpoint there resumes exactly.
With one process every boundary is checked, at no cost. With several, each
comparison (every ``every`` steps, ``step % every == 0``, or at the cadence
rank 0 picks, about one a second: ``next_cadence``) starts an asynchronous
reduction of each rank's request (and rank 0's clock and next cadence) and
reads the one started at the previous comparison, which has long completed:
a request made during step ``s`` stops every rank at the second comparison
from ``s``.

>>> stop_step({1: 7}, world_size=2, every=1)      # rank 1 signalled during step 7
8
>>> stop_step({0: 7, 1: 5}, world_size=2, every=4)  # the first request counts; checks at 8, read at 12
12
>>> stop_step({0: 7}, world_size=1, every=4)      # one process: at once
7
"""

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only: at run time this module imports nothing of the core
    from pimm_fn.core.state import State

__all__ = ["stop_step", "time_is_up", "lags", "next_cadence", "Boundaries", "CHECK_SECONDS", "EX_TEMPFAIL"]

EX_TEMPFAIL = 75  # sysexits.h's "try again": a run saved to be continued exits with it (``Preemption.exit_code``)


def lags(world_size: int) -> bool:
    """Whether a decision is read one check after its reduction started (several ranks) or at once (one)."""
    return world_size > 1


CHECK_SECONDS = 1.0  # the adaptive cadence: about one comparison a second on rank 0's clock
MAX_CADENCE = 10_000


def next_cadence(interval: float, steps: int, target: float = CHECK_SECONDS) -> int:
    """Rank 0's choice of steps to the next comparison: about ``target`` seconds at the pace of the last ``steps``.

    Sent to every rank with the comparison, so all agree on the next one.

    >>> next_cadence(0.5, 100), next_cadence(3.0, 1), next_cadence(0.0, 10)
    (200, 1, 10000)
    """
    if interval <= 0:
        return MAX_CADENCE
    return max(1, min(MAX_CADENCE, round(target * steps / interval)))


def stop_step(requests: Mapping[int, int], *, world_size: int, every: int = 1) -> int | None:
    """The step at whose boundary every rank saves, when rank ``r`` is asked to stop during step ``requests[r]``.

    ``None`` without requests. A step past the run's end means the run ends
    first (its own final save), with no preemption save.
    """
    if not requests:
        return None
    first = min(requests.values())
    if not lags(world_size):
        return first
    check = -(-first // every) * every  # the first check at or after the request
    return check + every


def time_is_up(now: float, interval: float, limit: float, margin: float, *, lagged: bool) -> bool:
    """Whether rank 0 asks to stop for time at a check: the next stop it could make would pass ``limit - margin``.

    ``now`` is rank 0's clock at this check (seconds since the run began in
    this process), ``interval`` the time since the previous check (or since
    the start): the estimate of the next one. One process stops at this
    boundary when the next interval would pass the deadline; several ranks
    read the answer one check later, so rank 0 looks two intervals ahead.

    >>> time_is_up(50.0, 10.0, 100.0, 30.0, lagged=False), time_is_up(61.0, 10.0, 100.0, 30.0, lagged=False)
    (False, True)
    >>> time_is_up(50.0, 10.0, 100.0, 30.0, lagged=True)
    True
    """
    ahead = 2 if lagged else 1
    return now + ahead * interval >= limit - margin


class Boundaries:
    """One rank's view of the stopping protocol over a run, from fake inputs: what ``simulate`` runs.

    ``requests`` maps each signalled rank to the step during which its
    signal arrives; ``clock(step)`` is rank 0's seconds since this process
    began at the boundary of ``step``. Called at each boundary with the
    state, it answers whether this rank stops there, as the runtime's
    ``Stopping`` decides: one process at once, several ranks from the
    reduction started at the previous comparison (the first signalled
    rank's request, rank 0's "time is up" and its choice of the next
    comparison's step), so every rank answers alike. ``every``: a fixed
    cadence, or ``None`` for rank 0's (``next_cadence``, needs ``clock``).
    ``stopped`` is then ``(step, reason)``.
    """

    def __init__(
        self,
        requests: Mapping[int, int],
        *,
        world_size: int,
        every: int | None = 1,
        clock: Callable[[int], float] | None = None,
        max_time: float | None = None,
        margin: float = 0.0,
        reason: str = "SIGTERM",
    ) -> None:
        self.requests, self.every, self.clock = dict(requests), every, clock
        self.lagged = lags(world_size)
        self.max_time, self.margin, self.reason = max_time, margin, reason
        self.stopped: tuple[int, str] | None = None
        self._last = 0.0
        self._issued = 0  # the step of the last comparison started
        self._pending: tuple[str | None, int | None] | None = (
            None  # (reason, rank 0's cadence) of the comparison in flight
        )
        self._next: int | None = None  # the step of the next comparison
        self._cadence = every or 1

    def _asked(self, step: int) -> bool:
        return any(s <= step for s in self.requests.values())

    def __call__(self, state: "State") -> bool:
        step = state.progress.global_step
        if not self.lagged:
            found = self.reason if self._asked(step) else self._time(step, lagged=False)
        else:
            if self._next is None:  # the first boundary of this process: one step trained
                self._next = step if self.every is None else -(-step // self.every) * self.every
                self._issued = step - 1
            if step < self._next:
                return False
            (found, chosen), self._pending = self._pending or (None, None), None
            if chosen is not None:
                self._cadence = chosen
            self._next = step + self._cadence
            if found is None:  # this comparison's reduction, read at the next one
                up = self._time(step, lagged=True)
                self._pending = (self.reason if self._asked(step) else up, self._choice(step))
                self._issued = step
        if found is not None:
            self.stopped = (step, found)
        return found is not None

    def _time(self, step: int, *, lagged: bool) -> str | None:
        """Rank 0's clock read at this boundary: ``"max_time"`` when the budget is up."""
        if self.clock is None:
            return None
        now = self.clock(step)
        self._interval, self._last = now - self._last, now
        up = self.max_time is not None and time_is_up(now, self._interval, self.max_time, self.margin, lagged=lagged)
        return "max_time" if up else None

    def _choice(self, step: int) -> int | None:
        if self.every is not None:
            return None
        if self.clock is None:
            raise ValueError("an adaptive cadence (every=None) needs a clock")
        return next_cadence(self._interval, step - self._issued)
