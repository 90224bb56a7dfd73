"""The one order of an event's effects: records first, then the rest, then what closes the event; follow-ups at once."""

from hypothesis import given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, WriteBest
from pimm_fn.testing import simulate
from pimm_fn.testing.assertions import moments
from pimm_fn.testing.strategies import hook_stacks, metric_streams, schedules


def accuracy(model):
    return {"acc": 0.5}


METRICS = {2: {"acc": 0.5}, 4: {"acc": 0.7}, 6: {"acc": 0.6}}
ORDERS = {
    "best_on before log_every": lambda: [pf.evaluate_every(2, accuracy), pf.best_on("acc"), pf.log_every(3)],
    "log_every before best_on": lambda: [pf.evaluate_every(2, accuracy), pf.log_every(3), pf.best_on("acc")],
}


def _moments(trace) -> list:
    """(step, what) of the evaluation logs and best writes, in execution order."""
    return [
        (e.step, "eval log" if isinstance(e.effect, Log) else "best")
        for e in trace
        if isinstance(e.effect, WriteBest) or isinstance(e.effect, Log) and e.effect.kind.startswith("eval")
    ]


def test_the_evaluation_log_precedes_the_best_write_it_caused_in_any_hook_order():
    """Wherever best_on stands, WriteBest runs after the evaluation's Log (a record runs first), in plan and simulation."""
    for order in ORDERS.values():
        hooks = order()
        planned = pf.plan(hooks, iters_per_epoch=6, max_epochs=1, metrics=METRICS)
        expected = [(2, "eval log"), (2, "best"), (4, "eval log"), (4, "best"), (6, "eval log")]
        simulated = simulate(hooks, world_size=2, iters_per_epoch=6, max_epochs=1, metrics=METRICS)
        assert _moments(planned) == _moments(simulated.traces[0]) == expected


def test_a_save_at_an_evaluation_step_follows_the_evaluation_and_its_best_write():
    """A step's record runs first, then its evaluation with the follow-up's record and best write, then the save."""
    hooks = [pf.evaluate_every(2, accuracy), pf.save_every(2), pf.log_every(2), pf.best_on("acc")]
    planned = pf.plan(hooks, iters_per_epoch=4, max_epochs=1, metrics=METRICS, outputs=())
    kinds = [
        type(e.effect).__name__ + (f":{e.effect.kind}" if isinstance(e.effect, Log) else "")
        for e in planned
        if e.step == 2
    ]
    assert kinds == ["Log:train", "Evaluate", "Log:eval/accuracy", "WriteBest", "SaveCheckpoint"]
    assert Log(2, "train", {}).runs_first and not WriteBest("acc", 0.5, 2).runs_last
    assert SaveCheckpoint(4, deferred=True).runs_last and SaveCheckpoint(2).runs_last


def test_an_earlier_best_write_precedes_a_later_hooks_stop_and_the_evaluation_line_precedes_both():
    """best_on before early_stop: Log, WriteBest, Stop; early_stop first: Log, Stop, WriteBest (hook position decides)."""
    scores = {10: {"acc": 0.5}, 20: {"acc": 0.55}}  # 0.55 is a new best, but not by early_stop's min_delta
    stop = pf.early_stop("acc", patience=1, min_delta=0.1)
    for hooks, expected in (
        ([pf.evaluate_every(10, accuracy), pf.best_on("acc"), pf.log_every(10), stop], ["Log", "WriteBest", "Stop"]),
        ([pf.evaluate_every(10, accuracy), stop, pf.best_on("acc"), pf.log_every(10)], ["Log", "Stop", "WriteBest"]),
    ):
        trace = pf.plan(hooks, iters_per_epoch=50, max_epochs=1, metrics=scores)
        caused = [type(e.effect).__name__ for e in trace if isinstance(e.event, ev.MetricsPublished) and e.step == 20]
        assert caused == expected


def _group(effect) -> int:
    return 0 if effect.runs_first else 2 if effect.runs_last else 1


def _check_order(trace) -> None:
    """The documented order, read off a trace: per event, (group, hook position); a follow-up right after its cause."""
    frames: dict = {}  # id(event) -> [indices]
    for i, entry in enumerate(trace):
        frames.setdefault(id(entry.event), []).append(i)
    for indices in frames.values():
        keys = [(_group(trace[i].effect), trace[i].hook) for i in indices]
        assert keys == sorted(keys), f"effects of {trace[indices[0]].event!r} out of order: {keys}"
        event = trace[indices[0]].event
        if isinstance(event, ev.MetricsPublished):  # the evaluation's follow-up: at once, in one block
            cause = indices[0] - 1
            assert isinstance(trace[cause].effect, Evaluate) and trace[cause].effect.step == event.step
            assert indices == list(range(indices[0], indices[0] + len(indices)))
            kinds = [type(trace[i].effect) for i in indices]
            if Log in kinds:  # the evaluation's own line before anything it causes
                assert all(k is Log for k in kinds[: kinds.count(Log)])


@st.composite
def stacks_that_stop(draw):
    """The standard stack (broadcast evaluations), with an early_stop drawn into any place."""
    stack = draw(hook_stacks(broadcast=True))
    stop = draw(
        st.builds(pf.early_stop, st.just("mIoU"), patience=st.integers(1, 3), min_delta=st.sampled_from((0.0, 0.3)))
    )
    stack.insert(draw(st.integers(0, len(stack))), stop)
    return stack


@settings(max_examples=60, deadline=None)
@given(
    schedule=schedules(max_world_size=3, max_resumes=0),
    stack=stacks_that_stop(),
    metrics=metric_streams(ranks=("all",)),
)
def test_every_stack_runs_its_effects_in_the_one_documented_order_in_plan_and_simulation(schedule, stack, metrics):
    """For any stack and hook order: per event (group, hook position), follow-ups at once, plan == every rank's simulation."""
    planned = pf.plan(
        stack,
        iters_per_epoch=schedule.iters_per_epoch,
        max_epochs=schedule.max_epochs,
        metrics=lambda step, rank: metrics(step, rank),
    )
    _check_order(planned)
    simulated = simulate(stack, metrics=metrics, **schedule.kwargs())
    for rank, trace in enumerate(simulated.traces):
        executed = [e for e in planned if rank == 0 or e.effect.scope is not pf.Scope.MAIN]
        assert moments(trace) == moments(executed)
