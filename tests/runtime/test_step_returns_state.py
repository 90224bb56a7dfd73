"""run.step() and run.run(steps=) return the same thing: the run's State, so a notebook cell shows its summary."""

import pimm_fn as pf
from _tiny_workload import build


def test_step_and_run_both_return_the_state(tmp_path):
    """step() returns run.state (as run(steps=) and run() do), after the step it trained."""
    _, run = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=1)
    stepped = run.step()
    assert isinstance(stepped, pf.State) and stepped is run.state and stepped.progress.global_step == 1
    ran = run.run(steps=2)
    assert isinstance(ran, pf.State) and ran is run.state and ran.progress.global_step == 3
    assert run() is run.state and run.state.finished
