"""Hypothesis strategies for simulations: schedules, metric streams, losses, hook stacks.

Every strategy draws a frozen, picklable value whose ``repr`` is code you
can paste back, so a failing example reads as a short program. They compose
with your own strategies (``st.tuples``, ``.map``, ``.filter``, ``@st.composite``)
like any hypothesis strategy.

How they shrink: integers shrink toward their lower bound (world size 1, one
iteration per epoch, one epoch), tuples of values toward fewer and smaller
elements (one value, ``0.0``), choices toward the first option listed (all
ranks see the same metrics; the canonical hook order), resume points toward
none. A counterexample therefore ends at the smallest job, the shortest
schedule and the plainest inputs that still fail. A run's clock and its
preemption signals are drawn by ``pimm_fn.testing.strategies``.

>>> from hypothesis import given, settings
>>> from pimm_fn.testing import simulate, assert_collective_agreement
>>> @settings(max_examples=5, database=None)
... @given(schedule=schedules(), stack=hook_stacks(), metrics=metric_streams())
... def test_agreement(schedule, stack, metrics):
...     assert_collective_agreement(simulate(stack, metrics=metrics, **schedule.kwargs()))
>>> test_agreement()

Hypothesis strategies for preemption and ``max_time``: rank 0's clock, and which ranks are signalled when.

``StepClock`` is the clock ``simulate`` and ``plan`` take (``clock=``) for
``save_every(minutes=)`` and ``max_time``; ``step_clocks`` draws one and
shrinks toward one second a step. ``preemption_requests`` draws
``simulate(preempt=...)`` and shrinks toward no signal, then rank 0 alone at
step 1. Like ``pimm_fn.testing.strategies``, each draws a frozen value whose
``repr`` is code you can paste back.

``memberships`` draws ``simulate_replicas(membership=...)`` and
``plan(membership=...)``: replicas lost at any step, some rejoining later.
"""

import itertools
import math

import attrs
from hypothesis import strategies as st

from pimm_fn.hooks import best_on, evaluate_every, log_every, save_every
from pimm_fn.testing.replicas import Membership

__all__ = [
    "Schedule",
    "MetricStream",
    "LocalInputs",
    "schedules",
    "metric_streams",
    "rank_local_inputs",
    "hook_stacks",
    "miou",
    "STANDARD_ORDERS",
    "StepClock",
    "step_clocks",
    "preemption_requests",
    "memberships",
]


@attrs.frozen
class Schedule:
    """A job shape and the steps at which it is killed and resumed.

    >>> s = Schedule(world_size=4, iters_per_epoch=10, max_epochs=3, resume_at=(12,))
    >>> s.max_steps, s.kwargs()
    (30, {'world_size': 4, 'iters_per_epoch': 10, 'max_epochs': 3})
    """

    world_size: int
    iters_per_epoch: int
    max_epochs: int
    resume_at: tuple = ()

    @property
    def max_steps(self) -> int:
        return self.iters_per_epoch * self.max_epochs

    def kwargs(self) -> dict:
        """The schedule as ``simulate`` keywords (``resume_at`` left out: pass it when wanted)."""
        return {"world_size": self.world_size, "iters_per_epoch": self.iters_per_epoch, "max_epochs": self.max_epochs}


@st.composite
def schedules(draw, *, max_world_size=16, max_iters_per_epoch=6, min_epochs=1, max_epochs=4, max_resumes=2):
    """Strategy for ``Schedule``: world size, iterations per epoch, epochs, resume points.

    Resume points are distinct steps in ``[1, max_steps]``, increasing, at
    most ``max_resumes`` of them (``simulate(resume_at=...)`` takes them as
    they are). Shrinks toward one rank, one iteration, ``min_epochs`` epochs
    and no resume.

    >>> from hypothesis import find
    >>> find(schedules(), lambda s: s.world_size > 3 and s.resume_at)
    Schedule(world_size=4, iters_per_epoch=1, max_epochs=1, resume_at=(1,))
    """
    world_size = draw(st.integers(1, max_world_size))
    iters = draw(st.integers(1, max_iters_per_epoch))
    epochs = draw(st.integers(min_epochs, max_epochs))
    steps = iters * epochs
    points = (
        ()
        if steps == 0 or max_resumes == 0
        else tuple(sorted(draw(st.lists(st.integers(1, steps), unique=True, max_size=max_resumes))))
    )
    return Schedule(world_size, iters, epochs, points)


@attrs.frozen
class MetricStream:
    """``metrics(step, rank)`` for ``simulate``: picklable, with a pasteable repr.

    The value at ``step`` is ``values[step % len(values)]`` (``None`` there:
    the evaluation returns nothing at that step). ``ranks`` says who computes:
    ``"all"`` (every rank the same), ``"main"`` (rank 0 only; the others
    return ``None``) or ``"each"`` (every rank its own value: rank ``r`` reads
    ``values[(step + r) % len(values)]``).

    >>> stream = MetricStream("mIoU", (0.5, None, float("nan")), ranks="main")
    >>> stream(3, 0), stream(4, 0), stream(3, 1)
    ({'mIoU': 0.5}, None, None)
    """

    name: str = "mIoU"
    values: tuple = attrs.field(default=(0.5,), converter=tuple)
    ranks: str = attrs.field(default="all", validator=attrs.validators.in_(("all", "main", "each")))

    def __attrs_post_init__(self):
        if not self.values:
            raise ValueError("MetricStream: 'values' must hold at least one value (got ())")

    def __call__(self, step: int, rank: int):
        if self.ranks == "main" and rank != 0:
            return None
        index = step + (rank if self.ranks == "each" else 0)
        value = self.values[index % len(self.values)]
        return None if value is None else {self.name: value}


# Few distinct values so that ties are common; NaN and "missing" included.
_METRIC_VALUE = st.one_of(
    st.sampled_from((0.0, 0.5, 1.0, 0.25)),
    st.none(),
    st.just(math.nan),
    st.floats(-1e6, 1e6, allow_nan=False),
)


def metric_streams(*, name="mIoU", ranks=("all", "main", "each"), max_values=6):
    """Strategy for ``MetricStream``: evaluation results over the steps of a run.

    Draws up to ``max_values`` values cycled over the steps: a few repeated
    numbers (ties), ``NaN``, ``None`` (a step where the evaluation returns
    nothing) and arbitrary floats, computed by all ranks, rank 0 only, or
    each rank separately (``ranks`` chooses among these). Shrinks toward a
    single ``0.0`` seen by all ranks.

    >>> from hypothesis import find
    >>> find(metric_streams(), lambda m: m(1, 1) is None)
    MetricStream(name='mIoU', values=(None,), ranks='all')
    """
    return st.builds(
        MetricStream,
        name=st.just(name),
        values=st.lists(_METRIC_VALUE, min_size=1, max_size=max_values).map(tuple),
        ranks=st.sampled_from(tuple(ranks)),
    )


@attrs.frozen
class LocalInputs:
    """``local(step, rank)`` for ``simulate``: each rank's own step outputs.

    Output ``names[j]`` at ``step`` on ``rank`` is
    ``values[(step + j + rank * stride) % len(values)]``, so ranks differ
    whenever there is more than one value.

    >>> LocalInputs((1.0, 2.0, 3.0))(1, 0), LocalInputs((1.0, 2.0, 3.0))(1, 1)
    ({'loss': 2.0}, {'loss': 3.0})
    """

    values: tuple = attrs.field(default=(1.0,), converter=tuple)
    names: tuple = attrs.field(default=("loss",), converter=tuple)
    stride: int = 1

    def __call__(self, step: int, rank: int) -> dict:
        n = len(self.values)
        return {name: self.values[(step + j + rank * self.stride) % n] for j, name in enumerate(self.names)}


def rank_local_inputs(*, names=("loss",), max_values=5):
    """Strategy for ``LocalInputs``: rank-local step outputs (losses), NaN and infinities included.

    Shrinks toward one output value ``0.0`` shared by every rank.

    >>> from hypothesis import find
    >>> find(rank_local_inputs(), lambda f: f(1, 0) != f(1, 1))
    LocalInputs(values=(0.0, 1.0), names=('loss',), stride=1)
    """
    return st.builds(
        LocalInputs,
        values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=max_values).map(tuple),
        names=st.just(tuple(names)),
        stride=st.integers(1, 7),
    )


def miou(model):
    """The evaluator the standard stacks name; ``simulate`` supplies its results."""
    return None


_PARTS = ("evaluate", "save", "best", "log")


# Every order of the four standard hooks: each may go anywhere (a save runs after the other effects of its
# event, so one at an evaluation step records the evaluation wherever the saver stands). The canonical order
# comes first, so examples shrink to it.
STANDARD_ORDERS = tuple(itertools.permutations(_PARTS))


@st.composite
def hook_stacks(draw, *, max_every=6, metric="mIoU", evaluator=miou, orders=STANDARD_ORDERS, broadcast=None):
    """Strategy for the standard stack: ``evaluate_every``, ``save_every``, ``best_on``, ``log_every``.

    Cadences are drawn in ``[1, max_every]`` (``evaluate_every`` may also be
    ``0``: once per epoch), with or without broadcast evaluation, snapshots,
    ``max`` or ``min`` mode, in each of the ``orders`` (default: all 24). Returns a list of hooks. Shrinks toward
    every cadence 1 (``evaluate_every(0, ...)`` first), broadcast, no
    snapshots, ``max`` and the canonical order.

    ``broadcast=True`` draws only evaluations every rank publishes alike,
    as a hook that decides a collective effect from a metric needs
    (``early_stop`` refuses a rank-local metric); ``False`` only rank-local
    ones; ``None`` (default) both.

    >>> from hypothesis import find
    >>> find(hook_stacks(), lambda stack: True)
    [evaluate_every(0, miou), save_every(1), best_on('mIoU'), log_every(1)]
    """
    # Built with st.builds so that hypothesis prints each hook as its factory call.
    every = st.integers(1, max_every)
    hooks = {
        "evaluate": draw(
            st.builds(
                evaluate_every,
                st.integers(0, max_every),
                st.just(evaluator),
                broadcast=st.sampled_from((True, False) if broadcast is None else (broadcast,)),
            )
        ),
        "save": draw(st.builds(save_every, every, snapshots=st.booleans())),
        "best": draw(st.builds(best_on, st.just(metric), mode=st.sampled_from(("max", "min")))),
        "log": draw(st.builds(log_every, every)),
    }
    return [hooks[part] for part in draw(st.sampled_from(orders))]


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


@st.composite
def memberships(draw, *, max_replicas: int = 4, max_step: int = 12, replicas: int | None = None) -> Membership:
    """Strategy for ``Membership``: replicas lost at any step, some rejoining at a later one.

    ``replicas`` fixes the count (else 1 to ``max_replicas``); losses and
    rejoins fall on steps in ``[1, max_step]`` (one a run never reaches never
    happens), at least one replica alive at every step; the commit vote of a
    loss's step fails or not. Shrinks toward no loss, then replica 0 lost at
    step 1 for good.

    >>> from hypothesis import find
    >>> find(memberships(), lambda m: m.rejoined)
    Membership(replicas=2, lost=((0, 1),), rejoined=((0, 2),), failed_votes=True)
    """
    count = replicas if replicas is not None else draw(st.integers(1, max_replicas))
    # One replica at most is never lost: some replica is alive at every step.
    lost = draw(st.lists(st.integers(0, count - 1), unique=True, max_size=count - 1))
    losses = {r: draw(st.integers(1, max_step)) for r in sorted(lost)}
    back = {}
    for r, step in losses.items():
        if step < max_step and draw(st.booleans()):
            back[r] = draw(st.integers(step + 1, max_step))
    return Membership(count, losses, back, failed_votes=draw(st.sampled_from((True, False))))
