"""Call in real runs: a hook asks for a function of the user's by name; plan shows it, the run calls it."""

from typing import ClassVar

import attrs
import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint.discovery import latest_checkpoint
from pimm_fn.core.effects import Call, Scope
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.testing.assertions import matches_plan
from _tiny_workload import TinyNet, loader

ITERS = 5  # the tiny loader: 40 samples in batches of 8


def note(state, ctx, label, *, times=1):
    """Write what the call saw (step, rank, the model's class, its arguments) to a file under save_dir."""
    line = f"{state.progress.global_step} {ctx.rank} {type(unwrap(ctx.model)).__name__} {label * times}\n"
    with open(ctx.save_dir / "calls.txt", "a") as file:
        file.write(line)
    ctx.say(f"noted {label} at step {state.progress.global_step}")


@attrs.frozen
class CallEvery:
    """Every n steps, a Call of ``function`` with ``args``/``kwargs`` on ``scope``."""

    n: int
    function: str
    args: tuple = ()
    kwargs: tuple = ()
    scope: Scope = Scope.MAIN
    after_saves: bool = False
    events: ClassVar[tuple] = (pf.events.AfterStep,)
    emits: ClassVar[tuple] = (Call,)
    rank_consistent: ClassVar[bool] = True

    @property
    def every(self):
        return self.n

    def __call__(self, state, event):
        return state, (Call(self.function, event.step, self.args, dict(self.kwargs), self.scope, self.after_saves),)


def note_the_last_checkpoint(state, ctx):
    """Write the step of the newest checkpoint on disk when the call runs."""
    found = latest_checkpoint(ctx.model_dir)
    with open(ctx.save_dir / "found.txt", "a") as file:
        file.write(f"{state.progress.global_step}: {found.step if found is not None else None}\n")


def _run(tmp_path, hooks, **watching):
    torch.manual_seed(0)
    model = TinyNet()
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        hooks=hooks,
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(progress=False, **watching),
    )


def test_a_hook_asks_for_a_function_by_name_plan_shows_it_and_the_run_calls_it(tmp_path, capsys):
    """Call.of(note) every 2 steps: plan lists the Calls, the run calls note(state, ctx, 'hi', times=2) at 2 and 4."""
    name = Call.of(note, 0).function
    hooks = [CallEvery(2, name, ("hi",), (("times", 2),)), pf.log_every(2)]
    planned = pf.plan(hooks, iters_per_epoch=ITERS, max_epochs=1)
    calls = [e.effect for e in planned if isinstance(e.effect, Call)]
    assert calls == [Call(name, 2, ("hi",), {"times": 2}), Call(name, 4, ("hi",), {"times": 2})]
    assert f"Call('{name}', 2, args=('hi',), kwargs=FrozenMap({{'times': 2}}))" in repr(list(planned))
    run = _run(tmp_path, hooks)
    run()
    assert (tmp_path / "calls.txt").read_text() == "2 0 TinyNet hihi\n4 0 TinyNet hihi\n"
    said = [line for line in capsys.readouterr().out.splitlines() if "step 4" in line]
    assert said[0].startswith("[pimm_fn] step 4 train:") and said[1] == "[pimm_fn] noted hi at step 4"  # a record first
    assert matches_plan(run.trace, hooks, iters_per_epoch=ITERS, max_epochs=1)


@pytest.mark.parametrize("after_saves, found", [(True, "2: 2\n4: 4\n"), (False, "2: None\n4: 2\n")])
def test_a_call_after_saves_finds_its_steps_checkpoint_written_though_its_hook_stands_first(
    tmp_path, after_saves, found
):
    """Call(after_saves=True) runs after the step's save, wherever its hook stands; a plain Call runs before it."""
    name = Call.of(note_the_last_checkpoint, 0).function
    hooks = [CallEvery(2, name, after_saves=after_saves), pf.save_every(2)]
    run = _run(tmp_path, hooks, console=False)
    run()
    assert (tmp_path / "found.txt").read_text() == found
    at_2 = [type(e.effect).__name__ for e in run.trace if e.step == 2]
    assert at_2 == (["SaveCheckpoint", "Call"] if after_saves else ["Call", "SaveCheckpoint"])
    assert matches_plan(run.trace, hooks, iters_per_epoch=ITERS, max_epochs=1)


@pytest.mark.parametrize(
    "function, says",
    [
        (
            f"{__name__}:no_such_function",
            rf"'{__name__}' has no attribute 'no_such_function', so '{__name__}:no_such_function' names nothing",
        ),
        (
            "no_such_module_here:note",
            r"module 'no_such_module_here' cannot be imported \(No module named 'no_such_module_here'\)",
        ),
        (f"{__name__}:ITERS", r"names 5 \(int\), not a function"),
    ],
)
def test_a_call_whose_function_cannot_be_found_is_refused_naming_it_and_the_fix(tmp_path, function, says):
    """A name that resolves to no callable stops the run at its first Call with a LookupError saying so and the fix."""
    run = _run(tmp_path, [CallEvery(2, function)], console=False)
    with pytest.raises(LookupError, match=rf"^Call\('{function}', 2\): .*{says}.*Call\.of\(fn, step\) writes its name"):
        run()
    assert run.state.progress.global_step == 2 and not (tmp_path / "calls.txt").exists()
