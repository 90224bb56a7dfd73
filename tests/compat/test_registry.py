"""build_hooks: pimm hook configs to pimm_fn hooks, and the errors that explain bad ones."""

import re

import pytest

import pimm_fn as pf
from pimm_fn.compat import (
    DEFAULT_REGISTRY,
    HookBase,
    HookRegistry,
    build_hooks,
    ignored,
    register_hook,
    save_every_epoch,
)
from pimm_fn.core.effects import Evaluate, LoadWeights, Log, SaveCheckpoint

KNOWN = (
    "['CheckpointLoader', 'CheckpointSaver', 'CheckpointSaverIteration', 'ClsEvaluator', 'InformationWriter', "
    "'InsSegEvaluator', 'IterationTimer', 'PreciseEvaluator', 'SemSegEvaluator']"
)


def evaluate(model):
    return {"mIoU": 0.5}


def _exact(message):
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize(
    "config, context, expected",
    [
        (dict(type="CheckpointSaverIteration", save_freq=100), {}, pf.save_every(100)),
        (dict(type="CheckpointSaver"), {}, save_every_epoch(1)),
        (dict(type="CheckpointSaver", save_freq=None), {}, save_every_epoch(1)),
        (dict(type="CheckpointSaver", save_freq=5), {}, save_every_epoch(1, snapshot_every=5)),
        (dict(type="CheckpointLoader"), {"weight": "w.pth"}, pf.load_weights("w.pth")),
        (
            dict(type="CheckpointLoader", keywords="module.", replacement="backbone.", strict=True),
            {"weight": "w.pth"},
            pf.load_weights("w.pth", replacements={"module.": "backbone."}, strict=True),
        ),
        (dict(type="CheckpointLoader", weight="own.pth"), {"weight": "ctx.pth"}, pf.load_weights("own.pth")),
        (dict(type="InformationWriter"), {}, pf.log_every(1)),
        (dict(type="InformationWriter", log_interval=20), {}, pf.log_every(20)),
        (dict(type="SemSegEvaluator"), {"evaluate": evaluate}, pf.evaluate_every(0, evaluate)),
        (dict(type="ClsEvaluator"), {"evaluate": evaluate}, pf.evaluate_every(0, evaluate)),
        (dict(type="InsSegEvaluator"), {"evaluate": evaluate}, pf.evaluate_every(0, evaluate)),
        (dict(type="IterationTimer"), {}, ignored("IterationTimer", warmup_iter=1)),
        (dict(type="IterationTimer", warmup_iter=2), {}, ignored("IterationTimer", warmup_iter=2)),
    ],
)
def test_each_pimm_type_maps_to_its_pimm_fn_hook(config, context, expected):
    """Every built-in pimm type builds the pimm_fn hook the mapping table names, equal by value."""
    assert build_hooks([config], **context) == [expected]


def test_iteration_timer_is_a_no_op_the_fold_skips():
    """IterationTimer wants no event, so it emits nothing and costs nothing; its repr shows the config."""
    hook = build_hooks([dict(type="IterationTimer", warmup_iter=2)])[0]
    assert hook.events == () and repr(hook) == "ignored('IterationTimer', warmup_iter=2)"
    assert pf.plan([hook], iters_per_epoch=2, max_epochs=2) == ()


def test_built_hooks_and_hookbase_objects_pass_through():
    """A pimm_fn hook is kept as is and a HookBase instance is adapted, in place."""
    saver, custom = pf.save_every(3), HookBase()
    hooks = build_hooks([saver, dict(type="InformationWriter"), custom])
    assert hooks[0] is saver and hooks[1] == pf.log_every(1)
    assert hooks[2].obj is custom and repr(hooks[2]).startswith("adapt(<pimm_fn.compat.hookbase.HookBase")


def test_a_pimm_config_plans_like_the_equivalent_pimm_fn_hooks():
    """The pimm default hook list and its hand-written pimm_fn translation execute the same effects."""
    pimm = build_hooks(
        [
            dict(type="CheckpointLoader"),
            dict(type="IterationTimer", warmup_iter=2),
            dict(type="InformationWriter", log_interval=4),
            dict(type="SemSegEvaluator"),
            dict(type="CheckpointSaver", save_freq=2),
        ],
        weight="pretrained.pth",
        evaluate=evaluate,
    )
    native = [
        pf.load_weights("pretrained.pth"),
        pf.log_every(4),
        pf.evaluate_every(0, evaluate),
        save_every_epoch(1, snapshot_every=2),
    ]
    metrics = {step: {"mIoU": step / 100} for step in (5, 10, 15)}
    planned = pf.plan(pimm, iters_per_epoch=5, max_epochs=3, metrics=metrics)
    expected = pf.plan(native, iters_per_epoch=5, max_epochs=3, metrics=metrics)
    as_data = lambda entries: [(e.step, e.event, e.effect) for e in entries]
    assert as_data(planned) == as_data(expected)
    kinds = [type(e.effect) for e in planned if e.step == 10]
    assert kinds == [Log, Evaluate, Log, SaveCheckpoint]  # epoch log, evaluation and its log, then the save
    assert planned[0].effect == LoadWeights("pretrained.pth")


@pytest.mark.parametrize(
    "configs, context, error, message",
    [
        (
            [dict(type="CheckpointSaverr")], {}, ValueError,
            "build_hooks: hooks[0] has unknown type 'CheckpointSaverr': did you mean 'CheckpointSaver'? "
            f"(known types: {KNOWN})",
        ),
        (
            [dict(type="Tensorboard")], {}, ValueError,
            f"build_hooks: hooks[0] has unknown type 'Tensorboard' (known types: {KNOWN})",
        ),
        (
            [dict(type="InformationWriter"), "CheckpointSaver"], {}, TypeError,
            "build_hooks: hooks[1] must be a dict with a 'type' key, a pimm_fn hook or a HookBase "
            "(got str: 'CheckpointSaver')",
        ),
        ([dict(save_freq=1)], {}, ValueError, "build_hooks: hooks[0] has no 'type' key (got {'save_freq': 1})"),
        (
            [dict(type="CheckpointSaver", save_frq=1)], {}, TypeError,
            "build_hooks: hooks[0] CheckpointSaver got unknown keyword 'save_frq': did you mean 'save_freq'? "
            "(CheckpointSaver accepts ['save_freq'])",
        ),
        (
            [dict(type="CheckpointLoader", path="w.pth")], {}, TypeError,
            "build_hooks: hooks[0] CheckpointLoader got unknown keyword 'path' "
            "(CheckpointLoader accepts ['keywords', 'replacement', 'strict', 'weight'])",
        ),
        (
            [dict(type="SemSegEvaluator", write_cls_iou=True)], {"evaluate": evaluate}, TypeError,
            "build_hooks: hooks[0] SemSegEvaluator got unknown keyword 'write_cls_iou' "
            "(SemSegEvaluator accepts no keywords)",
        ),
        (
            [dict(type="CheckpointSaverIteration")], {}, TypeError,
            "build_hooks: hooks[0] CheckpointSaverIteration needs keyword 'save_freq' (got [])",
        ),
        (
            [dict(type="CheckpointSaverIteration", save_freq=0)], {}, ValueError,
            "build_hooks: hooks[0] CheckpointSaverIteration: save_every: 'n' must be an int >= 1 (got 0)",
        ),
        (
            [dict(type="CheckpointLoader")], {}, ValueError,
            "build_hooks: hooks[0] CheckpointLoader: needs the weights file to load: pass "
            "build_hooks(..., weight='path/to/model.pth') or dict(type='CheckpointLoader', weight=...); "
            "to resume a run use loop(..., resume='auto') instead",
        ),
        (
            [dict(type="SemSegEvaluator")], {}, ValueError,
            "build_hooks: hooks[0] SemSegEvaluator: needs the evaluation to run: pass build_hooks(..., evaluate=fn) "
            "where fn(model) returns {metric: value} (pimm_fn evaluates at the end of each epoch)",
        ),
        (
            [dict(type="PreciseEvaluator", test_last=False)], {}, ValueError,
            "build_hooks: hooks[0] PreciseEvaluator: a full test pass after training has no pimm_fn hook: drop it "
            "from the hook list, and after run() returns test the weights in save_dir/model/model_best.pth "
            "(or last/) with your tester",
        ),
    ],
)
def test_bad_configs_fail_with_an_exact_explanation(configs, context, error, message):
    """Each kind of bad config raises at build time, naming the item, the type, and the fix."""
    with pytest.raises(error, match=_exact(message)):
        build_hooks(configs, **context)


def test_register_hook_marks_and_registry_add_returns_a_new_registry():
    """Registering is explicit: the decorator only names the factory, add() returns a new registry."""

    @register_hook("EpochLogger")
    def epoch_logger(interval=1):
        return pf.log_every(interval)

    registry = DEFAULT_REGISTRY.add(epoch_logger)
    assert epoch_logger.pimm_type == "EpochLogger" and "EpochLogger" in registry
    assert "EpochLogger" not in DEFAULT_REGISTRY  # nothing global changed
    assert build_hooks([dict(type="EpochLogger", interval=3)], registry=registry) == [pf.log_every(3)]
    with pytest.raises(ValueError, match=r"unknown type 'EpochLogger'"):
        build_hooks([dict(type="EpochLogger")])


def test_registry_add_refuses_silent_overrides_and_unnamed_factories():
    """Replacing a built-in mapping needs replace=True; a factory without a name is refused."""
    mine = lambda save_freq=None: pf.save_every(7)
    taken = "hook type 'CheckpointSaver' is already registered: pass replace=True to override it"
    with pytest.raises(ValueError, match=_exact(taken)):
        DEFAULT_REGISTRY.add(mine, name="CheckpointSaver")
    replaced = DEFAULT_REGISTRY.add(mine, name="CheckpointSaver", replace=True)
    assert build_hooks([dict(type="CheckpointSaver")], registry=replaced) == [pf.save_every(7)]
    unnamed = r"^no hook type name for .*: decorate it with @register_hook\('Name'\) or pass name='Name'$"
    with pytest.raises(ValueError, match=unnamed):
        DEFAULT_REGISTRY.add(lambda: None)
    with pytest.raises(TypeError, match=_exact("register_hook: 'name' must be a non-empty str (got '')")):
        register_hook("")


def test_a_plain_dict_registry_and_context_aware_factories_work():
    """A mapping can serve as registry; a factory with a 'context' parameter receives build_hooks' context."""

    def every(*, context):
        return pf.save_every(context["steps"])

    assert build_hooks([dict(type="Every")], registry={"Every": every}, steps=4) == [pf.save_every(4)]
    registry = HookRegistry({"Every": every})
    assert repr(registry) == "HookRegistry(['Every'])" and dict(registry) == {"Every": every}
