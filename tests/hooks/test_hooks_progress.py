"""progress_bar: a move every n steps and at each epoch's end, the outputs others read passed on, no read of its own."""

import pickle

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import plan
from pimm_fn.hooks import evaluate_every, log_every
from pimm_fn.hooks.progress import BAR_KEY, ShowProgress, progress_bar
from _hook_helpers import run


def shown(hooks, **kwargs):
    _, rec = run(hooks, **kwargs)
    return [effect for _, _, effect, _, _ in rec.seen if isinstance(effect, ShowProgress)]


def test_the_bar_moves_on_every_step_and_again_at_each_epochs_end():
    """One ShowProgress per global step, in order, one more as each epoch ends, none with values of its own."""
    moves = shown([progress_bar()], iters=3, epochs=2)
    assert [m.step for m in moves] == [1, 2, 3, 3, 4, 5, 6, 6] and all(not m.values for m in moves)


def test_a_bar_moving_every_n_steps_leaves_the_steps_between_quiet_and_still_reaches_each_epochs_end():
    """progress_bar(n) is called on multiples of n only; the epoch's end moves it to the epoch's last step."""
    moves = shown([progress_bar(4)], iters=10, epochs=1)
    assert [m.step for m in moves] == [4, 8, 10]
    assert [s for s in range(1, 11) if chain(progress_bar(4)).fires(s)] == [4, 8]
    assert repr(progress_bar(4)) == "progress_bar(4)" and protocol.key(progress_bar(4)) == BAR_KEY


def test_a_loop_bar_moves_about_two_hundred_times_an_epoch():
    """bar_cadence: every step of a short epoch, every 50th of a 10 000-step one."""
    from pimm_fn.hooks.progress import bar_cadence

    assert [bar_cadence(n) for n in (1, 32, 399, 400, 10_000)] == [1, 1, 1, 2, 50]


def test_the_bar_passes_on_the_outputs_an_event_carries_and_the_metrics():
    """The outputs an event carries (the loop reads them for log_every) come with the move; metrics at their step."""
    hooks = [evaluate_every(3, lambda model: None, name="val"), log_every(2), progress_bar()]
    read = lambda step: {"loss": float(step)} if step % 2 == 0 else {}  # noqa: E731 - what the loop hands on
    moves = shown(hooks, iters=3, epochs=2, outputs=read, metrics={3: {"acc": 0.5}})
    with_values = [(m.step, dict(m.values)) for m in moves if m.values]
    assert with_values == [(2, {"loss": 2.0}), (3, {"acc": 0.5}), (4, {"loss": 4.0}), (6, {"loss": 6.0})]


def test_the_bar_declares_it_reads_no_outputs_and_emits_nothing_collective():
    """reads_outputs=False keeps a quiet step quiet: a chain with the bar alone reads no step's outputs."""
    declared = protocol.declared(progress_bar())
    assert not declared.reads_outputs and declared.every == 1 and declared.rank_consistent
    bar_only, with_log = chain(progress_bar()), chain(log_every(4), progress_bar())
    assert not any(bar_only.reads(step) for step in range(1, 9))
    assert [s for s in range(1, 9) if with_log.reads(s)] == [4, 8]


def test_the_bar_is_a_value_named_by_its_factory():
    """repr reads like the call, the identity is fixed, and it pickles to an equal hook; its effect is untraced."""
    hook = progress_bar()
    assert repr(hook) == "progress_bar()" == BAR_KEY == protocol.key(hook)
    assert pickle.loads(pickle.dumps(hook)) == hook
    effect = ShowProgress(3, {"loss": 0.5})
    assert pickle.loads(pickle.dumps(effect)) == effect and effect.traced is False


def test_other_events_leave_the_state_alone():
    """Only AfterStep, AfterEpoch and non-empty MetricsPublished make an effect."""
    _, rec = run([progress_bar()], iters=2, epochs=1)
    assert {type(e) for _, e, _, _, _ in rec.seen} == {ev.AfterStep, ev.AfterEpoch}


def test_a_plan_leaves_the_bar_out_as_a_real_trace_does():
    """plan() records no ShowProgress: the plan of a run's hooks equals its trace, bar or not."""
    with_bar = plan([log_every(2), progress_bar()], iters_per_epoch=3, max_epochs=2)
    assert [e.effect for e in with_bar] == [e.effect for e in plan([log_every(2)], iters_per_epoch=3, max_epochs=2)]
