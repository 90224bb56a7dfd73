"""Every unit of a step's work runs in one protocol: ``with unit:`` of the step's ``Transaction``."""

import ast
import pathlib

import pytest

import pimm_fn.runtime as runtime_package
from pimm_fn.core.schedule import skip_to
from pimm_fn.runtime.engine.preemption import OWN_FILES, CtrlC
from pimm_fn.runtime.engine.outputs import QuietSteps
from pimm_fn.runtime.engine.transaction import Interruption, Transaction

from tests.runtime._tiny_workload import build

_RUNTIME = pathlib.Path(runtime_package.__file__).parent


def _opens_units(path: pathlib.Path) -> bool:
    """The module makes units of a transaction (a call ``<something>.unit(...)``)."""
    tree = ast.parse(path.read_text())
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "unit" for n in ast.walk(tree)
    )


def test_every_module_that_opens_units_holds_a_ctrl_c_back_in_its_own_code():
    """A module entering units is one of the loop's own files: a Ctrl-C landing in its bookkeeping waits."""
    opening = {str(p.relative_to(_RUNTIME)) for p in _RUNTIME.rglob("*.py") if _opens_units(p)}
    assert {"engine/walker.py", "step/driver.py"} <= opening
    assert {str(_RUNTIME / name) for name in opening | {"engine/transaction.py", "engine/outputs.py"}} <= OWN_FILES


def test_the_loops_own_files_are_files_of_the_package():
    """Every file the Ctrl-C handler holds a signal back in exists: a module moved or renamed cannot drop out of it."""
    assert OWN_FILES and all(pathlib.Path(path).is_file() for path in OWN_FILES)


def _transaction(tmp_path, keys):
    _, run = build(tmp_path / "run")
    return Transaction(run.ctx, run._interpreter, last_step=lambda: 7, keys=keys)


def test_a_unit_that_raises_records_where_the_step_stopped_and_lets_the_error_go_on(tmp_path):
    """The phase function is asked once, with the step; ``None`` as the step names the last trained one."""
    keys = CtrlC()
    tx = _transaction(tmp_path, keys)
    asked = []
    unit = tx.unit(lambda step, error: asked.append((step, type(error))) or f"phase of {type(error).__name__}")
    error = ValueError("boom")
    with pytest.raises(ValueError) as raised:
        with unit:
            assert keys.open
            raise error
    assert raised.value is error and not keys.open
    assert asked == [(None, ValueError)]
    assert tx.interrupted == Interruption(7, "phase of ValueError")


def test_a_unit_that_succeeds_records_nothing(tmp_path):
    """Open inside the block, closed after it; nothing interrupted."""
    keys = CtrlC()
    tx = _transaction(tmp_path, keys)
    tx.step = 3
    with tx.unit("the train step"):
        assert keys.open
    assert not keys.open and tx.interrupted is None


def test_a_ctrl_c_held_back_stops_the_next_unit_before_its_work(tmp_path):
    """A held Ctrl-C is raised as the unit opens, recorded at that unit's step and phase; its body never runs."""
    keys = CtrlC()
    tx = _transaction(tmp_path, keys)
    keys.pending = True
    tx.step = 4
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with tx.unit("loading the batch"):
            ran.append(True)
    assert not ran and not keys.pending and not keys.open
    assert tx.interrupted == Interruption(4, "loading the batch")


def test_quiet_steps_are_taken_into_the_state_at_once(tmp_path):
    """Counted steps reach the state as ``skip_to`` would put them there, and are then no longer counted."""
    _, run = build(tmp_path / "run", hooks=[])
    run.step()  # past the epoch's opening: the next steps are quiet
    state = run.state
    p = state.progress
    quiet = QuietSteps()
    for step in (p.global_step + 1, p.global_step + 2):
        quiet.count(step, 8, {"loss": 0.5})
    assert quiet.taken(state) == skip_to(state, p.global_step + 2, samples=16)
    assert quiet.last is None and quiet.samples == 0
    assert [s for s, _ in quiet.unread.steps] == [p.global_step + 1, p.global_step + 2]
