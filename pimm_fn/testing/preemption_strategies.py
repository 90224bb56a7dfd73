"""Hypothesis strategies for preemption and ``max_time``: rank 0's clock, and which ranks are signalled when.

``StepClock`` is the clock ``simulate`` and ``plan`` take (``clock=``) for
``save_every(minutes=)`` and ``max_time``; ``step_clocks`` draws one and
shrinks toward one second a step. ``preemption_requests`` draws
``simulate(preempt=...)`` and shrinks toward no signal, then rank 0 alone at
step 1. Like ``pimm_fn.testing.strategies``, each draws a frozen value whose
``repr`` is code you can paste back.
"""

import math

import attrs
from hypothesis import strategies as st

__all__ = ["StepClock", "step_clocks", "preemption_requests"]


@attrs.frozen
class StepClock:
    """``clock(step)`` for ``simulate`` and ``plan``: rank 0's seconds at the end of ``step``.

    Step ``i`` (1-based) takes ``durations[(i - 1) % len(durations)]`` seconds.

    >>> StepClock((1.0, 2.0))(3), StepClock()(0)
    (4.0, 0.0)
    """

    durations: tuple = attrs.field(default=(1.0,), converter=tuple)

    def __call__(self, step: int) -> float:
        full, rest = divmod(step, len(self.durations))
        return full * math.fsum(self.durations) + math.fsum(self.durations[:rest])


def step_clocks(*, max_values=4, max_seconds=10.0) -> st.SearchStrategy:
    """Strategy for ``StepClock``: 1 to ``max_values`` step durations in ``[0.01, max_seconds]``; shrinks to ``(1.0,)``."""
    seconds = st.one_of(st.just(1.0), st.floats(0.01, max_seconds, allow_nan=False))
    return st.builds(StepClock, st.lists(seconds, min_size=1, max_size=max_values).map(tuple))


@st.composite
def preemption_requests(draw, *, world_size: int, max_steps: int) -> dict:
    """Strategy for ``simulate(preempt=...)``: any subset of the ranks, each signalled during a step of its own.

    Shrinks toward no signal, then rank 0 alone at step 1.

    >>> from hypothesis import find
    >>> find(preemption_requests(world_size=4, max_steps=9), lambda r: len(r) > 1)
    {0: 1, 1: 1}
    """
    ranks = draw(st.lists(st.integers(0, world_size - 1), unique=True, max_size=world_size))
    return {rank: draw(st.integers(1, max_steps)) for rank in sorted(ranks)}
