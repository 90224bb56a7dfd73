"""pimm's CheckpointSaver, CheckpointSaverIteration and CheckpointLoader: their save steps, deferrals,
snapshots, final save, best-model writes and log lines, planned against PIMM.md 2.2."""

import pickle

import pytest

import pimm_fn as pf
from pimm_fn.compat import PIMM_BEST, PimmSaveState, build_hooks, checkpoint_loader, checkpoint_saver
from pimm_fn.compat.effects import LoadPimmWeights
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Log, SaveCheckpoint, WriteBest
from pimm_fn.core.state import Progress, State


def _saves(hooks, **schedule):
    """``(step, event, snapshot, deferred, final)`` of each planned save."""
    return [
        (e.step, type(e.event).__name__, e.effect.snapshot, e.effect.deferred, e.effect.final)
        for e in pf.plan(hooks, **schedule)
        if isinstance(e.effect, SaveCheckpoint)
    ]


S, E, T = "AfterStep", "AfterEpoch", "AfterTrain"

SAVER_CASES = [
    # CheckpointSaver(save_freq=4), 10 steps an epoch, 3 epochs: every 4 steps with a snapshot, the step-20 save
    # deferred to its epoch's end, and the final save at 30 (not a multiple of 4: no snapshot).
    (
        dict(type="CheckpointSaver", save_freq=4),
        10,
        3,
        [
            (4, S, True, False, False),
            (8, S, True, False, False),
            (12, S, True, False, False),
            (16, S, True, False, False),
            (20, E, True, True, False),
            (24, S, True, False, False),
            (28, S, True, False, False),
            (30, T, False, False, True),
        ],
    ),
    # save_freq=None (pimm's default): the final save only.
    (dict(type="CheckpointSaver", save_freq=None), 10, 3, [(30, T, False, False, True)]),
    # A save on the last step of the run is the deferred one; no second, final save of the same step.
    (
        dict(type="CheckpointSaver", save_freq=5),
        10,
        2,
        [
            (5, S, True, False, False),
            (10, E, True, True, False),
            (15, S, True, False, False),
            (20, E, True, True, False),
        ],
    ),
    # Evaluation steps save too, without snapshots (not multiples of save_freq).
    (
        dict(type="CheckpointSaver", evaluator_every_n_steps=3),
        4,
        2,
        [(3, S, False, False, False), (6, S, False, False, False), (8, T, False, False, True)],
    ),
    (
        dict(type="CheckpointSaver", save_freq=4, evaluator_every_n_steps=6),
        6,
        2,
        [
            (4, S, True, False, False),
            (6, E, False, True, False),
            (8, S, True, False, False),
            (12, E, True, True, False),
        ],
    ),
    # CheckpointSaverIteration: save_freq defaults to None (the final save only); snapshots only when asked.
    (dict(type="CheckpointSaverIteration"), 10, 3, [(30, T, False, False, True)]),
    (
        dict(type="CheckpointSaverIteration", save_freq=4),
        10,
        3,
        [
            (4, S, False, False, False),
            (8, S, False, False, False),
            (12, S, False, False, False),
            (16, S, False, False, False),
            (20, E, False, True, False),
            (24, S, False, False, False),
            (28, S, False, False, False),
            (30, T, False, False, True),
        ],
    ),
    (
        dict(type="CheckpointSaverIteration", save_freq=5, save_iter_checkpoints=True),
        5,
        2,
        [(5, E, True, True, False), (10, E, True, True, False)],
    ),
]


@pytest.mark.parametrize("config, ipe, epochs, expected", SAVER_CASES, ids=lambda c: repr(c)[:60])
def test_savers_save_at_pimms_steps_with_deferral_snapshots_and_one_final_save(config, ipe, epochs, expected):
    """Each saver config plans exactly the saves PIMM.md 2.2 lists, without pimm's duplicate final save."""
    assert _saves(build_hooks([config]), iters_per_epoch=ipe, max_epochs=epochs) == expected


def test_evaluation_steps_do_not_save_when_evaluation_is_off():
    """With pimm's cfg.evaluate=False, evaluator_every_n_steps adds no save."""
    hooks = build_hooks([dict(type="CheckpointSaver", evaluator_every_n_steps=3)], evaluate=False)
    assert _saves(hooks, iters_per_epoch=4, max_epochs=2) == [(8, T, False, False, True)]


@pytest.mark.parametrize("start", [4, 10, 20, 24])
def test_a_resumed_plan_saves_what_the_uninterrupted_run_saves_after_it(start):
    """The cadence reads the global step alone, so a run resumed at any save continues it exactly."""
    hooks = [checkpoint_saver(save_freq=4, evaluator_every_n_steps=6)]
    full = pf.plan(hooks, iters_per_epoch=10, max_epochs=3)
    resumed = pf.plan(hooks, iters_per_epoch=10, max_epochs=3, start_step=start)
    assert [e.effect for e in resumed if isinstance(e.effect, SaveCheckpoint)] == [
        e.effect for e in full if isinstance(e.effect, SaveCheckpoint) and e.step > start
    ]


def test_save_iteration_logs_pimms_lines_and_the_final_save_says_so():
    """'Saving checkpoint at global step N' at each save step (deferred ones too), 'Saving final checkpoint' last."""
    hooks = build_hooks([dict(type="CheckpointSaverIteration", save_freq=3)])
    lines = [
        (e.step, e.effect.values["message"])
        for e in pf.plan(hooks, iters_per_epoch=3, max_epochs=2)
        if isinstance(e.effect, Log)
    ]
    assert lines == [(3, "Saving checkpoint at global step 3"), (6, "Saving checkpoint at global step 6")]
    final = build_hooks([dict(type="CheckpointSaver")])
    assert [
        e.effect.values["message"] for e in pf.plan(final, iters_per_epoch=3, max_epochs=1) if isinstance(e.effect, Log)
    ] == ["Saving final checkpoint"]


def _score(model):
    return {"mIoU": 0.0}


def _best_writes(config_list, metrics, ipe=5, epochs=3, **context):
    hooks = build_hooks(config_list, evaluate=_score, **context)
    trace = pf.plan(hooks, iters_per_epoch=ipe, max_epochs=epochs, metrics=metrics)
    return [(e.step, e.effect.metric, e.effect.value) for e in trace if isinstance(e.effect, WriteBest)], trace


def test_the_saver_tracks_the_current_metric_of_the_evaluator_before_it():
    """build_hooks hands each saver the metric pimm's evaluator publishes (PIMM.md 2.3), with its direction."""
    hooks = build_hooks(
        [
            dict(type="SemSegEvaluator"),
            dict(type="CheckpointSaver"),
            dict(type="InstanceSegmentationEvaluator", select_metric="val_head_loss"),
            dict(type="CheckpointSaverIteration", save_freq=10),
        ],
        evaluate=_score,
    )
    assert (hooks[1].metric, hooks[1].mode) == ("mIoU", "max")
    assert (hooks[3].metric, hooks[3].mode) == ("val/head_loss_total", "min")


def test_best_follows_each_evaluation_strictly_and_never_a_nan():
    """model_best is written when an evaluation improves strictly, with that evaluation's weights, at its step:
    not one epoch late, not only at save steps (pimm's default runtime never writes it)."""
    metrics = {5: {"mIoU": 0.4}, 10: {"mIoU": 0.4}, 15: {"mIoU": float("nan")}}
    writes, trace = _best_writes([dict(type="SemSegEvaluator"), dict(type="CheckpointSaver")], metrics)
    assert writes == [(5, "mIoU", 0.4)]
    messages = [e.effect.values["message"] for e in trace if isinstance(e.effect, Log) and e.effect.kind == "info"]
    assert messages[:3] == [
        "Best validation mIoU updated to: 0.4000",
        "Currently Best mIoU: 0.4000",
        "Currently Best mIoU: 0.4000",
    ]


def test_a_lower_is_better_metric_improves_downwards():
    """InstanceSegmentationEvaluator(select_metric='val_head_loss') publishes a loss: lower values are better."""
    metrics = {5: {"val/head_loss_total": 2.0}, 10: {"val/head_loss_total": 3.0}, 15: {"val/head_loss_total": 1.0}}
    writes, _ = _best_writes(
        [dict(type="InstanceSegmentationEvaluator", select_metric="val_head_loss"), dict(type="CheckpointSaver")],
        metrics,
    )
    assert writes == [(5, "val/head_loss_total", 2.0), (15, "val/head_loss_total", 1.0)]


def test_a_best_value_translated_from_a_pimm_checkpoint_is_the_one_to_beat():
    """pimm's unnamed best_metric_value (PIMM_BEST) is compared with the first evaluation after the resume."""
    saver = checkpoint_saver(metric="mIoU")
    state = State(Progress(5, 2, global_step=5), best={PIMM_BEST: 0.5}, slots=(PimmSaveState(),))
    state = state.with_slot(PimmSaveState())
    _, worse = saver(state, ev.MetricsPublished({"mIoU": 0.45}, "SemSegEvaluator", 5))
    _, better = saver(state, ev.MetricsPublished({"mIoU": 0.55}, "SemSegEvaluator", 5))
    assert not any(isinstance(e, WriteBest) for e in worse)
    assert WriteBest("mIoU", 0.55, 5) in better


def test_checkpoint_loader_warm_starts_a_fresh_run_only_and_none_without_a_weight():
    """No weight (pimm's default) is a fresh run: nothing loaded, nothing raised; a resume never warm-starts."""
    assert pf.plan(build_hooks([dict(type="CheckpointLoader")]), iters_per_epoch=2, max_epochs=1) == ()
    hooks = build_hooks([dict(type="CheckpointLoader", keywords="backbone", replacement="encoder")], weight="w.pth")
    assert pf.plan(hooks, iters_per_epoch=2, max_epochs=1)[0].effect == LoadPimmWeights(
        "w.pth", (("backbone", "encoder"),), False
    )
    assert pf.plan(hooks, iters_per_epoch=2, max_epochs=2, start_step=2) == ()


@pytest.mark.parametrize(
    "config, rules",
    [
        (dict(type="CheckpointLoader"), (("", ""),)),
        (dict(type="CheckpointLoader", keywords="module.backbone"), (("module.backbone", "module.backbone"),)),
        (dict(type="CheckpointLoader", replacements={"a": "b", "c": "d"}), (("a", "b"), ("c", "d"))),
        (dict(type="CheckpointLoader", replacements={}), ()),
    ],
)
def test_checkpoint_loader_rules_are_pimms(config, rules):
    """replacement=None keeps keys unchanged; replacements={} is no rule at all (PIMM.md 2.2)."""
    assert build_hooks([config], weight="w.pth")[0].rules == rules


def test_saver_values_repr_compare_and_pickle():
    """The hooks read like their factory calls, compare by value and pickle."""
    hooks = build_hooks(
        [
            dict(type="CheckpointSaver", save_freq=4),
            dict(type="CheckpointSaverIteration", save_freq=10, save_iter_checkpoints=True, backend="dcp"),
        ]
    )
    assert [repr(h) for h in hooks] == [
        "checkpoint_saver(save_freq=4)",
        "checkpoint_saver_iteration(save_freq=10, save_iter_checkpoints=True, backend='dcp')",
    ]
    assert pickle.loads(pickle.dumps(hooks)) == hooks
    loader = checkpoint_loader("w.pth", keywords="backbone", replacement="encoder", strict=True)
    assert repr(loader) == "checkpoint_loader('w.pth', keywords='backbone', replacement='encoder', strict=True)"
