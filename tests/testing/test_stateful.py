"""A stateful test: a Loop-like machine of the pure core, trained, killed and resumed at random."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint, Scope, WriteBest
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import RecordingExecutor, initial_state
from pimm_fn.core.processing import process
from pimm_fn.core.schedule import next_event
from pimm_fn.testing import simulate
from pimm_fn.testing.strategies import hook_stacks, metric_streams, rank_local_inputs, schedules

RESUMED = ev.BeforeTrain(resumed=True)


class SavingExecutor(RecordingExecutor):
    """Like the interpreter: MAIN effects on rank 0 only; remembers the state each save wrote."""

    def __init__(self, metrics, rank):
        super().__init__(metrics)
        self.rank = rank
        self.saved = None

    def execute(self, state, entry):
        if entry.effect.scope is Scope.MAIN and self.rank != 0:
            return ()
        if isinstance(entry.effect, SaveCheckpoint):
            self.saved = state
        return super().execute(state, entry)


class Rank:
    """One rank's process: its state, what it executed since its checkpoint, its last checkpoint."""

    def __init__(self, hooks, schedule, metrics, local, rank):
        self.hooks, self.local, self.rank = hooks, local, rank
        self.fresh = initial_state(
            hooks.hooks,
            iters_per_epoch=schedule.iters_per_epoch,
            max_epochs=schedule.max_epochs,
            rank=rank,
            world_size=schedule.world_size,
        )
        self.executor = SavingExecutor(metrics, rank)
        self.state = self.fresh
        self.checkpoint = None  # (state, trace length when its event ended)

    def advance(self, events: int) -> None:
        for _ in range(events):
            event = next_event(self.state)
            if event is None:
                return
            if isinstance(event, ev.AfterStep):
                event = ev.AfterStep(event.step, self.local(event.step, self.rank))
            self.executor.saved = None
            self.state = process(self.hooks, self.state, event, self.executor)
            if self.executor.saved is not None:
                self.checkpoint = (self.executor.saved, len(self.executor.trace))

    def kill_and_resume(self) -> None:
        """Lose everything since the last checkpoint, then resume from it (or start afresh)."""
        if self.checkpoint is None:
            self.state, self.executor.trace[:] = self.fresh, []
            return
        saved, length = self.checkpoint
        del self.executor.trace[length:]
        self.state = process(self.hooks, saved, RESUMED, self.executor)

    def trace(self) -> list:
        return [e for e in self.executor.trace if e.event != RESUMED]


class KillResumeMachine(RuleBasedStateMachine):
    @initialize(
        schedule=schedules(max_world_size=4, max_resumes=0),
        stack=hook_stacks(),
        metrics=metric_streams(),
        local=rank_local_inputs(),
    )
    def start(self, schedule, stack, metrics, local):
        self.schedule, self.stack = schedule, stack
        hooks = chain(*stack)
        self.ranks = [Rank(hooks, schedule, metrics, local, r) for r in range(schedule.world_size)]
        reference = simulate(stack, metrics=metrics, local=local, **schedule.kwargs())
        self.reference = [[e.to_trace_entry() for e in trace] for trace in reference.traces]
        self.save_every = next(h.n for h in stack if h.factory_name == "save_every")
        self.mode = next(h.direction for h in stack if h.factory_name == "best_on")

    @rule(events=st.integers(1, 12))
    def train(self, events):
        for rank in self.ranks:
            rank.advance(events)

    @precondition(lambda self: not self.ranks[0].state.finished)
    @rule()
    def kill_and_resume(self):
        for rank in self.ranks:
            rank.kill_and_resume()

    @invariant()
    def trace_is_a_prefix_of_the_uninterrupted_one(self):
        for rank, reference in zip(self.ranks, self.reference):
            trace = rank.trace()
            assert repr(trace) == repr(reference[: len(trace)])
            if rank.state.finished:
                assert len(trace) == len(reference)

    @invariant()
    def saves_only_on_cadence_or_at_the_end(self):
        last = self.schedule.max_steps
        for rank in self.ranks:
            for e in rank.trace():
                if isinstance(e.effect, SaveCheckpoint):
                    assert e.effect.step % self.save_every == 0 or (e.effect.final and e.effect.step == last)

    @invariant()
    def best_only_improves(self):
        rank0 = self.ranks[0]
        values = [e.effect.value for e in rank0.trace() if isinstance(e.effect, WriteBest)]
        better = (lambda a, b: a > b) if self.mode == "max" else (lambda a, b: a < b)
        assert all(better(b, a) for a, b in zip(values, values[1:]))
        assert rank0.state.best.get("mIoU") == (values[-1] if values else None)


KillResumeMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_kill_and_resume = KillResumeMachine.TestCase
