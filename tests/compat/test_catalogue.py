"""pimm's hook catalogue: configs modelled on pimm's build, every type pimm's configs use is covered, and each
pure hook decides as pimm does (cadences, schedules, records), checked by planning."""

import math

import pytest

import pimm_fn as pf
from pimm_fn.compat import REFUSED, build_hooks
from pimm_fn.compat.effects import (
    AnnealAttention,
    CollectGarbage,
    CountParameters,
    ExcludeWeightDecay,
    FinalTest,
    LogGradientNorm,
    OverrideDtype,
    SetWeightDecay,
    TimeStep,
)
from pimm_fn.compat.evaluators import current_metric
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate, Log
from pimm_fn.core.state import Progress, State

PARTICLES = ["shower", "track", "michel", "delta", "led"]

# Hook lists written after pimm's configs (configs/_base_/default_runtime.py, tests/tiny_semseg_crash.py,
# panda/panseg/detector-v5-*, panda/pretrain/pretrain-sonata-*, polarmae/pretrain-polarmae-pilarnet.py, and the
# older configs naming MAEEvaluator, the annealing detector, profiling and export hooks).
DEFAULT_RUNTIME = [
    dict(type="CheckpointLoader"),
    dict(type="ModelHook"),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter"),
    dict(type="SemSegEvaluator"),
    dict(type="CheckpointSaver", save_freq=None),
    dict(type="FinalEvaluator", test_last=False),
]
TINY_CRASH = [
    dict(type="CheckpointLoader"),
    dict(type="IterationTimer", warmup_iter=0),
    dict(type="InformationWriter"),
    dict(type="SemSegEvaluator"),
    dict(type="CheckpointSaver", save_freq=5),
    dict(type="SimulateCrash"),
]
PANSEG = [
    dict(type="WandbNamer", keys=("model.type", "data.train.max_len", "amp_dtype", "seed"), extra="joint-fft"),
    dict(
        type="WeightDecayExclusion",
        exclude_bias_from_wd=True,
        exclude_norm_from_wd=True,
        exclude_gamma_from_wd=True,
        exclude_token_from_wd=True,
        exclude_ndim_1_from_wd=True,
    ),
    dict(type="CheckpointLoader", replacements={}, strict=False),
    dict(type="ParameterCounter", show_details=True, show_gradients=False, sort_by_params=False, min_params=1),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter"),
    dict(
        type="InstanceSegmentationEvaluator",
        every_n_steps=6,
        stuff_threshold=0.5,
        mask_threshold=0.5,
        iou_thresh=0.5,
        class_names={"particle": PARTICLES, "interaction": ["nu", "cosmic"]},
        require_class_for_match=False,
        labels=("particle", "interaction"),
        primary_label="particle",
    ),
    dict(type="CheckpointSaver", save_freq=None, evaluator_every_n_steps=6),
    dict(type="FinalEvaluator", test_last=True),
]
ANNEALING_DETECTOR = [
    dict(type="WandbNamer", keys=("model.type", "seed")),
    dict(type="CheckpointLoader", keywords="module.backbone", replacement="module.model.backbone"),
    dict(type="ModelHook"),
    dict(type="AttentionMaskAnnealingHook", log_frequency=4, log_per_layer=True),
    dict(type="GradientNormLogger", log_frequency=3),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter", log_frequency=5),
    dict(type="InstanceSegmentationEvaluator", every_n_steps=0, labels="particle"),
    dict(type="CheckpointSaverIteration", save_freq=4, backend="dcp"),
    dict(type="FinalEvaluator", test_last=False),
]
SONATA_PRETRAIN = [
    dict(type="WandbNamer", keys=("model.type", "data.train.max_len", "amp_dtype", "seed"), sep="-"),
    dict(type="ParameterCounter", show_details=False, show_gradients=False, sort_by_params=True, min_params=1),
    dict(type="WeightDecayExclusion"),
    dict(type="CheckpointLoader"),
    dict(
        type="DtypeOverrider",
        class_patterns=["LayerNorm"],
        dtype="float32",
        override_parameters=True,
        methods_to_override=["forward"],
    ),
    dict(type="ModelHook"),
    dict(type="WeightDecayScheduler", base_value=0.04, final_value=0.2, warmup_ratio=1.0),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter"),
    dict(type="CheckpointSaverIteration", save_freq=1000),
    dict(type="GradientNormLogger", log_frequency=10, log_per_layer=False),
    dict(
        type="PretrainEvaluator",
        write_cls_iou=True,
        every_n_steps=4,
        train_config=dict(criteria=[dict(type="CrossEntropyLoss", weight=[1.0, 2.0])]),
    ),
    dict(type="PrototypeUsageLogger", log_frequency=10, prefix="prototypes"),
    dict(type="FeatureStdMonitor", log_frequency=10, prefix="feature_std", monitor_student=True),
    dict(type="LogitEntropyLogger", logits_key="teacher_logits"),
]
POLARMAE = [
    dict(type="WandbNamer", keys=("model.type", "data.train.max_len")),
    dict(type="ParameterCounter", show_details=True, show_gradients=False, sort_by_params=True, min_params=1),
    dict(type="IterationTimer", warmup_iter=2),
    dict(type="InformationWriter"),
    dict(type="MAEEvaluator", every_n_steps=3, max_batches=2),
    dict(type="CheckpointSaverIteration", save_freq=1000, save_iter_checkpoints=False),
    dict(type="WeightDecayExclusion"),
    dict(type="CheckpointLoader"),
    dict(type="GarbageHandler", interval=3),
    dict(type="ResourceUtilizationLogger", log_frequency=10),
    dict(type="RuntimeProfiler", interrupt=False),
    dict(type="PushToHub", repo_id="someone/model"),
]
CONFIGS = {
    "default_runtime": DEFAULT_RUNTIME,
    "tiny_crash": TINY_CRASH,
    "panseg": PANSEG,
    "annealing_detector": ANNEALING_DETECTOR,
    "sonata_pretrain": SONATA_PRETRAIN,
    "polarmae": POLARMAE,
}

# Every hook type pimm's configs name (the counts of issue 13, plus the base types).
PIMM_CONFIG_TYPES = {
    "CheckpointLoader",
    "CheckpointSaver",
    "CheckpointSaverIteration",
    "InformationWriter",
    "IterationTimer",
    "SemSegEvaluator",
    "WandbNamer",
    "WeightDecayExclusion",
    "FinalEvaluator",
    "GradientNormLogger",
    "ParameterCounter",
    "InstanceSegmentationEvaluator",
    "AttentionMaskAnnealingHook",
    "ModelHook",
    "DtypeOverrider",
    "WeightDecayScheduler",
    "PretrainEvaluator",
    "PrototypeUsageLogger",
    "FeatureStdMonitor",
    "SimulateCrash",
    "ResourceUtilizationLogger",
    "LogitEntropyLogger",
    "RuntimeProfiler",
    "GarbageHandler",
    "MAEEvaluator",
    "PushToHub",
}


def evaluate(model):
    return {}


def test_the_configs_cover_every_type_pimms_configs_use():
    """The hook lists here name each of the 26 types pimm's configs use."""
    assert {h["type"] for config in CONFIGS.values() for h in config} == PIMM_CONFIG_TYPES


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_config_builds_and_plans_once_its_refused_types_are_dropped(name):
    """A config names its refused types in the first error; without them its hook list builds and plans."""
    config = CONFIGS[name]
    refused = [h["type"] for h in config if h["type"] in REFUSED]
    if refused:
        with pytest.raises(ValueError, match=f"{refused[0]}: not supported: "):
            build_hooks(config, evaluate=evaluate, tester=evaluate)
    kept = [h for h in config if h["type"] not in REFUSED]
    hooks = build_hooks(kept, weight="w.pth", evaluate=evaluate, tester=evaluate)
    assert len(hooks) == len(kept)
    trace = pf.plan(hooks, iters_per_epoch=6, max_epochs=2)
    assert trace and trace[-1].step == 12


def _effects(hooks, kind, **schedule):
    return [(e.step, e.effect) for e in pf.plan(hooks, **schedule) if isinstance(e.effect, kind)]


def test_panseg_config_evaluates_and_saves_on_the_same_steps_and_tracks_the_primary_labels_f1():
    """every_n_steps=6 evaluations and evaluator_every_n_steps=6 saves coincide; best is val/particle/ins_det_f1."""
    hooks = build_hooks([h for h in PANSEG if h["type"] not in REFUSED], evaluate=evaluate, tester=evaluate)
    evaluations = [step for step, _ in _effects(hooks, Evaluate, iters_per_epoch=6, max_epochs=2)]
    assert evaluations == [6, 12]
    assert [h for h in hooks if repr(h).startswith("checkpoint_saver")][0].metric == "val/particle/ins_det_f1"
    assert _effects(hooks, FinalTest, iters_per_epoch=6, max_epochs=2) == [(12, FinalTest(12, "FinalEvaluator", True))]


@pytest.mark.parametrize(
    "type_name, options, metric",
    [
        ("SemSegEvaluator", {}, ("mIoU", "max")),
        ("MAEEvaluator", {}, ("neg_val_loss", "max")),
        ("PretrainEvaluator", {}, ("mF1", "max")),
        ("InstanceSegmentationEvaluator", {}, ("val/ins_det_f1", "max")),
        ("InstanceSegmentationEvaluator", {"labels": "particle"}, ("val/particle/ins_det_f1", "max")),
        ("InstanceSegmentationEvaluator", {"labels": ("a", "b"), "primary_label": "b"}, ("val/b/ins_det_f1", "max")),
        ("InstanceSegmentationEvaluator", {"labels": "a", "prefix": "/test/"}, ("test/ins_det_f1", "max")),
        ("InstanceSegmentationEvaluator", {"select_metric": "val_head_loss"}, ("val/head_loss_total", "min")),
        ("InstanceSegmentationEvaluator", {"set_current_metric": False}, None),
    ],
)
def test_each_evaluator_names_pimms_current_metric(type_name, options, metric):
    """The metric the savers track is the one pimm's evaluator publishes as current (PIMM.md 2.3)."""
    assert current_metric(type_name, options) == metric


@pytest.mark.parametrize(
    "config, steps",
    [
        (dict(type="SemSegEvaluator"), [4, 8, 12]),
        (dict(type="SemSegEvaluator", every_n_steps=5), [5, 10]),
        (dict(type="PretrainEvaluator"), list(range(1, 13))),
        (dict(type="MAEEvaluator", every_n_steps=6), [6, 12]),
    ],
)
def test_evaluators_run_on_pimms_cadence(config, steps):
    """every_n_steps > 0: after global steps it divides; 0: at each epoch's end (PretrainEvaluator defaults to 1)."""
    hooks = build_hooks([config], evaluate=evaluate)
    assert [s for s, _ in _effects(hooks, Evaluate, iters_per_epoch=4, max_epochs=3)] == steps


def test_an_evaluation_without_the_current_metric_is_said_and_a_near_miss_refused():
    """The saver would never see a metric the evaluator does not publish: a warning, or for 'miou' an error."""
    hook = build_hooks([dict(type="SemSegEvaluator")], evaluate=evaluate)[0]
    state = State(Progress(4, 1, global_step=4))
    _, said = hook(state, ev.MetricsPublished({"allAcc": 0.9}, "SemSegEvaluator", 4))
    assert [e.kind for e in said] == ["eval/SemSegEvaluator", "warning"]
    assert "without 'mIoU'" in said[1].values["message"]
    with pytest.raises(ValueError, match="did you mean 'miou'"):
        hook(state, ev.MetricsPublished({"miou": 0.9}, "SemSegEvaluator", 4))


def _pimm_cosine(base, final, total, i):
    """pimm's CosineScheduler table, written out with lists."""
    length = len(range(math.ceil(total)))
    table = [final + 0.5 * (base - final) * (1 + math.cos(math.pi * k / length)) for k in range(length)]
    return final if i >= total else table[i]


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_weight_decay_follows_pimms_cosine_by_global_step(ratio):
    """Before step s the decay is pimm's cosine at index s - 1 over max_steps * warmup_ratio, then final_value."""
    hooks = build_hooks([dict(type="WeightDecayScheduler", base_value=0.04, final_value=0.2, warmup_ratio=ratio)])
    values = [e for _, e in _effects(hooks, SetWeightDecay, iters_per_epoch=5, max_epochs=2)]
    assert values == [SetWeightDecay(s, _pimm_cosine(0.04, 0.2, 10 * ratio, s - 1)) for s in range(1, 11)]
    resumed = pf.plan(hooks, iters_per_epoch=5, max_epochs=2, start_step=5)
    assert [e.effect for e in resumed] == values[5:]


def test_wandb_namer_names_the_run_from_the_config_unless_the_command_line_did():
    """At ModifyConfig the name joins the dotted keys' values (numbers as K/M/B) and extra; a CLI name is kept."""
    namer = build_hooks(
        [dict(type="WandbNamer", keys=("model.type", "data.train.max_len", "amp_dtype", "seed"), extra="fft")]
    )[0]
    cfg = {"model": {"type": "Sonata-v1m1"}, "data": {"train": {"max_len": 1000000}}, "amp_dtype": None, "seed": 0}
    state, _ = namer(State(Progress(1, 1), config=cfg), ev.ModifyConfig())
    assert state.config["wandb_run_name"] == "Sonata-v1m1-1M-0-fft"
    named = {**cfg, "wandb_run_name": "mine", "_cli_options": ("wandb_run_name",)}
    assert namer(State(Progress(1, 1), config=named), ev.ModifyConfig())[0].config["wandb_run_name"] == "mine"
    assert namer.name({"data": {"train": {"max_len": 2500}}, "seed": 1234}) == "2.5K-1.2K-fft"


def test_information_writer_logs_pimms_selection_at_its_steps_and_epoch_averages():
    """Every log_frequency global steps and at each epoch's last step; total_loss as loss; match_ keys and logits
    dropped; epoch means; step_offset shifts the per-step records only."""
    hooks = build_hooks([dict(type="InformationWriter", log_frequency=4, step_offset=100)])
    writer = hooks[0]
    state = State(Progress(3, 1), slots=(writer.init(),)).with_slot(writer.init())
    records = []
    for step, loss in ((1, 3.0), (2, 1.0), (3, 2.0)):
        progress = Progress(3, 1, iter_in_epoch=step, global_step=step)
        state = State(progress, slots=state.slots, slot=state.slot)
        outputs = {"loss": 9.0, "total_loss": loss, "match_cost": 1.0, "seg_logits": 0.0, "lr": 0.1}
        state, effects = writer(state, ev.AfterStep(step, outputs))
        records += effects
    state, effects = writer(state, ev.AfterEpoch(0))
    records += effects
    assert [(r.step, r.kind) for r in records] == [(103, "train"), (3, "epoch")]
    assert dict(records[0].values) == {"epoch": 1, "of_epochs": 1, "iter": 3, "of": 3, "lr": 0.1, "loss": 2.0}
    assert dict(records[1].values) == pytest.approx({"epoch": 1, "lr": 0.1, "loss": 2.0})


def test_cadenced_diagnostics_follow_the_global_step_and_restart_nothing_on_resume():
    """Gradient norms every log_frequency global steps (pimm counts its own calls, restarting at 0 on resume);
    annealing told the step before training and after each step; garbage every interval steps of each epoch."""
    hooks = build_hooks(
        [
            dict(type="GradientNormLogger", log_frequency=3),
            dict(type="AttentionMaskAnnealingHook", log_frequency=4),
            dict(type="GarbageHandler", interval=2),
        ]
    )
    schedule = dict(iters_per_epoch=5, max_epochs=2)
    assert [s for s, _ in _effects(hooks, LogGradientNorm, **schedule)] == [3, 6, 9]
    anneal = _effects(hooks, AnnealAttention, **schedule)
    assert anneal[0] == (0, AnnealAttention(0)) and [e.step for _, e in anneal[1:]] == list(range(1, 11))
    assert [e.step for _, e in anneal if e.log] == [4, 8]
    garbage = [(s, e.collect, e.automatic) for s, e in _effects(hooks, CollectGarbage, **schedule)]
    assert garbage == [
        (0, False, False),
        (2, True, None),
        (4, True, None),
        (7, True, None),
        (9, True, None),
        (10, True, True),
    ]
    resumed = pf.plan(hooks, start_step=5, **schedule)
    assert [e.effect.step for e in resumed if isinstance(e.effect, LogGradientNorm)] == [6, 9]
    assert resumed[0].effect == AnnealAttention(5)


def test_iteration_timer_times_every_step_and_reports_at_each_epochs_end():
    """TimeStep after every step, warm-up for the first warmup_iter + 1 steps of each epoch, a report at its end."""
    hooks = build_hooks([dict(type="IterationTimer", warmup_iter=1)])
    timed = [e for _, e in _effects(hooks, TimeStep, iters_per_epoch=4, max_epochs=2)]
    assert [(t.step, t.steps_left, t.warmup, t.report) for t in timed] == [
        (1, 7, True, False),
        (2, 6, True, False),
        (3, 5, False, False),
        (4, 4, False, True),
        (5, 3, True, False),
        (6, 2, True, False),
        (7, 1, False, False),
        (8, 0, False, True),
    ]


def test_once_before_training_hooks_request_their_work_at_before_train():
    """ParameterCounter, WeightDecayExclusion and DtypeOverrider act once, before the first step."""
    hooks = build_hooks(
        [h for h in SONATA_PRETRAIN if h["type"] in ("ParameterCounter", "WeightDecayExclusion", "DtypeOverrider")]
    )
    trace = pf.plan(hooks, iters_per_epoch=2, max_epochs=1)
    assert [(type(e.event).__name__, type(e.effect)) for e in trace] == [
        ("BeforeTrain", CountParameters),
        ("BeforeTrain", ExcludeWeightDecay),
        ("BeforeTrain", OverrideDtype),
    ]
    assert trace[2].effect == OverrideDtype(class_patterns=("LayerNorm",), override_parameters=True)


def test_the_default_runtime_writes_model_best_for_its_final_evaluator():
    """pimm's default runtime never writes model_best (PIMM.md 6.3); here each improving evaluation writes it,
    so FinalEvaluator(test_last=False) finds it."""
    hooks = build_hooks(DEFAULT_RUNTIME, evaluate=evaluate, tester=evaluate)
    trace = pf.plan(hooks, iters_per_epoch=3, max_epochs=2, metrics={3: {"mIoU": 0.1}, 6: {"mIoU": 0.2}})
    kinds = [(e.step, type(e.effect).__name__) for e in trace if not isinstance(e.effect, (Log, TimeStep))]
    assert kinds == [
        (3, "Evaluate"),
        (3, "WriteBest"),
        (6, "Evaluate"),
        (6, "WriteBest"),
        (6, "FinalTest"),
        (6, "SaveCheckpoint"),
    ]


def test_built_hooks_read_like_their_factory_calls_and_pickle():
    """Every hook the configs build evaluates back from its repr to an equal value, and pickles."""
    import pickle

    import pimm_fn.compat as compat
    from pimm_fn.core.frozen import FrozenMap

    namespace = {**vars(compat), "FrozenMap": FrozenMap, "evaluate": evaluate}
    for config in CONFIGS.values():
        hooks = build_hooks(
            [h for h in config if h["type"] not in REFUSED], weight="w.pth", evaluate=evaluate, tester=evaluate
        )
        for hook in hooks:
            assert eval(repr(hook), namespace) == hook, repr(hook)
            assert pickle.loads(pickle.dumps(hook)) == hook


@pytest.mark.parametrize("name", ["default_runtime", "panseg", "annealing_detector"])
def test_every_rank_requests_the_same_collective_effects_and_resumes_continue_exactly(name):
    """Simulated on 3 ranks with rank-local losses and metrics computed on rank 0 only (pimm's evaluators), the
    collective effects agree; killed and resumed at saves mid-epoch and at an epoch's end, each rank continues its
    uninterrupted trace."""
    from pimm_fn.testing import assert_collective_agreement, assert_resume_continuity, simulate

    hooks = build_hooks([h for h in CONFIGS[name] if h["type"] not in REFUSED], evaluate=evaluate, tester=evaluate)
    metrics = lambda step, rank: {"mIoU": step / 10, "val/particle/ins_det_f1": 1 / step} if rank == 0 else None
    local = lambda step, rank: {"loss": float(rank + step)}
    schedule = dict(world_size=3, iters_per_epoch=6, max_epochs=2, metrics=metrics, local=local)
    assert_collective_agreement(simulate(hooks, **schedule))
    assert_resume_continuity(hooks, resume_at=[4, 6], **schedule)
