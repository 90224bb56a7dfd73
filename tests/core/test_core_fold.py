"""fold, process and chain: order, state threading, follow-ups, composition."""

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Effect, Evaluate, Log, SaveCheckpoint, WriteBest
from pimm_fn.core.fold import Chain, TraceEntry, chain, fold
from pimm_fn.core.hook import init_slot
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.plan import RecordingExecutor, initial_state
from pimm_fn.core.processing import process
from pimm_fn.core.state import Progress, State


@attrs.frozen
class Tag:
    """A test hook: appends ``name`` to config['seen'] and emits a Log per entry of ``emit``."""

    name: str
    emit: tuple = ()
    events = ev.LIFECYCLE

    def __call__(self, state, event):
        seen = state.config.get("seen", ()) + (self.name,)
        state = state.evolve(config=state.config.set("seen", seen))
        return state, tuple(Log(0, f"{self.name}.{k}", {"seen": seen}) for k in self.emit)


def start(hooks, iters=2, epochs=1):
    return initial_state(hooks.hooks, iters_per_epoch=iters, max_epochs=epochs)


def kinds(effects):
    return [e.kind for e in effects]


def test_each_hook_sees_the_previous_hooks_state():
    """The fold threads state: hook i sees what hooks 0..i-1 returned."""
    hooks = chain(Tag("a", ("x",)), Tag("b", ("x",)), Tag("c", ("x",)))
    state, effects = hooks(start(hooks), ev.BeforeTrain())
    assert state.config["seen"] == ("a", "b", "c")
    assert [e.values["seen"] for e in effects] == [("a",), ("a", "b"), ("a", "b", "c")]


def test_effects_are_ordered_by_hook_position_then_emission():
    """Effects come out in (hook position, emission order)."""
    hooks = chain(Tag("a", ("1", "2")), Tag("b", ()), Tag("c", ("1", "2", "3")))
    _, emitted = fold(hooks, start(hooks), ev.BeforeTrain())
    assert [(i, e.kind) for i, e in emitted] == [(0, "a.1"), (0, "a.2"), (2, "c.1"), (2, "c.2"), (2, "c.3")]


@attrs.define
class Scripted:
    """An executor that records effects and answers given kinds with follow-up events."""

    answers: dict
    trace: list = attrs.field(factory=list)
    checked: list = attrs.field(factory=list)

    def check(self, state, event, emitted):
        self.checked.append(event)

    def execute(self, state, entry):
        self.trace.append(entry.effect.kind)
        return self.answers.get(entry.effect.kind, ())


@attrs.frozen
class React:
    """Emits Log(kind=<name>.<source>) on MetricsPublished whose source is in ``sources``."""

    name: str
    sources: tuple
    events = (ev.MetricsPublished,)

    def __call__(self, state, event):
        if event.source in self.sources:
            return state, (Log(0, f"{self.name}.{event.source}", {}),)
        return state, ()


def test_follow_ups_are_processed_depth_first_before_the_next_effect():
    """A follow-up event's effects (and theirs, recursively) run before the emitting hook's next effect."""
    hooks = chain(Tag("a", ("1", "2")), React("r", ("m1", "m2")), React("s", ("m2",)), Tag("b", ("1",)))
    executor = Scripted(
        {
            "a.1": (ev.MetricsPublished({}, "m1"),),
            "r.m1": (ev.MetricsPublished({}, "m2"),),
        }
    )
    process(hooks, start(hooks), ev.BeforeTrain(), executor)
    assert executor.trace == ["a.1", "r.m1", "r.m2", "s.m2", "a.2", "b.1"]
    assert executor.checked == [ev.BeforeTrain(), ev.MetricsPublished({}, "m1"), ev.MetricsPublished({}, "m2")]


def test_executor_sees_state_after_follow_ups():
    """An effect executed after a follow-up sees the state the follow-up produced."""

    @attrs.define
    class Recorder:
        states: list = attrs.field(factory=list)

        def check(self, state, event, emitted):
            pass

        def execute(self, state, entry):
            self.states.append((entry.effect.kind, state.metrics))
            return (ev.MetricsPublished({"m": 1.0}),) if entry.effect.kind == "a.1" else ()

    hooks = chain(Tag("a", ("1", "2")))
    executor = Recorder()
    process(hooks, start(hooks), ev.BeforeTrain(), executor)
    assert executor.states == [("a.1", FrozenMap()), ("a.2", FrozenMap({"m": 1.0}))]


def counter(state, event):
    """A plain-function hook counting AfterStep events in its own slot."""
    if isinstance(event, ev.AfterStep):
        return state.with_slot((state.slot or 0) + 1), (Log(event.step, "count", {"n": (state.slot or 0) + 1}),)
    return state, ()


def test_plain_function_is_a_hook_with_its_own_slot():
    """A plain function works as a hook; its slot starts as None and persists via state.slot."""
    hooks = chain(Tag("a"), counter)
    state = start(hooks, iters=3)
    assert state.slots == (None, None)
    executor = RecordingExecutor(lambda step, rank: None)
    from pimm_fn.core.plan import run_schedule

    final = run_schedule(hooks, state, executor)
    assert final.slots[1] == 3 and final.slot is None
    assert [e.effect.values["n"] for e in executor.trace] == [1, 2, 3]


def test_events_declaration_skips_hook():
    """A hook declaring ``events`` is not called for any other event type."""
    calls = []

    def only_epochs(state, event):
        calls.append(event)
        return state, ()

    only_epochs.events = (ev.AfterEpoch,)
    hooks = chain(only_epochs)
    from pimm_fn.core.plan import run_schedule

    run_schedule(hooks, start(hooks, iters=2, epochs=2), RecordingExecutor(lambda s, r: None))
    assert calls == [ev.AfterEpoch(0), ev.AfterEpoch(1)]
    assert hooks.active(ev.AfterStep) == () and hooks.active(ev.AfterEpoch) == (0,)


def test_events_declaration_matches_subclasses():
    """A hook declaring a base event type is called for its subclasses."""
    assert chain(counter).active(ev.MetricsPublished) == (0,)  # no declaration: called for everything

    def any_event(state, event):
        return state, ()

    any_event.events = (ev.Event,)
    assert chain(any_event).active(ev.MetricsPublished) == (0,)


def not_a_pair(state, event):
    return state


def bad_effects(state, event):
    return state, [SaveCheckpoint(1)]


def bad_effect_type(state, event):
    return state, ("save",)


def bad_state(state, event):
    return {}, ()


@pytest.mark.parametrize(
    "hook, message",
    [
        (not_a_pair, r"hook <function not_a_pair .*> must return \(State, tuple_of_effects\) \(got State"),
        (bad_state, r"hook <function bad_state .*> must return \(State, tuple_of_effects\) \(got tuple"),
        (bad_effects, r"hook <function bad_effects .*> must return a tuple of Effect values as effects \(got \[Save"),
        (bad_effect_type, r"hook <function bad_effect_type .*> must return a tuple of Effect values .*'save'"),
    ],
)
def test_bad_return_value_raises_type_error_naming_the_hook(hook, message):
    """A hook returning anything but (State, tuple of Effects) raises TypeError naming it."""
    hooks = chain(hook)
    with pytest.raises(TypeError, match=message):
        hooks(start(hooks), ev.BeforeTrain())


def test_chain_rejects_non_callables():
    """chain refuses a non-callable with TypeError showing it."""
    with pytest.raises(TypeError, match=r"a hook must be callable as hook\(state, event\) \(got 3\)"):
        chain(Tag("a"), 3)


def test_chain_is_a_value():
    """A chain compares, hashes and reprs by its hooks."""
    assert chain(Tag("a"), Tag("b")) == chain(Tag("a"), Tag("b")) != chain(Tag("b"), Tag("a"))
    assert hash(chain(Tag("a"))) == hash(chain(Tag("a")))
    assert repr(chain(Tag("a"))) == "chain(Tag(name='a', emit=()))"
    assert Chain([Tag("a")]) == chain(Tag("a"))


def test_nested_chain_keeps_a_tuple_of_child_slots():
    """A chain inside a chain keeps its children's slots as a tuple in its own slot."""
    inner = chain(counter, chain(counter, name="again"))
    hooks = chain(counter, inner)
    state = start(hooks)
    assert state.slots == (None, (None, (None,)))
    state, _ = fold(hooks, attrs.evolve(state, position="BeforeStep"), ev.AfterStep(1))
    assert state.slots == (1, (1, (1,)))


def test_two_hooks_with_one_identity_are_refused():
    """Slots are kept by identity, so a list holding the same identity twice fails at construction, with the fix."""
    from pimm_fn.core.hook_list import DuplicateHookError

    with pytest.raises(DuplicateHookError, match=r"two hooks with the identity 'test_core_fold.counter'.*name='"):
        chain(counter, counter)
    assert chain(counter, chain(counter, name="again"))  # naming one is the way out


def _trace(hooks, iters, epochs):
    from pimm_fn.core.plan import run_schedule

    executor = RecordingExecutor(lambda step, rank: {"m": float(step % 3)})
    final = run_schedule(hooks, start(hooks, iters, epochs), executor, outputs=lambda s: {"loss": 1.0 / s})
    return [(t.step, t.event, t.effect) for t in executor.trace], final


HOOK_POOL = [
    Tag("a", ("1",)),
    Tag("b", ("1", "2")),
    counter,
    React("r", ("",)),
]


def _real_hooks():
    from pimm_fn.hooks import best_on, log_every, save_every

    return [save_every(2), log_every(1), best_on("m"), save_every(3, snapshots=True)]


@given(
    picks=st.lists(st.integers(0, 7), min_size=3, max_size=6, unique=True),
    split=st.integers(0, 6),
    iters=st.integers(1, 4),
    epochs=st.integers(1, 3),
)
def test_chain_composition_law(picks, split, iters, epochs):
    """chain(a, chain(b, c)) executes the same effects, in the same order, as chain(a, b, c)."""
    pool = HOOK_POOL + _real_hooks()
    hooks = [pool[i] for i in picks]
    split = min(split, len(hooks))
    flat, _ = _trace(chain(*hooks), iters, epochs)
    nested, _ = _trace(chain(*hooks[:split], chain(*hooks[split:])), iters, epochs)
    assert flat == nested


@given(picks=st.lists(st.integers(0, 7), max_size=5, unique=True), iters=st.integers(1, 4), epochs=st.integers(0, 3))
def test_process_is_deterministic(picks, iters, epochs):
    """The same hooks over the same schedule give the same trace and final state."""
    pool = HOOK_POOL + _real_hooks()
    hooks = [pool[i] for i in picks]
    assert _trace(chain(*hooks), iters, epochs) == _trace(chain(*hooks), iters, epochs)


def test_trace_entry_records_hook_position():
    """process hands the executor TraceEntry values carrying step, event, effect and hook index."""
    hooks = chain(Tag("a"), Tag("b", ("1",)))
    executor = RecordingExecutor(lambda s, r: None)
    process(hooks, start(hooks), ev.BeforeTrain(), executor)
    assert executor.trace == [TraceEntry(0, ev.BeforeTrain(), Log(0, "b.1", {"seen": ("a", "b")}), 1)]


def test_recording_executor_answers_evaluate_with_metrics():
    """RecordingExecutor turns Evaluate into MetricsPublished from the metric source (main rank when broadcast)."""
    executor = RecordingExecutor(lambda step, rank: {"acc": step + rank / 10})
    state = State(Progress(2, 1), rank=1, world_size=2)
    entry = TraceEntry(4, ev.AfterStep(4), Evaluate("val", 4))
    assert executor.execute(state, entry) == (ev.MetricsPublished({"acc": 4.0}, "val", 4, consistent=True),)
    local = TraceEntry(4, ev.AfterStep(4), Evaluate("val", 4, broadcast=False))
    assert executor.execute(state, local) == (ev.MetricsPublished({"acc": 4.1}, "val", 4, consistent=False),)
    assert executor.execute(state, TraceEntry(4, ev.AfterStep(4), WriteBest("acc", 1.0, 4))) == ()


def test_effect_scopes():
    """Saves and evaluations are collective, best writes and logs main-rank, weight loads local."""
    from pimm_fn.core.effects import LoadWeights, Scope

    assert SaveCheckpoint.scope is Evaluate.scope is Scope.COLLECTIVE
    assert WriteBest.scope is Log.scope is Scope.MAIN
    assert LoadWeights.scope is Effect.scope is Scope.LOCAL


@attrs.frozen
class EveryThird:
    """A test hook called on every third AfterStep; in between it counts the steps that reported outputs."""

    events = (ev.AfterStep,)
    every = 3

    def init(self):
        return 0

    def accumulate(self, slot, outputs):
        return slot + 1

    def __call__(self, state, event):
        return state.with_slot(0), (Log(event.step, "third", {"quiet": state.slot}),)


def test_every_calls_the_hook_only_on_its_steps_and_accumulate_between():
    """A hook with every=n is called on AfterStep(k) for k % n == 0 only; accumulate folds the other steps' outputs."""
    hooks = chain(EveryThird())
    state = start(hooks, iters=7, epochs=1)
    from pimm_fn.core.plan import run_schedule

    rec = RecordingExecutor(lambda s, r: None)
    state = run_schedule(hooks, state, rec, lambda step: {"loss": 1.0})
    assert [(t.step, t.effect.values["quiet"]) for t in rec.trace] == [(3, 2), (6, 2)]
    assert state.slots == (1,)  # step 7 was skipped: accumulated


def test_accumulate_is_not_called_for_steps_without_outputs():
    """A step that reported nothing leaves an accumulating slot as it is."""
    hooks = chain(EveryThird())
    from pimm_fn.core.plan import run_schedule

    state = run_schedule(hooks, start(hooks, iters=7, epochs=1), RecordingExecutor(lambda s, r: None))
    assert state.slots == (0,)


def test_invalid_every_is_refused_at_chain_construction():
    """An 'every' that is not an int >= 1 fails when the chain is built, naming the value."""

    def hook(state, event):
        return state, ()

    hook.every = 0
    with pytest.raises(ValueError, match="'every' must be an int >= 1 \\(got 0\\)"):
        chain(hook)


def _spelled_out(hook):
    """``hook`` subscribed to every step, doing itself what the fold does for its cadence."""
    n, accumulate = getattr(hook, "every", 1), getattr(hook, "accumulate", None)

    def run(state, event):
        if isinstance(event, ev.AfterStep) and event.step % n:
            if accumulate is not None and event.outputs:
                return state.with_slot(accumulate(state.slot, event.outputs)), ()
            return state, ()
        return hook(state, event)

    run.init, run.events = (lambda: init_slot(hook)), hook.events
    run.hook_key = repr(hook)
    return run


@given(
    st.lists(st.sampled_from(["third", "log", "save", "eval", "never"]), min_size=1, max_size=5, unique=True),
    st.integers(1, 7),
    st.integers(1, 3),
)
def test_cadence_subscriptions_match_hooks_that_apply_their_cadence_themselves(names, iters, epochs):
    """The fold enforcing each hook's cadence gives the trace and state of hooks testing the step themselves."""
    from pimm_fn.core.plan import run_schedule
    from pimm_fn.hooks import evaluate_every, log_every, save_every

    make = {
        "third": EveryThird,
        "log": lambda: log_every(4),
        "save": lambda: save_every(5),
        "eval": lambda: evaluate_every(2, lambda m: 0.0, name="v"),
        "never": lambda: save_every(10**9),
    }
    runs = []
    for wrap in (lambda h: h, _spelled_out):
        hooks = chain(*[wrap(make[name]()) for name in names])
        rec = RecordingExecutor(lambda s, r: None)
        final = run_schedule(hooks, start(hooks, iters, epochs), rec, lambda step: {"loss": step / 2, "lr": 0.1})
        runs.append(([(t.step, t.hook, t.effect) for t in rec.trace], final))
    assert runs[0] == runs[1]


def test_a_hook_that_accumulates_outputs_cannot_declare_it_reads_none():
    """reads_outputs=False lets the loop leave the outputs unread when the hook is called: summing them contradicts it."""
    import pytest

    from pimm_fn.core import hook as protocol

    def summing(state, event):
        return state, ()

    summing.reads_outputs = False
    summing.accumulate = lambda slot, outputs: slot
    with pytest.raises(TypeError, match="reads_outputs=False but accumulates"):
        protocol.declared(summing)
