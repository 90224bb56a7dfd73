"""Retention policies as values (keep_last, keep_every, keep_best, any_of) and their application after each save."""

import json
import math
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.checkpoint import latest_checkpoint, save_checkpoint, write_best
from pimm_fn.checkpoint import publish as _publish
from pimm_fn.checkpoint.formats import standard as _standard
from pimm_fn.core.retention import Snapshot, any_of, decide, keep_best, keep_every, keep_last, recordable, resolve

SNAPS = (
    Snapshot(10, {"acc": 0.7, "loss": 0.3}),
    Snapshot(20, {"acc": 0.5}),
    Snapshot(30, {"acc": 0.7, "loss": 0.1}),
    Snapshot(40),
)


def test_each_policy_keeps_what_its_name_says():
    """keep_last keeps the newest n, keep_every the multiples of k, keep_best the k best (ties: the older)."""
    assert keep_last(2)(SNAPS) == {30, 40} and keep_last(0)(SNAPS) == set()
    assert keep_every(20)(SNAPS) == {20, 40}
    assert keep_best(1, "acc")(SNAPS) == {10}  # 10 and 30 tie: the first to reach the value is the best
    assert keep_best(2, "acc", mode="min")(SNAPS) == {20, 10}
    assert keep_best(5, "loss", mode="min")(SNAPS) == {30, 10}  # snapshots without the metric are never among the best


def test_any_of_is_the_union_and_composes_flat():
    """any_of keeps what any policy keeps; `a | b` and nested any_of give the same value."""
    policy = keep_last(1) | keep_best(1, "loss", mode="min") | keep_every(20)
    assert policy == any_of(keep_last(1), any_of(keep_best(1, "loss", mode="min"), keep_every(20)))
    assert policy(SNAPS) == {40, 30, 20}
    assert [s.step for s in decide(policy, SNAPS).remove] == [10]


@pytest.mark.parametrize(
    "policy",
    [
        keep_last(3),
        keep_every(5),
        keep_best(2, "mIoU"),
        keep_best(1, "loss", mode="min"),
        keep_last(1) | keep_best(1, "val/acc"),
    ],
)
def test_policies_are_values_whose_repr_reads_back(policy):
    """A policy compares, hashes and pickles by value, and its repr is the factory call that made it."""
    names = {"keep_last": keep_last, "keep_every": keep_every, "keep_best": keep_best, "any_of": any_of}
    assert eval(repr(policy), names) == policy == pickle.loads(pickle.dumps(policy))
    assert hash(pickle.loads(pickle.dumps(policy))) == hash(policy)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: keep_last(-1), ValueError, "keep_last: 'n' must be an int >= 0 (got -1)"),
        (lambda: keep_every(0), ValueError, "keep_every: 'k' must be an int >= 1 (got 0)"),
        (lambda: keep_best(1, "acc", mode="MAX"), ValueError, "keep_best: 'mode' must be one of"),
        (lambda: keep_best(1, ""), TypeError, "keep_best: 'metric' must be a non-empty str"),
        (lambda: any_of(), ValueError, "any_of: give at least one policy"),
        (
            lambda: resolve(3, None, caller="loop"),
            TypeError,
            "loop: 'keep' must be None or callable (got 3); pass a retention",
        ),
        (
            lambda: resolve(keep_last(1), 2, caller="loop"),
            ValueError,
            "loop: give 'keep' or 'keep_snapshots', not both",
        ),
        (lambda: decide(keep_last(1), [Snapshot(1), Snapshot(1)]), ValueError, "distinct steps"),
        (lambda: decide(lambda snaps: 3, [Snapshot(1)]), TypeError, "must return the steps to keep"),
    ],
)
def test_bad_policies_fail_at_construction_naming_the_argument(make, error, message):
    """A malformed policy or a contradictory keep/keep_snapshots fails at once, saying what is wrong."""
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_keep_snapshots_is_keep_last_and_only_finite_metrics_are_recorded():
    """keep_snapshots=n resolves to keep_last(n); NaN, inf and bools never become a snapshot's metric."""
    assert resolve(None, 2, caller="loop") == keep_last(2) and resolve(None, None, caller="loop") is None
    assert recordable({"a": 1, "b": math.nan, "c": -math.inf, "d": True, "e": 0.5}) == {"a": 1.0, "e": 0.5}


metric = st.one_of(st.none(), st.floats(-10, 10), st.just(math.nan))
policies = st.deferred(
    lambda: st.one_of(
        st.builds(keep_last, st.integers(0, 4)),
        st.builds(keep_every, st.integers(1, 5)),
        st.builds(keep_best, st.integers(1, 3), st.just("m"), mode=st.sampled_from(["max", "min"])),
        st.lists(policies, min_size=1, max_size=3).map(lambda ps: any_of(*ps)),
    )
)


def _snapshots(values):
    return [Snapshot(step, {} if v is None else {"m": v}) for step, v in values.items()]


def _best_step(snaps, mode):
    rated = [s for s in snaps if "m" in s.metrics]
    sign = -1 if mode == "max" else 1
    return min(rated, key=lambda s: (sign * s.metrics["m"], s.step)).step if rated else None


@given(
    policy=policies,
    values=st.dictionaries(st.integers(0, 60), metric, max_size=12),
    protect=st.sets(st.integers(0, 60), max_size=2),
)
def test_decide_partitions_keeps_protected_and_the_best(policy, values, protect):
    """decide splits the snapshots into keep/remove, keeps every protected step, and keep_best's winner."""
    snaps = _snapshots(values)
    decision = decide(policy, snaps, protect=protect)
    kept, removed = {s.step for s in decision.keep}, {s.step for s in decision.remove}
    assert kept | removed == set(values) and not kept & removed
    assert protect & set(values) <= kept
    assert decision == decide(policy, list(reversed(snaps)), protect=protect)  # order-free, deterministic
    for inner in getattr(policy, "policies", (policy,)):
        assert inner(snaps) <= kept
        if repr(inner).startswith("keep_best") and _best_step(snaps, inner.mode) is not None:
            assert _best_step(snaps, inner.mode) in kept


# -- applied to real checkpoints ------------------------------------------------------------------
def _disk(model_dir):
    """The complete snapshots on disk: step -> the metric their marker recorded (None when absent)."""
    found = {}
    for entry in model_dir.glob("iter_*"):
        if entry.is_dir() and (entry / "COMPLETE").is_file():
            found[int(entry.name[5:])] = json.loads((entry / "COMPLETE").read_text()).get("metrics", {}).get("m")
        elif entry.is_file():
            found[int(entry.name[5:-4])] = (
                torch.load(entry, weights_only=True, mmap=True)["marker"].get("metrics", {}).get("m")
            )
    return found


def _interrupted_save(model_dir, step):
    """A real save stopped before its marker: the trainer part written by DCP into a staging dir, never published."""
    staging = _publish.fresh_staging(model_dir, step)
    _standard.write_state(staging, _standard.packed_state({"step": step}, {}))


operations = st.lists(
    st.tuples(
        st.sampled_from(["save", "save", "save", "interrupted", "unmarked"]),
        st.one_of(st.floats(0, 1), st.just(math.nan)),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=15, deadline=None)
@given(
    policy=policies, ops=operations, fmt=st.sampled_from(["standard", "legacy"]), mode=st.sampled_from(["max", "min"])
)
def test_retention_never_removes_the_newest_or_the_best_under_crashes(tmp_path_factory, policy, ops, fmt, mode):
    """After any sequence of saves, interrupted saves and damaged snapshots, the newest complete checkpoint is the
    last save, model_best holds the best, keep_best's winner survives, and the snapshots kept are what decide says."""
    model_dir = tmp_path_factory.mktemp("run")
    policy = policy | keep_best(1, "m", mode=mode)
    expected, best, damaged = {}, None, set()
    for step, (op, value) in enumerate(ops, start=1):
        if op == "interrupted":
            _interrupted_save(model_dir, step)
            continue
        metrics = {} if math.isnan(value) else {"m": value}
        save_checkpoint(
            model_dir,
            step=step,
            weights={"w": torch.full((1,), float(step))},
            trainer={},
            local={},
            format=fmt,
            snapshot=True,
            keep=policy,
            metrics=metrics,
        )
        if metrics and (best is None or (value > best[0] if mode == "max" else value < best[0])):
            best = (value, step)
            write_best(model_dir, {"w": torch.full((1,), float(step))}, metric="m", value=value, step=step)
        expected[step] = metrics.get("m")
        kept = decide(policy, [Snapshot(s, {} if v is None else {"m": v}) for s, v in expected.items()])
        expected = {s.step: expected[s.step] for s in kept.keep}
        if op == "unmarked" and fmt == "standard" and step in expected:  # damage after publishing: the marker lost
            (model_dir / f"iter_{step}" / "COMPLETE").unlink()
            damaged.add(step)
            del expected[step]
        assert latest_checkpoint(model_dir).step == step
        assert _disk(model_dir) == expected
        assert all((model_dir / f"iter_{s}").is_dir() for s in damaged)  # never complete, never deleted
    if best is not None:
        assert json.loads((model_dir / "model_best.json").read_text())["step"] == best[1]
        saved_best = [s for s, v in _disk(model_dir).items() if v == best[0]]
        assert best[1] in saved_best or best[1] in damaged


def test_a_snapshot_newer_than_the_save_is_kept_as_the_newest_checkpoint(tmp_path):
    """After a resume from an older step, the newest complete checkpoint (a later snapshot) survives keep_last(0)."""
    for step in (10, 20):
        save_checkpoint(tmp_path, step=step, weights={"w": torch.zeros(1)}, trainer={}, local={}, snapshot=True)
    save_checkpoint(
        tmp_path, step=12, weights={"w": torch.zeros(1)}, trainer={}, local={}, snapshot=True, keep=keep_last(0)
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_20", "last"]
    assert latest_checkpoint(tmp_path).path.name == "iter_20"


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


def test_loop_keep_applies_the_policy_and_keeps_each_metrics_best_file(tmp_path):
    """Saving(keep=...) keeps the newest snapshot and the best by a metric, also for background saves (the
    synchronous path is exercised by the CLI tests' run); every model_best_<metric> file stays."""
    scores = iter([0.2, 0.9, 0.1, 0.3, 0.4, 0.5])

    def val(model):
        return {"acc": next(scores), "loss": 1.0}

    torch.manual_seed(0)
    model = _Net()
    hooks = [
        pf.evaluate_every(2, val),
        pf.best_on("acc"),
        pf.best_on("loss", mode="min"),
        pf.save_every(2, snapshots=True, async_save=True),
    ]
    with pytest.raises(TypeError, match=r"no longer takes keep_snapshots=: pass saving=pimm_fn\.Saving\(keep="):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            [torch.ones(1, 2)] * 4,
            hooks=hooks,
            max_epochs=1,
            save_dir=tmp_path,
            saving=pf.Saving(keep=keep_last(1)),
            keep_snapshots=1,
        )
    pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(1, 2)] * 4,
        hooks=hooks,
        max_epochs=3,
        save_dir=tmp_path,
        saving=pf.Saving(keep=keep_last(1) | keep_best(1, "acc")),
        watching=pf.Watching(console=False),
    )()
    model_dir = tmp_path / "model"
    names = sorted(p.name for p in model_dir.iterdir())
    assert names == [
        "iter_12",
        "iter_4",
        "last",
        "model_best_acc.json",
        "model_best_acc.pth",
        "model_best_loss.json",
        "model_best_loss.pth",
    ]
    assert json.loads((model_dir / "iter_4" / "COMPLETE").read_text())["metrics"] == {"acc": 0.9, "loss": 1.0}
