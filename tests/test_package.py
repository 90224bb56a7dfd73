"""Package-level guards: public API, purity of the core, pickling and reprs of values."""

import ast
import doctest
import importlib
import inspect
import pathlib
import pickle
import subprocess
import sys

import pytest

import pimm_fn
from pimm_fn.core import effects as fx
from pimm_fn.core import events as ev
from pimm_fn.core.frozen import FrozenMap

ROOT = pathlib.Path(pimm_fn.__file__).parent

PUBLIC = {
    "compat",
    "checkpoint",
    "effects",
    "events",
    "register_slot_type",
    "Scope",
    "Chain",
    "TraceEntry",
    "chain",
    "FrozenMap",
    "StepOutputs",
    "StepOutputsClosed",
    "plan",
    "keep_last",
    "keep_every",
    "keep_best",
    "any_of",
    "Progress",
    "State",
    "StepState",
    "save_every",
    "SaveEveryState",
    "best_on",
    "BestState",
    "evaluate_every",
    "load_weights",
    "log_every",
    "LogState",
    "model_hook",
    "early_stop",
    "EarlyStopState",
    "step_scheduler",
    "loop",
    "Loop",
    "train_step",
    "TrainStep",
    "CollectiveDivergenceError",
    "ResumeError",
    "CheckpointError",
    "ResumeNotExactWarning",
    "NonFiniteLossError",
    "NonFiniteLossWarning",
    "ema",
    "EmaWeights",
    "MissingHandlerError",
    "ConfigurationWarning",
    "PeerFailureError",
    "ReplicaError",
    "DuplicateHookError",
    "hook_factory",
    "History",
    "JsonlLogger",
    "CSVLogger",
    "TensorBoardLogger",
    "WandbLogger",
    "MLFlowLogger",
    "SaveDirLockError",
    "Saving",
    "Resuming",
    "Watching",
    "Parallel",
    "FaultTolerance",
    "Training",
    "Preemption",
    "Preempted",
    "loader_evaluator",
    "LoaderEvaluator",
    "profile",
}


def test_all_is_exactly_the_public_api():
    """pimm_fn.__all__ lists exactly the expected public names, once each."""
    assert sorted(pimm_fn.__all__) == sorted(PUBLIC)
    assert len(pimm_fn.__all__) == len(set(pimm_fn.__all__))
    assert set(dir(pimm_fn)) >= PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_resolves(name):
    """Every name in __all__ resolves to a value (the runtime ones on first use)."""
    assert getattr(pimm_fn, name) is not None


def test_unknown_attribute_is_an_attribute_error():
    """An unknown attribute raises AttributeError naming it."""
    with pytest.raises(AttributeError, match="module 'pimm_fn' has no attribute 'nope'"):
        pimm_fn.nope


def test_pure_api_does_not_import_torch():
    """import pimm_fn, plan, the hooks, events and effects run without importing torch."""
    code = """
import sys
import pimm_fn as pf
from pimm_fn.core import codec, schedule
def validate(model):
    return None
hooks = [pf.evaluate_every(5, validate), pf.best_on("miou"), pf.save_every(4), pf.log_every(2),
         pf.load_weights("w.pth"), pf.model_hook()]
trace = pf.plan(hooks, iters_per_epoch=10, max_epochs=2, metrics={5: {"miou": 0.5}})
assert len(trace) > 10, trace
pf.events.AfterStep(1, {"loss": 1.0}); pf.effects.SaveCheckpoint(1)
codec.loads(codec.dumps(pf.State(pf.Progress(10, 2))))
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


FORBIDDEN = {"torch", "os", "time", "logging", "io", "pathlib", "shutil", "random", "socket", "subprocess"}
PURE_FILES = sorted(p for pkg in ("core", "hooks", "testing") for p in (ROOT / pkg).glob("*.py"))


def forbidden_imports(source: str) -> list:
    """The forbidden top-level modules ``source`` imports, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] in FORBIDDEN]
    return found


def test_forbidden_import_scan_catches_every_form():
    """The scan flags import x, import x.y, from x import y and from x.y import z."""
    source = "import os\nimport os.path as p\nfrom time import time\nfrom torch.nn import Module\nimport json\nfrom . import io\n"
    assert forbidden_imports(source) == [(1, "os"), (2, "os.path"), (3, "time"), (4, "torch.nn")]


@pytest.mark.parametrize("path", PURE_FILES, ids=[f"{p.parent.name}/{p.name}" for p in PURE_FILES])
def test_pure_modules_import_nothing_impure(path):
    """The pure core, hooks and testing modules import no torch, os, clock, logging or file/process API."""
    assert forbidden_imports(path.read_text()) == []


def validate(model):
    return {"miou": 0.5}


HOOKS = [
    pimm_fn.save_every(4),
    pimm_fn.save_every(1000, snapshots=True),
    pimm_fn.profile(wait=2, active=4, skip_first=10, dir="prof"),
    pimm_fn.save_every(minutes=30),
    pimm_fn.save_every(100, minutes=0.5, async_save=True),
    pimm_fn.best_on("mIoU"),
    pimm_fn.best_on("loss", mode="min"),
    pimm_fn.log_every(50),
    pimm_fn.load_weights("w.pth"),
    pimm_fn.load_weights("w.pth", replacements={"backbone.": "encoder."}, strict=True),
    pimm_fn.model_hook(),
    pimm_fn.chain(pimm_fn.save_every(2), pimm_fn.chain(pimm_fn.best_on("a"), pimm_fn.log_every(1))),
    pimm_fn.evaluate_every(200, validate),
    pimm_fn.evaluate_every(0, validate, name="val", broadcast=False),
    pimm_fn.early_stop("loss", patience=3, mode="min", min_delta=0.01),
    pimm_fn.step_scheduler("epoch"),
    pimm_fn.step_scheduler(on="loss"),
    pimm_fn.ema(0.999),
    pimm_fn.ema(0.99, every=4, name="slow"),
    pimm_fn.evaluate_every(200, validate, weights="ema"),
]

EVENTS = [
    ev.ModifyConfig(),
    ev.BeforeTrain(),
    ev.BeforeTrain(resumed=True),
    ev.BeforeEpoch(3),
    ev.BeforeStep(7),
    ev.AfterStep(7, {"loss": 0.5}, batch_size=8),
    ev.AfterEpoch(3),
    ev.AfterTrain(),
    ev.MetricsPublished({"miou": 0.5}, "val", 7, consistent=False),
    ev.MetricsPublished({"miou": 0.5}, "val", 7, weights="ema"),
    ev.StopRequested(7, "plateau"),
    ev.Elapsed(7, 12.5),
]

EFFECTS = [
    fx.SaveCheckpoint(8),
    fx.SaveCheckpoint(30, snapshot=True, final=True),
    fx.SaveCheckpoint(9, saved_for="SIGTERM"),
    fx.WriteBest("miou", 0.5, 8),
    fx.Evaluate("val", 8, broadcast=False),
    fx.Log(8, "train", {"loss": 0.5}),
    fx.LoadWeights("w.pth", (("a.", "b."),), strict=True),
    fx.Stop(7, "plateau"),
    fx.StepScheduler(7),
    fx.StepScheduler(8, "loss", 0.5),
    fx.UpdateEma("ema", 8, 0.999),
    fx.Evaluate("val", 8, weights="ema"),
    fx.WriteBest("miou", 0.5, 8, "ema"),
    fx.Call("math:hypot", 7, (3, 4)),
    fx.Call("mylib.viz:show", 2, ("a", {"n": [1]}), {"k": None}, fx.Scope.LOCAL),
]


def test_every_event_and_effect_type_is_covered():
    """The pickle and repr guards cover every event and effect class the modules export."""
    event_types = {getattr(ev, n) for n in ev.__all__ if isinstance(getattr(ev, n), type)} - {ev.Event}
    effect_types = {getattr(fx, n) for n in fx.__all__ if isinstance(getattr(fx, n), type)} - {fx.Effect, fx.Scope}
    assert {type(e) for e in EVENTS} == event_types
    assert {type(e) for e in EFFECTS} == effect_types
    hook_factories = {
        "save_every",
        "best_on",
        "log_every",
        "load_weights",
        "model_hook",
        "evaluate_every",
        "early_stop",
        "step_scheduler",
        "ema",
    }
    assert {repr(h).split("(")[0] for h in HOOKS} >= hook_factories


@pytest.mark.parametrize("value", HOOKS + EVENTS + EFFECTS, ids=repr)
def test_values_pickle_round_trip(value):
    """Every hook, event and effect is equal to itself after a pickle round trip, and hashes alike."""
    back = pickle.loads(pickle.dumps(value))
    assert back == value and type(back) is type(value)
    assert hash(back) == hash(value)


NAMESPACE = {
    **vars(pimm_fn),
    **{n: getattr(ev, n) for n in ev.__all__},
    **{n: getattr(fx, n) for n in fx.__all__},
    "FrozenMap": FrozenMap,
    "validate": validate,
}


@pytest.mark.parametrize("value", HOOKS + EVENTS + EFFECTS, ids=repr)
def test_reprs_evaluate_back_to_equal_values(value):
    """A hook's repr reads like its factory call; every repr evaluates back to an equal value."""
    assert eval(repr(value), NAMESPACE) == value


def test_hook_reprs_without_callables_need_only_the_package():
    """Hooks that carry no callable eval back from their repr with vars(pimm_fn) alone."""
    for hook in HOOKS:
        if "evaluate_every" not in repr(hook):
            assert eval(repr(hook), vars(pimm_fn)) == hook


def test_bound_model_hook_reads_like_the_call():
    """A bound model_hook still reprs as model_hook()."""
    assert repr(pimm_fn.model_hook().bind(object())) == "model_hook()"


DOCTEST_MODULES = sorted(
    ".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__") for p in ROOT.rglob("*.py")
)


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples_run(name):
    """Every docstring example in every module runs as written."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.mark.parametrize(
    "name", ["save_every", "best_on", "evaluate_every", "log_every", "load_weights", "model_hook", "chain", "plan"]
)
def test_public_functions_have_docstrings_with_examples(name):
    """Every public factory has a docstring with a runnable example."""
    doc = inspect.getdoc(getattr(pimm_fn, name))
    assert doc and ">>>" in doc
