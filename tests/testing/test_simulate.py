"""simulate(): exact traces, inputs, resumes and argument errors."""

import math
import pickle
import subprocess
import sys

import pytest

import pimm_fn.testing as kit
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, Scope, WriteBest
from pimm_fn.hooks import best_on, early_stop, evaluate_every, log_every, save_every
from pimm_fn.testing import SimEntry, simulate

from _kit_hooks import miou


def test_save_every_4_over_10x3_at_world_size_4_saves_on_cadence_on_every_rank():
    """save_every(4), 10 iterations x 3 epochs: 4..28 on cadence, 20 deferred to AfterEpoch, 30 final."""
    result = simulate([save_every(4)], world_size=4, iters_per_epoch=10, max_epochs=3)
    expected = [
        (4, "AfterStep", False),
        (8, "AfterStep", False),
        (12, "AfterStep", False),
        (16, "AfterStep", False),
        (20, "AfterEpoch", False),
        (24, "AfterStep", False),
        (28, "AfterStep", False),
        (30, "AfterTrain", True),
    ]
    for rank, trace in enumerate(result.traces):
        assert [(e.step, e.during, e.effect.final) for e in trace] == expected
        assert all(isinstance(e.effect, SaveCheckpoint) and e.rank == rank and e.hook == 0 for e in trace)
    assert [s.rank for s in result.states] == [0, 1, 2, 3]
    assert all(s.finished and s.progress.global_step == 30 for s in result.states)


def test_main_effects_appear_on_rank_0_only_as_the_interpreter_runs_them():
    """Log and WriteBest execute on rank 0 only; collective effects on every rank."""
    hooks = [evaluate_every(2, miou), best_on("mIoU"), log_every(2)]
    result = simulate(hooks, world_size=3, iters_per_epoch=4, max_epochs=1, metrics={2: {"mIoU": 0.5}})
    assert {type(e.effect) for e in result.traces[0]} == {Evaluate, WriteBest, Log}
    for rank in (1, 2):
        assert [e.effect for e in result.traces[rank]] == [Evaluate("miou", 2), Evaluate("miou", 4)]
    assert result.collective(1) == tuple(e for e in result.traces[1])
    assert result.effects(0, WriteBest) == (WriteBest("mIoU", 0.5, 2),)


def test_broadcast_evaluation_publishes_rank_0_values_on_every_rank():
    """With broadcast, rank 0's result is what every rank's state holds."""
    result = simulate(
        [evaluate_every(1, miou), best_on("mIoU")],
        world_size=3,
        iters_per_epoch=2,
        max_epochs=1,
        metrics=lambda step, rank: {"mIoU": 10.0 * rank + step},
    )
    assert [s.best["mIoU"] for s in result.states] == [2.0, 2.0, 2.0]


def test_unbroadcast_evaluation_keeps_each_ranks_own_values_and_none_publishes_nothing():
    """Without broadcast each rank publishes its own result; a rank computing None publishes {}."""
    result = simulate(
        [evaluate_every(1, miou, broadcast=False), best_on("mIoU")],
        world_size=3,
        iters_per_epoch=2,
        max_epochs=1,
        metrics=lambda step, rank: None if rank == 2 else {"mIoU": 10.0 * rank + step},
    )
    assert [s.best.get("mIoU") for s in result.states] == [2.0, 12.0, None]
    assert result.states[2].metrics == {}


def test_local_inputs_reach_each_ranks_after_step_events():
    """local(step, rank) becomes that rank's AfterStep outputs, and its epoch means."""
    result = simulate(
        [log_every(1)],
        world_size=2,
        iters_per_epoch=2,
        max_epochs=1,
        local=lambda step, rank: {"loss": float(step + 10 * rank)},
    )
    rank0 = result.traces[0]
    assert [e.event.outputs["loss"] for e in rank0 if isinstance(e.event, ev.AfterStep)] == [1.0, 2.0]
    assert result.states[1].slots[0].sums == {}  # the epoch ended: sums reset
    assert result.traces[0][-1].effect.values["loss"] == 1.5


def test_resume_stitches_prefix_and_resumed_suffix():
    """A resume at 12 restarts from the checkpoint state; the stitched trace equals the uninterrupted one."""
    stack = [evaluate_every(3, miou), save_every(4), best_on("mIoU"), log_every(5)]
    kwargs = dict(world_size=2, iters_per_epoch=5, max_epochs=3, metrics=lambda s, r: {"mIoU": (s * 7) % 5})
    plain, resumed = simulate(stack, **kwargs), simulate(stack, resume_at=12, **kwargs)
    assert resumed.resume_at == (12,)
    for rank in range(2):
        index = resumed.resume_index[rank][0]
        assert resumed.traces[rank][:index] == plain.traces[rank][:index]
        assert resumed.traces[rank][index - 1].step == 12  # the save of step 12 ends the prefix
        assert [e for e in resumed.traces[rank] if e.event != ev.BeforeTrain(resumed=True)] == list(plain.traces[rank])
        assert resumed.states[rank] == plain.states[rank]


def test_several_kills_in_one_run():
    """resume_at may list increasing steps: the run is killed and resumed at each."""
    stack = [save_every(2), log_every(1)]
    kwargs = dict(world_size=2, iters_per_epoch=3, max_epochs=2, local=lambda s, r: {"loss": 1.0})
    plain, resumed = simulate(stack, **kwargs), simulate(stack, resume_at=[2, 3, 6], **kwargs)
    assert [len(i) for i in resumed.resume_index] == [3, 3]
    assert resumed.traces == plain.traces  # no hook emits on BeforeTrain(resumed=True)


def test_a_resume_point_after_an_early_stop_is_refused_naming_where_the_run_ended_and_the_fix():
    """resume_at past the step early_stop ended the run at is a ValueError: that step, why, and what to pass."""
    hooks = [evaluate_every(2, miou), early_stop("mIoU", patience=1), save_every(2)]
    with pytest.raises(ValueError) as info:
        simulate(
            hooks,
            world_size=2,
            iters_per_epoch=4,
            max_epochs=3,
            metrics={2: {"mIoU": 0.5}, 4: {"mIoU": 0.4}},
            resume_at=6,
        )
    message = str(info.value)
    assert message.startswith(
        "simulate: resume_at holds step 6, but the run ended at step 4 before reaching it: "
        "a hook stopped it (early_stop('mIoU', patience=1): mIoU has not improved"
    )
    assert message.endswith(
        "Resume at steps up to 4 (assert_resume_continuity leaves out the steps after the run's end itself)"
    )


def test_a_saver_listed_before_the_evaluator_saves_after_the_evaluation():
    """Every save closes its event: the checkpoint holds the best value, and the resumed run keeps it."""
    stack = [save_every(2), evaluate_every(2, miou), best_on("mIoU")]
    result = simulate(
        stack, world_size=1, iters_per_epoch=6, max_epochs=1, resume_at=2, metrics={2: {"mIoU": 0.9}, 4: {"mIoU": 0.5}}
    )
    assert result.effects(0, WriteBest) == (WriteBest("mIoU", 0.9, 2),)
    at_2 = [type(e.effect).__name__ for e in result.traces[0] if e.step == 2]
    assert at_2 == ["Evaluate", "WriteBest", "SaveCheckpoint"]


def test_entries_convert_to_plan_entries_and_results_pickle():
    """SimEntry.to_trace_entry matches plan(); results and strategies' values pickle."""
    result = simulate([save_every(2)], world_size=1, iters_per_epoch=2, max_epochs=2)
    from pimm_fn import plan

    assert tuple(e.to_trace_entry() for e in result.traces[0]) == plan([save_every(2)], iters_per_epoch=2, max_epochs=2)
    assert pickle.loads(pickle.dumps(result.traces)) == result.traces
    assert isinstance(result.traces[0][0], SimEntry)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(world_size=0), "'world_size' must be an int >= 1 (got 0)"),
        (dict(iters_per_epoch="10"), "'iters_per_epoch' must be an int >= 1 (got '10')"),
        (dict(max_epochs=-1), "'max_epochs' must be an int >= 0 (got -1)"),
        (dict(resume_at=0), "'resume_at' must hold steps in [1, 6]"),
        (dict(resume_at=7), "'resume_at' must hold steps in [1, 6]"),
        (dict(resume_at=[3, 2]), "'resume_at' must be strictly increasing (got [3, 2])"),
        (dict(metrics=5), "'metrics' must be None, a mapping"),
        (dict(metrics={"2": {"mIoU": 1.0}}), "'metrics' as a mapping must be {step: {name: value}}"),
        (dict(local=[1.0]), "'local' must be a callable local(step, rank)"),
    ],
)
def test_bad_arguments_fail_at_once_naming_the_argument(kwargs, message):
    """Every argument is validated before anything runs, with the argument and value in the error."""
    base = dict(world_size=2, iters_per_epoch=3, max_epochs=2)
    with pytest.raises((ValueError, TypeError)) as info:
        simulate([save_every(2)], **{**base, **kwargs})
    assert message in str(info.value)


def test_bad_callable_results_name_the_step_and_rank():
    """A metrics or local callable returning a non-mapping is reported with its step and rank."""
    with pytest.raises(TypeError, match=r"metrics\(2, 0\) must return a mapping"):
        simulate([evaluate_every(2, miou)], world_size=1, iters_per_epoch=2, max_epochs=1, metrics=lambda s, r: 0.5)
    with pytest.raises(TypeError, match=r"local\(1, 0\) must return a mapping"):
        simulate([log_every(1)], world_size=1, iters_per_epoch=2, max_epochs=1, local=lambda s, r: 0.5)
    with pytest.raises(TypeError, match="wrap a single hook"):
        simulate(save_every(2), world_size=1, iters_per_epoch=2, max_epochs=1)


def test_nan_outputs_do_not_break_anything():
    """NaN losses flow through logging; the run still ends."""
    result = simulate(
        [log_every(1)], world_size=2, iters_per_epoch=2, max_epochs=1, local=lambda s, r: {"loss": math.nan}
    )
    assert math.isnan(result.traces[0][-1].effect.values["loss"])


def test_importing_and_simulating_leaves_torch_unimported():
    """The kit is pure: import pimm_fn.testing and a simulation never import torch."""
    code = (
        "import sys\n"
        "import pimm_fn.testing as kit\n"
        "from pimm_fn.testing import strategies\n"
        "from pimm_fn.hooks import save_every, best_on, evaluate_every, log_every\n"
        "def f(model): return None\n"
        "r = kit.simulate([evaluate_every(2, f), save_every(3), best_on('mIoU'), log_every(1)], world_size=3,\n"
        "    iters_per_epoch=4, max_epochs=2, resume_at=5, metrics=strategies.MetricStream(),\n"
        "    local=strategies.LocalInputs((1.0, 2.0)))\n"
        "kit.assert_collective_agreement(r)\n"
        "m = kit.Membership(3, lost={1: 2}, rejoined={1: 4})\n"
        "kit.assert_fault_tolerant(kit.simulate_replicas([save_every(2)], membership=m, length=9, batch_size=1,\n"
        "    max_epochs=2))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_public_surface():
    """__all__ lists exactly the kit's public names, each importable."""
    assert kit.__all__ == [
        "simulate",
        "SimulationResult",
        "SimEntry",
        "assert_collective_agreement",
        "assert_resume_continuity",
        "simulate_replicas",
        "Membership",
        "ReplicasResult",
        "ReplicaRun",
        "assert_fault_tolerant",
    ]
    assert all(hasattr(kit, name) for name in kit.__all__)
    from pimm_fn.testing import strategies

    assert all(hasattr(strategies, name) for name in strategies.__all__)


def test_docstring_examples_run():
    """The examples in the kit's docstrings pass (also collected by --doctest-modules)."""
    import doctest

    import pimm_fn.testing.assertions
    import pimm_fn.testing.simulation
    import pimm_fn.testing.strategies

    for module in (kit, pimm_fn.testing.simulation, pimm_fn.testing.assertions, pimm_fn.testing.strategies):
        failed, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert failed == 0, module.__name__


def test_scope_of_recorded_collectives():
    """collective() keeps COLLECTIVE entries only."""
    result = simulate([evaluate_every(1, miou), log_every(1)], world_size=1, iters_per_epoch=1, max_epochs=1)
    assert all(e.effect.scope is Scope.COLLECTIVE for e in result.collective(0))
    assert len(result.collective(0)) == 1 and len(result.traces[0]) == 3


def test_the_kit_imports_nothing_impure():
    """pimm_fn.testing's modules import no torch, os, time, logging or file APIs (an ast scan)."""
    import ast
    from pathlib import Path

    forbidden = {"torch", "os", "time", "logging", "pathlib", "io", "shutil", "random"}
    for path in Path(kit.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
