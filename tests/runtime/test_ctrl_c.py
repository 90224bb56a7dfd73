"""A real Ctrl-C (SIGINT) is taken inside the step's work and held back inside the loop's own records."""

import gc
import os
import signal
import sys
import time
import weakref

import pytest

from pimm_fn.runtime.engine.preemption import CtrlC


def _sigint_and_spin():
    """Deliver a real SIGINT to this process while running code of this (user) file."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs at the next bytecode boundary
        time.sleep(0)


def test_a_sigint_inside_opened_work_raises_at_once():
    """With a piece of work open, a SIGINT landing in user code is a KeyboardInterrupt there."""
    keys = CtrlC()
    with keys:
        keys.start()
        with pytest.raises(KeyboardInterrupt):
            _sigint_and_spin()
    assert keys.pending  # until the loop stops a step on it (Transaction.stop): a dropped raise is not lost


def test_a_sigint_between_pieces_of_work_is_held_until_the_next_one_starts():
    """Outside opened work the signal is held; the next start() raises it, where the loop records it."""
    keys = CtrlC()
    with keys:
        _sigint_and_spin()  # nothing open: held
        assert keys.pending
        with pytest.raises(KeyboardInterrupt):
            keys.start()
        assert not keys.pending and not keys.open


def _finalizer_receiving_a_sigint(kind: str, finished: list):
    """Run a finalizer of ``kind`` that takes a real SIGINT, then appends to ``finished``; returns what undoes it."""

    def finalize(*_):
        _sigint_and_spin()
        finished.append(kind)

    if kind == "__del__":

        class Closes:
            def __del__(self):
                finalize()

        Closes()  # collected at once: its __del__ runs here
        return lambda: None
    if kind == "weakref.finalize":
        weakref.finalize(type("Held", (), {})(), finalize)  # its object dies at once, and the callback runs
        return lambda: None
    gc.callbacks.append(finalize)
    gc.collect()
    return lambda: gc.callbacks.remove(finalize)


@pytest.mark.parametrize("kind", ["__del__", "weakref.finalize", "gc callback"])
def test_a_sigint_inside_a_finalizer_is_held_so_the_finalizer_finishes(kind, monkeypatch):
    """Raised in a finalizer, the KeyboardInterrupt would be dropped ("Exception ignored") with the rest of its work:
    the signal is held there, and the next piece of work raises it."""
    dropped, finished = [], []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    keys = CtrlC()
    with keys:
        keys.start()
        undo = _finalizer_receiving_a_sigint(kind, finished)
        undo()
        assert keys.pending
        with pytest.raises(KeyboardInterrupt):
            keys.start()
    assert finished[:1] == [kind] and dropped == []


def test_a_sigint_whose_raise_python_drops_still_stops_the_run_and_run_again_ends_bit_identical(tmp_path):
    """A KeyboardInterrupt raised where Python drops exceptions (a gc callback, a ``__del__``) stops the next unit."""
    import _tiny_workload as tw

    _, reference = tw.build(tmp_path / "reference", max_epochs=1)
    reference()
    dropped = []

    def drops_a_sigint(state, event):  # a hook of this (user) file: the signal raises here, and is swallowed
        if event.__class__.__name__ == "AfterStep" and event.step == 2 and not dropped:
            try:
                _sigint_and_spin()
            except KeyboardInterrupt:
                dropped.append(event.step)
        return state, ()

    model, run = tw.build(tmp_path / "interrupted", max_epochs=1, hooks=[*tw.standard_hooks(), drops_a_sigint])
    with pytest.raises(KeyboardInterrupt):
        run()
    assert dropped == [2] and run.state.progress.global_step == 2  # raised at the end of the step it landed in
    run()
    assert tw.same_weights(tw.weights(model), tw.weights(reference.ctx.model))


def test_a_sigint_that_code_inside_the_work_turns_into_another_error_stops_the_step_as_the_interruption(tmp_path):
    """Torch's zip writer, interrupted in its Python write, raises a RuntimeError ("unexpected pos") instead of the
    KeyboardInterrupt: the step stops on the interruption (the other error its cause), and run() again continues
    exactly, as after any Ctrl-C, instead of failing the run with a storage error."""
    import _tiny_workload as tw

    _, reference = tw.build(tmp_path / "reference", max_epochs=1)
    reference()
    turned = []

    def turns_a_sigint_into_an_error(state, event):  # a hook of this (user) file, as torch's writer would
        if event.__class__.__name__ == "AfterStep" and event.step == 2 and not turned:
            try:
                _sigint_and_spin()
            except KeyboardInterrupt:
                turned.append(event.step)
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
        return state, ()

    model, run = tw.build(
        tmp_path / "interrupted", max_epochs=1, hooks=[*tw.standard_hooks(), turns_a_sigint_into_an_error]
    )
    with pytest.raises(KeyboardInterrupt) as raised:
        run()
    assert turned == [2] and "unexpected pos" in str(raised.value.__cause__)
    assert run.state.progress.global_step == 1  # the fold of step 2's AfterStep is redone on the next run()
    run()
    assert tw.same_weights(tw.weights(model), tw.weights(reference.ctx.model))


def test_a_sigint_during_the_optimizer_step_waits_for_it_to_finish():
    """While holding (inside optimizer.step()), the signal waits; the end of the step raises it."""
    keys = CtrlC()
    with keys:
        keys.start()
        keys.holding = True
        _sigint_and_spin()
        assert keys.pending
        with pytest.raises(KeyboardInterrupt):
            keys.safe_point()


def test_a_sigint_after_the_optimizer_step_but_inside_the_train_step_is_held_to_its_end(tmp_path):
    """A SIGINT after optimizer.step()'s hooks, before the train step returns: the step completes, then it stops, exactly."""
    import warnings

    import _tiny_workload as tw

    _, reference = tw.build(tmp_path / "reference", max_epochs=1)
    reference()
    model, run = tw.build(tmp_path / "interrupted", max_epochs=1)
    fired = []

    def interrupt_once(optimizer, args, kwargs):  # registered last: runs after the loop's own step hooks
        if run.state.progress.global_step == 2 and not fired:
            fired.append(True)
            _sigint_and_spin()

    run.ctx.optimizer.register_step_post_hook(interrupt_once)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ResumeNotExactWarning would fail the test
        with pytest.raises(KeyboardInterrupt):
            run()
        assert run.interrupted is not None
        run()
    assert fired
    assert tw.same_weights(tw.weights(model), tw.weights(reference.ctx.model))
    assert [repr(e) for e in run.trace] == [repr(e) for e in reference.trace]


def test_a_sigint_inside_the_scheduler_step_waits_for_it_to_finish(tmp_path):
    """A SIGINT while the scheduler steps (its count moved, its lr not yet set): the step completes, exactly once."""
    import warnings

    import torch

    import _tiny_workload as tw

    fired = []

    class InterruptedStepLR(torch.optim.lr_scheduler.StepLR):
        def get_lr(self):  # runs after last_epoch += 1, before the new lr is set
            if self.last_epoch == 3 and not fired:
                fired.append(True)
                _sigint_and_spin()
            return super().get_lr()

    def build(save_dir):
        model, run = tw.build(save_dir, max_epochs=1)
        optimizer = run.ctx.optimizer
        run.ctx.scheduler = InterruptedStepLR(optimizer, step_size=2, gamma=0.5)
        return model, run

    _, reference = build(tmp_path / "reference")
    fired.append("reference")
    reference()
    fired.clear()
    model, run = build(tmp_path / "interrupted")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyboardInterrupt):
            run()
        run()
    assert fired == [True]
    assert run.ctx.scheduler.last_epoch == reference.ctx.scheduler.last_epoch
    assert tw.same_weights(tw.weights(model), tw.weights(reference.ctx.model))


def test_the_previous_handler_is_back_after_the_run():
    """Leaving the outermost run() restores whatever SIGINT handler was installed before."""
    before = signal.getsignal(signal.SIGINT)
    keys = CtrlC()
    with keys:
        with keys:  # run() calling step()
            assert signal.getsignal(signal.SIGINT) == keys._handle
        assert signal.getsignal(signal.SIGINT) == keys._handle
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("kind", ["plain", "stateful"])
def test_real_sigints_at_any_moment_then_run_again_end_bit_identical(tmp_path, kind):
    """SIGINTs sent at arbitrary moments of a real run, each followed by run(), end as the uninterrupted run."""
    import threading

    import pimm_fn as pf
    import _tiny_workload as tw

    def build(save_dir):
        hooks = [
            pf.evaluate_every(7, tw.negative_mse, name="val"),
            pf.save_every(25),
            pf.best_on("score"),
            pf.log_every(10),
        ]
        return tw.build(save_dir, kind=kind, hooks=hooks, max_epochs=30)

    model, run = build(tmp_path / "reference")
    run()
    expected, trace = tw.weights(model), [repr(e) for e in run.trace]
    model, run = build(tmp_path / "interrupted")
    interrupts = 0

    def dropped(signum, frame):  # a late signal outside run() is dropped
        pass

    def interrupt(delay, done):
        """SIGINT ``delay`` s after run() holds the signal: under load run() may start late, and runs slower."""
        while signal.getsignal(signal.SIGINT) is dropped:
            if done.wait(0.001):
                return
        if not done.wait(delay):
            os.kill(os.getpid(), signal.SIGINT)

    outside = signal.signal(signal.SIGINT, dropped)
    try:
        for delay in (0.01, 0.023, 0.037, 0.05, 0.071, 0.09, 0.13):
            done = threading.Event()
            sender = threading.Thread(target=interrupt, args=(delay, done))
            sender.start()
            try:
                run.run()
            except BaseException:  # a save interrupted inside the checkpoint writer arrives wrapped by it
                interrupts += 1
            done.set()
            sender.join()
        run.run()
    finally:
        signal.signal(signal.SIGINT, outside)
    assert interrupts >= 3
    assert tw.same_weights(tw.weights(model), expected)
    assert [repr(e) for e in run.trace] == trace
