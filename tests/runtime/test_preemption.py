"""Preemption in one process: a real signal at any step, during an evaluation or a save, or the time budget.

Every case ends the same way: one step saved (a normal checkpoint whose
marker says why), ``pimm_fn.Preempted`` (exit code 75), and a resume from
that save that ends with the weights and the trace of an uninterrupted run.
The signals are real (``os.kill`` of this process) and land while ``run()``
trains, where the loop's handlers hold them.
"""

import json
import os
import signal

import pytest
import torch

import _preemption_workload as pw
import _tiny_workload as tw
import pimm_fn as pf
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.runtime.engine.preemption import Requests
from pimm_fn.runtime.errors import Preempted
from pimm_fn.runtime.handlers.dispatch import DEFAULT_HANDLERS

MAX_EPOCHS = 3  # 15 steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its final weights and its trace."""
    model, run = pw.build(tmp_path_factory.mktemp("reference"), max_epochs=MAX_EPOCHS)
    run()
    return tw.weights(model), [repr(e) for e in run.trace]


def _marker(save_dir) -> dict:
    return json.loads((save_dir / "model" / "last" / "COMPLETE").read_text())


def _preempted(run) -> pf.Preempted:
    with pytest.raises(pf.Preempted) as caught:
        run()
    return caught.value


def _resume_and_compare(save_dir, before, reference):
    """Resume from the preemption save: the run ends as the uninterrupted one, weights and trace."""
    model, run = pw.build(save_dir, resume="auto", max_epochs=MAX_EPOCHS)
    run()
    expected, trace = reference
    assert tw.same_weights(tw.weights(model), expected)
    assert before + [repr(e) for e in run.trace] == trace


@pytest.mark.parametrize("step", [1, 4, 7, 12])  # 4 and 12: evaluation steps
def test_a_sigterm_during_a_step_saves_that_step_and_the_resume_ends_bit_identical(tmp_path, reference, step):
    """SIGTERM during step k: the step completes, step k is saved (marker: SIGTERM), Preempted(75), exact resume."""
    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS)
    pw.signal_at_forward(model, step)
    stopped = _preempted(run)
    assert (stopped.code, stopped.step, stopped.reason) == (75, step, "SIGTERM")
    marker = _marker(tmp_path)
    assert marker["step"] == step
    assert marker.get("saved_for") == "SIGTERM" or step % pw.HOOKS["save_every"] == 0
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


def test_a_sigterm_during_an_evaluation_is_honoured_right_after_it(tmp_path, reference):
    """SIGTERM inside the evaluation of step 8: the evaluation finishes, then step 8 is saved and the run stops."""
    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS)
    sent = []

    def during_evaluation(module, args):
        if not torch.is_grad_enabled() and run.state.progress.global_step == 8 and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    model.hidden.register_forward_pre_hook(during_evaluation)
    stopped = _preempted(run)
    assert sent and stopped.step == 8
    assert any(isinstance(e.effect, pf.effects.Evaluate) and e.step == 8 for e in run.trace)
    assert _marker(tmp_path)["saved_for"] == "SIGTERM"
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_sigterm_during_a_save_is_honoured_right_after_it(tmp_path, async_save, reference):
    """SIGTERM while the save of step 5 writes (in the foreground or the background): that save is the stop's."""
    saved = []

    def signalling_save(effect, state, ctx):
        if async_save:
            effect = SaveCheckpoint(effect.step, async_save=True)
            followups = DEFAULT_HANDLERS[SaveCheckpoint](effect, state, ctx)
            os.kill(os.getpid(), signal.SIGTERM)  # the write goes on in the background
        else:
            os.kill(os.getpid(), signal.SIGTERM)  # held: it lands in the handler's own code, which goes on
            followups = DEFAULT_HANDLERS[SaveCheckpoint](effect, state, ctx)
        saved.append(effect.step)
        return followups

    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS, handlers={SaveCheckpoint: signalling_save})
    stopped = _preempted(run)
    assert saved == [5] and stopped.step == 5
    assert _marker(tmp_path)["step"] == 5
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


def test_save_on_interrupt_turns_a_scripts_ctrl_c_into_a_save_and_exit(tmp_path, reference):
    """With save_on_interrupt (not in a notebook), a Ctrl-C during step 6 saves step 6 and stops: Preempted."""
    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS, preemption=pf.Preemption(save_on_interrupt=True))
    pw.signal_at_forward(model, 6, signal.SIGINT)
    stopped = _preempted(run)
    assert (stopped.step, stopped.reason) == (6, "SIGINT")
    assert _marker(tmp_path)["saved_for"] == "SIGINT"
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


def test_sigusr1_counts_only_when_named(tmp_path, reference):
    """Preemption(signals=("SIGUSR1",)) (Slurm's early warning): SIGUSR1 during step 3 saves step 3."""
    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS, preemption=pf.Preemption(signals=("SIGUSR1",)))
    pw.signal_at_forward(model, 3, signal.SIGUSR1)
    stopped = _preempted(run)
    assert (stopped.step, stopped.reason) == (3, "SIGUSR1")
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


def test_a_real_max_time_stops_with_a_save_before_the_limit(tmp_path, reference):
    """max_time=0.6 s at about 15 ms a step, margin 0.2 s: a save (marker: max_time) before 0.6 s, exact resume."""
    import time

    start = time.monotonic()
    model, run = pw.build(tmp_path, max_epochs=MAX_EPOCHS, max_time=0.6, preemption=pf.Preemption(margin=0.2))
    pw.slow_steps(model, seconds=0.06)  # 15 steps would take 0.9 s
    stopped = _preempted(run)
    elapsed = time.monotonic() - start
    assert stopped.reason == "max_time" and 1 <= stopped.step < 15
    assert elapsed < 0.6 + 0.3, elapsed  # stopped at a boundary leaving the margin; the save fits in it (with slack)
    assert _marker(tmp_path).get("saved_for") == "max_time" or stopped.step % pw.HOOKS["save_every"] == 0
    _resume_and_compare(tmp_path, [repr(e) for e in run.trace], reference)


def test_the_signal_handlers_are_only_the_loops_while_it_trains(tmp_path):
    """Outside run() SIGTERM is what it was before; inside, the loop's."""
    before = signal.getsignal(signal.SIGTERM)
    model, run = pw.build(tmp_path, max_epochs=1)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(signal.getsignal(signal.SIGTERM)))
    run()
    assert seen and all(h == run.ctx.stopping.requests._handle for h in seen)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_preemption_stop_leaves_its_signal_recorded_with_no_moment_where_it_would_kill(monkeypatch):
    """Leaving the run on Preempted, the SIGTERM handler is never put back to the old one, not even for an instant.

    A SIGTERM between the old handler's return and ``hold`` killed a script that had already said it exits with
    75 (exit -15, SIGTERM sent every 5 ms). Any other exit puts the old handler back.
    """
    before = signal.getsignal(signal.SIGTERM)
    requests = Requests(("SIGTERM",))
    set_on_exit = []
    real = signal.signal
    try:
        with pytest.raises(Preempted), requests:
            monkeypatch.setattr(signal, "signal", lambda sig, handler: set_on_exit.append(sig) or real(sig, handler))
            raise Preempted(75, 2, "SIGTERM", None)
        monkeypatch.undo()
        assert set_on_exit == [] and signal.getsignal(signal.SIGTERM) == requests._handle
    finally:
        signal.signal(signal.SIGTERM, before)
    with pytest.raises(RuntimeError), requests:
        raise RuntimeError("not a stop")
    assert signal.getsignal(signal.SIGTERM) is before


def test_preemption_refuses_signals_it_cannot_hold():
    """SIGINT has save_on_interrupt; SIGKILL cannot be caught; a name that is no signal says so."""
    with pytest.raises(ValueError, match="save_on_interrupt=True"):
        pf.Preemption(signals=(signal.SIGINT,))
    with pytest.raises(ValueError, match="SIGKILL, which no process can catch"):
        pf.Preemption(signals=("SIGKILL",))
    with pytest.raises(ValueError, match="'SIGNOPE', not a signal"):
        pf.Preemption(signals=("SIGNOPE",))
    with pytest.raises(ValueError, match="'max_time' must be seconds >= 0"):
        pf.loop(
            torch.nn.Linear(1, 1),
            torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1),
            [1],
            max_epochs=1,
            max_time="1h",
        )


def test_save_every_minutes_saves_on_the_runs_clock(tmp_path):
    """save_every(minutes=0.005) (0.3 s) at 60 ms a step: saves at Elapsed boundaries at least 0.3 s apart."""
    model, run = tw.build(tmp_path, max_epochs=3, hooks=[pf.save_every(minutes=0.005)])
    pw.slow_steps(model, seconds=0.06)
    run()
    timed = [e for e in run.trace if isinstance(e.event, pf.events.Elapsed)]
    assert timed and all(isinstance(e.effect, SaveCheckpoint) for e in timed)
    seconds = [e.event.seconds for e in timed]
    assert seconds[0] >= 0.3 and all(b - a >= 0.3 for a, b in zip(seconds, seconds[1:]))
    assert [e.step for e in timed] == sorted({e.step for e in timed})
    assert run.trace[-1].effect.final  # and the final save at the end
