"""A step is a transaction: an exception anywhere in it, then run() again, ends exactly as an uninterrupted run."""

import json
import tempfile
import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, WriteBest
from pimm_fn.runtime.errors import ResumeNotExactWarning
from pimm_fn.runtime.handlers.dispatch import DEFAULT_HANDLERS
from pimm_fn.runtime.engine.transaction import Interruption
from _tiny_workload import TinyNet, dataset, loader, same, weights


class Injector:
    """Raises ``plan[(site, n)]`` at the n-th call of ``site`` (counting from 1), once each."""

    def __init__(self, plan=()):
        self.plan = dict(plan)
        self.calls = {}

    def __call__(self, site):
        n = self.calls[site] = self.calls.get(site, 0) + 1
        error = self.plan.pop((site, n), None)
        if error is not None:
            raise error(f"injected at {site} call {n}")


INJECT = Injector()  # the current example's; every site below calls it


def inject(site):
    INJECT(site)


class FlakyIterator:
    def __init__(self, iterator):
        self.iterator = iterator

    def __iter__(self):
        return self

    def __next__(self):
        inject("fetch")  # before the loader gives a batch
        batch = next(self.iterator)
        inject("fetch_drawn")  # after: the batch has left the loader
        return batch


class FlakyLoader:
    """A loader whose batches may fail to arrive; everything else is the wrapped loader's."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __iter__(self):
        iterator = iter(self.data)
        inject("open")  # after the loader opened its epoch (its sampler has drawn the order)
        return FlakyIterator(iterator)

    def __getattr__(self, name):
        return getattr(self.data, name)


class FlakyStepLR(torch.optim.lr_scheduler.StepLR):
    def step(self, *args, **kwargs):
        inject("scheduler")
        return super().step(*args, **kwargs)


def noisy_score(model):
    """An evaluator drawing random numbers before it may fail: a retry must draw the same."""
    noise = float(torch.rand(()))
    inject("evaluate")
    x, y = dataset(16, seed=1).tensors
    with torch.no_grad():
        return {"score": -float(((model.out(torch.relu(model.hidden(x))) - y) ** 2).mean()) + 1e-3 * noise}


def after_hook(state, event):
    inject("hook")
    return state, ()


after_hook.events = (pf.events.AfterStep, pf.events.AfterEpoch)


def before_hook(state, event):
    inject("before_hook")
    return state, ()


before_hook.events = (pf.events.BeforeStep, pf.events.BeforeEpoch)


def flaky_handler(site, effect_type):
    real = DEFAULT_HANDLERS[effect_type]

    def handler(effect, state, ctx):
        inject(site)
        return real(effect, state, ctx)

    return handler


HANDLERS = {
    Evaluate: flaky_handler("evaluate_handler", Evaluate),
    SaveCheckpoint: flaky_handler("save", SaveCheckpoint),
    WriteBest: flaky_handler("best", WriteBest),
    Log: flaky_handler("log", Log),
}

# The calls each site sees in the 10 steps of the workload (about): where an injection can land.
SITES = {
    "open": 2,
    "fetch": 11,
    "fetch_drawn": 10,
    "forward": 10,
    "backward": 10,
    "optimizer": 10,
    "scheduler": 11,
    "hook": 12,
    "before_hook": 12,
    "evaluate": 2,
    "evaluate_handler": 2,
    "save": 4,
    "best": 2,
    "log": 6,
}


def build(save_dir, kind, before, optimizer_cls=torch.optim.Adam):
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = optimizer_cls(model.parameters(), lr=0.01)
    scheduler = FlakyStepLR(optimizer, step_size=4, gamma=0.9)
    model.register_forward_pre_hook(lambda module, args: inject("forward"))
    model.hidden.weight.register_hook(lambda grad: inject("backward"))
    hooks = [
        pf.evaluate_every(4, noisy_score, name="val"),
        pf.save_every(3),
        pf.best_on("score"),
        pf.log_every(5),
        after_hook,
        *([before_hook] if before else []),
    ]
    run = pf.loop(
        model,
        optimizer,
        FlakyLoader(loader(kind)),
        hooks=hooks,
        max_epochs=2,
        save_dir=save_dir,
        scheduler=scheduler,
        saving=pf.Saving(checkpoint_format="legacy"),
        watching=pf.Watching(console=False),
        handlers=HANDLERS,
    )
    # Registered after the loop's own step hooks: the loop still tells it ran before optimizer.step's body.
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: inject("optimizer"))
    return model, optimizer, scheduler, run


def outcome(save_dir, model, optimizer, scheduler, run) -> dict:
    log = (save_dir / "log.jsonl").read_text().splitlines()
    return {
        "weights": weights(model),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "trace": [repr(e) for e in run.trace],
        "state": run.state,
        "log": [json.loads(line) for line in log],
        "rng": torch.get_rng_state(),
    }


_REFERENCE = {}


def uninterrupted(kind, before) -> dict:
    global INJECT
    if (kind, before) not in _REFERENCE:
        INJECT = Injector()
        with tempfile.TemporaryDirectory() as tmp:
            from pathlib import Path

            parts = build(Path(tmp), kind, before)
            parts[-1]()
            _REFERENCE[kind, before] = outcome(Path(tmp), *parts)
    return _REFERENCE[kind, before]


failure = st.tuples(
    st.sampled_from(sorted(SITES)),
    st.integers(1, 12),
    st.sampled_from([RuntimeError, KeyboardInterrupt]),
    st.booleans(),  # fails again when retried
)


@pytest.mark.parametrize("kind", ["plain", "stateful"])
@settings(max_examples=25, deadline=None)
# The drain's fetch at epoch 1's end fails, then so does the opening that rebuilds its iterator to drain it again.
@example(failures=[("fetch", 6, RuntimeError, False), ("open", 2, RuntimeError, False)], before=False)
@given(failures=st.lists(failure, min_size=1, max_size=3), before=st.booleans())
def test_run_after_an_interruption_anywhere_in_a_step_ends_as_if_uninterrupted(kind, failures, before):
    """Exceptions and KeyboardInterrupts at any site of a step or effect, then run(): same weights, optimizer, trace, log."""
    global INJECT
    expected = uninterrupted(kind, before)
    plan = {}
    for site, n, error, again in failures:
        n = min(n, SITES[site])
        if site == "scheduler":
            n = max(n, 2)  # its first call is the scheduler's own, at construction
        plan[site, n] = error
        if again:
            plan[site, n + 1] = error
    INJECT = Injector(plan)
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = build(Path(tmp), kind, before)
        run = parts[-1]
        raised = 0
        while True:
            try:
                run()
                break
            except (RuntimeError, KeyboardInterrupt) as error:
                assert "injected at" in str(error)
                assert isinstance(run.interrupted, Interruption) and not run.finished
                raised += 1
                assert raised <= 2 * len(plan)
        assert run.interrupted is None and run.finished
        got = outcome(Path(tmp), *parts)
    assert not [w for w in caught if issubclass(w.category, ResumeNotExactWarning)]
    assert got["trace"] == expected["trace"]
    assert got["log"] == expected["log"]  # no effect ran twice, none was skipped
    assert got["state"] == expected["state"]
    assert same(got["weights"], expected["weights"])
    assert same(got["optimizer"], expected["optimizer"])
    assert same(got["scheduler"], expected["scheduler"])
    assert same(got["rng"], expected["rng"])


# -- what the loop says, and run.interrupted ---------------------------------------------------------
def _interrupt(tmp_path, site, n=1, *, error=RuntimeError, before=False):
    global INJECT
    INJECT = Injector({(site, n): error})
    parts = build(tmp_path, "plain", before)
    run = parts[-1]
    run.ctx.console = True
    with pytest.raises(error, match="injected at"):
        run()
    return parts, run


@pytest.mark.parametrize(
    "site,n,step,phase",
    [
        ("fetch", 3, 3, "loading the batch"),
        ("fetch_drawn", 3, 3, "loading the batch"),
        ("forward", 2, 2, "the train step"),
        ("backward", 4, 4, "the train step"),
        ("optimizer", 5, 5, "the train step"),  # a pre-hook: before the step's body, nothing changed
        ("scheduler", 3, 2, "the scheduler step"),  # the first call is the scheduler's own, at construction
        ("hook", 1, 1, "hook test_interruption.after_hook"),
        ("evaluate", 1, 4, "effect Evaluate(evaluator='val', step=4, broadcast=True)"),
        ("save", 1, 3, "effect SaveCheckpoint(step=3"),
        ("log", 1, 4, "effect Log(step=4"),
    ],
)
def test_an_interruption_says_where_it_stopped_and_reraises(tmp_path, capsys, site, n, step, phase):
    """One console line names the step and the phase; run.interrupted holds them until the step completes."""
    _, run = _interrupt(tmp_path, site, n)
    stopped = run.interrupted
    assert stopped.step == step and stopped.phase.startswith(phase)
    out = capsys.readouterr().out
    line = f"[pimm_fn] interrupted at step {step} during {stopped.phase}; run() continues exactly from here"
    assert out.count("interrupted at") == 1 and line in out
    run()
    assert run.interrupted is None and run.finished


def test_a_keyboard_interrupt_is_reraised_unchanged(tmp_path):
    """A KeyboardInterrupt reaches the caller as itself, after the line is said."""
    _, run = _interrupt(tmp_path, "backward", 2, error=KeyboardInterrupt)
    assert run.interrupted == Interruption(2, "the train step")


def test_interrupted_is_read_only(tmp_path):
    """Loop.interrupted is a view of the loop's own record: it cannot be assigned."""
    _, run = _interrupt(tmp_path, "forward", 1)
    with pytest.raises(AttributeError):
        run.interrupted = None


def test_step_after_an_interruption_completes_that_step_only(tmp_path):
    """step() after an interruption in a step's effects finishes that step, and trains no further."""
    global INJECT
    INJECT = Injector({("save", 1): RuntimeError})
    *_, run = build(tmp_path, "plain", False)
    run.run(steps=2)
    with pytest.raises(RuntimeError):
        run.step()
    assert run.state.progress.global_step == 3 and run.interrupted.step == 3
    run.step()
    assert run.state.progress.global_step == 3 and run.interrupted is None
    assert [type(e.effect) for e in run.trace] == [SaveCheckpoint]
    run.step()
    assert run.state.progress.global_step == 4


class HalfSteppingAdam(torch.optim.Adam):
    """Adam whose third step changes a parameter, then raises: a failure inside the step's body."""

    calls = 0

    def step(self, closure=None):
        HalfSteppingAdam.calls += 1
        if HalfSteppingAdam.calls == 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].add_(1.0)
            raise RuntimeError("inside the step")
        return super().step(closure)


def test_an_exception_inside_the_optimizer_step_warns_that_resume_is_not_exact(tmp_path):
    """An exception in optimizer.step()'s body, where parameters may have changed, is warned about, naming the step."""
    global INJECT
    INJECT = Injector()
    HalfSteppingAdam.calls = 0
    *_, run = build(tmp_path, "plain", False, optimizer_cls=HalfSteppingAdam)
    with pytest.warns(ResumeNotExactWarning, match=r"step 3 was interrupted inside optimizer.step\(\)"):
        with pytest.raises(RuntimeError, match="inside the step"):
            run()
    assert run.interrupted == Interruption(3, "the optimizer step")
    run()
    assert run.finished and run.interrupted is None
