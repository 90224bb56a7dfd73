"""build_hooks: pimm hook configs to pimm_fn hooks with pimm's keywords and defaults, and the errors for bad ones."""

import inspect
import re

import pytest

import pimm_fn as pf
from pimm_fn.compat import (
    DEFAULT_REGISTRY,
    REFUSED,
    HookBase,
    HookRegistry,
    build_hooks,
    checkpoint_loader,
    checkpoint_saver,
    checkpoint_saver_iteration,
    final_evaluator,
    information_writer,
    iteration_timer,
    pimm_evaluator,
    pimm_model_hook,
    register_hook,
    wandb_namer,
)


def score(model):
    return {"mIoU": 0.5}


def _exact(message):
    return "^" + re.escape(message) + "$"


# Every keyword of every type pimm's registry builds, with pimm's default (PIMM.md 2.x, 4).
PIMM_DEFAULTS = {
    "CheckpointSaver": dict(save_freq=None, evaluator_every_n_steps=None),
    "CheckpointSaverIteration": dict(save_freq=None, save_iter_checkpoints=False, backend=None),
    "CheckpointLoader": dict(keywords="", replacement=None, replacements=None, strict=False),
    "InformationWriter": dict(log_frequency=1, step_offset=0),
    "IterationTimer": dict(warmup_iter=1),
    "WandbNamer": dict(keys=(), sep="-", format_numbers=True, extra=None),
    "WeightDecayExclusion": dict(
        exclude_bias_from_wd=True,
        exclude_norm_from_wd=True,
        exclude_gamma_from_wd=True,
        exclude_token_from_wd=True,
        exclude_ndim_1_from_wd=True,
    ),
    "WeightDecayScheduler": dict(base_value=0.04, final_value=0.2, warmup_ratio=1.0),
    "GradientNormLogger": dict(norm_type=2.0, log_per_layer=False, log_frequency=1, prefix="grad_norm"),
    "ParameterCounter": dict(show_details=True, show_gradients=True, sort_by_params=True, min_params=0),
    "AttentionMaskAnnealingHook": dict(log_frequency=100, log_per_layer=False, prefix="anneal"),
    "DtypeOverrider": dict(
        patterns=None,
        class_patterns=None,
        dtype="float32",
        methods_to_override=None,
        override_parameters=False,
        verbose=False,
        check_interval=10,
    ),
    "GarbageHandler": dict(interval=150, disable_auto=True, empty_cache=False),
    "FinalEvaluator": dict(test_last=False),
    "ModelHook": {},
    "SemSegEvaluator": dict(
        write_cls_iou=False, every_n_steps=0, ignore_index=-1, macro_ignore_class_ids=None, per_instance_metrics=False
    ),
    "MAEEvaluator": dict(every_n_steps=0, max_batches=None, log_pointclouds=True),
    "PretrainEvaluator": dict(
        label="segment",
        write_cls_iou=True,
        every_n_steps=1,
        max_train_events=250,
        max_test_events=250,
        class_names=None,
        prefix="",
        train_config=None,
    ),
}


@pytest.mark.parametrize("name", sorted(PIMM_DEFAULTS))
def test_every_type_takes_pimms_keywords_with_pimms_defaults(name):
    """Each built-in factory accepts exactly pimm's keywords, each with pimm's default."""
    params = inspect.signature(DEFAULT_REGISTRY[name]).parameters
    found = {n: p.default for n, p in params.items() if n != "context"}
    assert found == PIMM_DEFAULTS[name]


def test_instance_segmentation_evaluator_takes_all_of_pimms_keywords():
    """InstanceSegmentationEvaluator's seventeen keywords are all accepted, with pimm's defaults."""
    params = inspect.signature(DEFAULT_REGISTRY["InstanceSegmentationEvaluator"]).parameters
    assert len([n for n in params if n != "context"]) == 17
    assert params["select_metric"].default == "det_f1" and params["set_current_metric"].default is True


def _id(value) -> str:
    """A test id without function addresses: the same in every process (parallel runs collect alike)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))[:60]


@pytest.mark.parametrize(
    "config, context, expected",
    [
        (dict(type="CheckpointSaverIteration", save_freq=100), {}, checkpoint_saver_iteration(100)),
        (dict(type="CheckpointSaver"), {}, checkpoint_saver()),
        (dict(type="CheckpointSaver", save_freq=5, evaluator_every_n_steps=10), {}, checkpoint_saver(5, 10)),
        (dict(type="CheckpointLoader"), {}, checkpoint_loader()),
        (
            dict(type="CheckpointLoader", keywords="module.", replacement="backbone.", strict=True),
            {"weight": "w.pth"},
            checkpoint_loader("w.pth", keywords="module.", replacement="backbone.", strict=True),
        ),
        (dict(type="InformationWriter", log_frequency=20), {}, information_writer(20)),
        (dict(type="IterationTimer", warmup_iter=2), {}, iteration_timer(2)),
        (
            dict(type="SemSegEvaluator", every_n_steps=100),
            {"evaluate": score},
            pimm_evaluator("SemSegEvaluator", score, every_n_steps=100),
        ),
        (
            dict(type="SemSegEvaluator", write_cls_iou=True),
            {"evaluate": {"SemSegEvaluator": score}},
            pimm_evaluator("SemSegEvaluator", score, write_cls_iou=True),
        ),
        (dict(type="SemSegEvaluator"), {"evaluate": False}, pimm_evaluator("SemSegEvaluator", None, evaluate=False)),
        (dict(type="FinalEvaluator", test_last=True), {"tester": score}, final_evaluator(score, test_last=True)),
        (dict(type="ModelHook"), {}, pimm_model_hook()),
        (dict(type="WandbNamer", keys=["seed"], extra="fft"), {}, wandb_namer(("seed",), extra="fft")),
    ],
    ids=_id,
)
def test_each_pimm_type_maps_to_its_pimm_fn_hook(config, context, expected):
    """Every built-in pimm type builds the pimm_fn hook the mapping table names, equal by value."""
    assert build_hooks([config], **context) == [expected]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_types_without_a_functional_counterpart_are_refused_with_the_reason(name):
    """A refused type raises at build time, naming the type and saying why and what to do instead."""
    with pytest.raises(ValueError, match=f"^build_hooks: hooks\\[0\\] {name}: not supported: ") as info:
        build_hooks([dict(type=name, some_option=1)])
    assert len(str(info.value)) > 80


def test_simulate_crash_points_at_exact_resume():
    """SimulateCrash's refusal says a pure hook cannot kill the process, and how a run recovers instead."""
    with pytest.raises(ValueError, match=r"kills the process .*resume='auto'"):
        build_hooks([dict(type="SimulateCrash")])


KNOWN = sorted(DEFAULT_REGISTRY)


@pytest.mark.parametrize(
    "configs, context, error, message",
    [
        (
            [dict(type="CheckpointSaverr")],
            {},
            ValueError,
            f"build_hooks: hooks[0] has unknown type 'CheckpointSaverr': did you mean 'CheckpointSaver'? "
            f"(known types: {KNOWN})",
        ),
        (
            [dict(type="InformationWriter"), "CheckpointSaver"],
            {},
            TypeError,
            "build_hooks: hooks[1] must be a dict with a 'type' key, a pimm_fn hook or a HookBase "
            "(got str: 'CheckpointSaver')",
        ),
        ([dict(save_freq=1)], {}, ValueError, "build_hooks: hooks[0] has no 'type' key (got {'save_freq': 1})"),
        (
            [dict(type="CheckpointSaver", save_frq=1)],
            {},
            TypeError,
            "build_hooks: hooks[0] CheckpointSaver got unknown keyword 'save_frq': did you mean 'save_freq'? "
            "(CheckpointSaver accepts ['save_freq', 'evaluator_every_n_steps'])",
        ),
        (
            [dict(type="InformationWriter", log_interval=5)],
            {},
            TypeError,
            "build_hooks: hooks[0] InformationWriter got unknown keyword 'log_interval' "
            "(InformationWriter accepts ['log_frequency', 'step_offset'])",
        ),
        (
            [dict(type="CheckpointSaverIteration", save_freq=0)],
            {},
            ValueError,
            "build_hooks: hooks[0] CheckpointSaverIteration: checkpoint_saver: 'save_freq' must be None or an int "
            ">= 1 (got 0)",
        ),
        (
            [dict(type="CheckpointLoader", replacements=[("a", "b")])],
            {},
            TypeError,
            "build_hooks: hooks[0] CheckpointLoader: CheckpointLoader.replacements must be a {keyword: replacement} "
            "dict, got list",
        ),
        (
            [dict(type="SemSegEvaluator")],
            {},
            ValueError,
            "build_hooks: hooks[0] SemSegEvaluator: needs the evaluation to run: pass build_hooks(..., evaluate=fn) "
            "or evaluate={'SemSegEvaluator': fn}, where fn(model) returns {metric: value} (pimm computes them from "
            "its val loader; here fn does), or evaluate=False (pimm's cfg.evaluate=False)",
        ),
        (
            [dict(type="InstanceSegmentationEvaluator", select_metric="f1")],
            {"evaluate": score},
            ValueError,
            "build_hooks: hooks[0] InstanceSegmentationEvaluator: InstanceSegmentationEvaluator: 'select_metric' "
            "must be 'det_f1' or 'val_head_loss' (got 'f1')",
        ),
        (
            [dict(type="SemSegEvaluator"), dict(type="FinalEvaluator")],
            {"evaluate": score},
            ValueError,
            "build_hooks: hooks[1] FinalEvaluator: needs the test to run after training: pass build_hooks(..., "
            "tester=fn), where fn(model) runs pimm's cfg.test tester on the model it is given and returns "
            "{metric: value} or None, or evaluate=False",
        ),
        (
            [dict(type="FinalEvaluator")],
            {"tester": score},
            ValueError,
            "build_hooks: FinalEvaluator(test_last=False) tests model_best.pth, which no hook of this list writes "
            "(a CheckpointSaver after an evaluator writes it when the evaluator's metric improves): add an "
            "evaluator, or pass test_last=True",
        ),
        (
            [dict(type="DtypeOverrider", dtype="fp32")],
            {},
            ValueError,
            "build_hooks: hooks[0] DtypeOverrider: dtype_overrider: 'dtype' must be one of ['float16', 'float32', "
            "'float64', 'bfloat16', 'int8', 'int16', 'int32'] (got 'fp32')",
        ),
    ],
    ids=_id,
)
def test_bad_configs_fail_with_an_exact_explanation(configs, context, error, message):
    """Each kind of bad config raises at build time, naming the item, the type, and the fix."""
    with pytest.raises(error, match=_exact(message)):
        build_hooks(configs, **context)


def test_build_hooks_refuses_a_keyword_it_does_not_take():
    """A typo in build_hooks' own keywords (wieght=) is an error with a suggestion, not swallowed."""
    with pytest.raises(
        TypeError, match=r"^build_hooks\(\) got an unexpected keyword 'wieght': did you mean 'weight'\?"
    ):
        build_hooks([dict(type="CheckpointLoader")], wieght="w.pth")
    with pytest.raises(TypeError, match=r"pass \['weight'\] as build_hooks' own keywords"):
        build_hooks([], context={"weight": "w.pth"})


def test_built_hooks_and_class_based_hooks_pass_through():
    """A pimm_fn hook is kept as is and a HookBase instance (or any object with pimm's methods) is adapted."""

    class Duck:
        def after_epoch(self):
            return None

    saver, custom, duck = pf.save_every(3), HookBase(), Duck()
    hooks = build_hooks([saver, dict(type="InformationWriter"), custom, duck])
    assert hooks[0] is saver and hooks[1] == information_writer()
    assert hooks[2].obj is custom and hooks[3].obj is duck


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
    mine = lambda save_freq=None: pf.save_every(7)  # noqa: E731
    taken = "hook type 'CheckpointSaver' is already registered: pass replace=True to override it"
    with pytest.raises(ValueError, match=_exact(taken)):
        DEFAULT_REGISTRY.add(mine, name="CheckpointSaver")
    replaced = DEFAULT_REGISTRY.add(mine, name="CheckpointSaver", replace=True)
    assert build_hooks([dict(type="CheckpointSaver")], registry=replaced) == [pf.save_every(7)]
    with pytest.raises(ValueError, match=r"^no hook type name for .*or pass name='Name'$"):
        DEFAULT_REGISTRY.add(lambda: None)


def test_factories_of_your_own_receive_the_context():
    """A factory with a 'context' parameter receives context={...} and build_hooks' own keywords."""

    def every(*, context):
        return pf.save_every(context["steps"]) if context["weight"] is None else pf.load_weights(context["weight"])

    assert build_hooks([dict(type="Every")], registry={"Every": every}, context={"steps": 4}) == [pf.save_every(4)]
    assert build_hooks(
        [dict(type="Every")], registry=HookRegistry({"Every": every}), weight="w.pth", context={"steps": 4}
    ) == [pf.load_weights("w.pth")]
