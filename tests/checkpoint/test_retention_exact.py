"""Retention keeps exactly what its policy says after every save, also while there are fewer snapshots than its n.

The expected set comes from an independent model of each policy (written
from its definition, never calling the policy objects), applied after each
save to what the previous save kept plus the new snapshot, and compared with
the set on disk after every save, not only at the end.
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.checkpoint import CheckpointError, DiskFullError, latest_checkpoint, save_checkpoint, save_checkpoint_async
from pimm_fn.core.retention import Snapshot, any_of, keep_best, keep_every, keep_last

from _disk_faults import full_disk


# -- an independent model of the policies: (kind, args) specs -------------------------------------
def _model(spec, snaps: dict) -> set:
    """The steps ``spec`` keeps of ``snaps`` ({step: metric value or None}), from each policy's definition."""
    kind = spec[0]
    if kind == "last":  # kept: fewer than n snapshots are newer
        return {s for s in snaps if sum(t > s for t in snaps) < spec[1]}
    if kind == "every":
        return {s for s in snaps if s % spec[1] == 0}
    if kind == "best":  # kept: fewer than k rated snapshots are better (a tie goes to the older one)
        k, mode = spec[1], spec[2]
        rated = {s: v for s, v in snaps.items() if v is not None}
        better = (lambda a, b: a > b) if mode == "max" else (lambda a, b: a < b)
        return {s for s, v in rated.items() if sum(better(w, v) or (w == v and t < s) for t, w in rated.items()) < k}
    return set().union(*(_model(inner, snaps) for inner in spec[1]))


def _policy(spec):
    kind = spec[0]
    if kind == "last":
        return keep_last(spec[1])
    if kind == "every":
        return keep_every(spec[1])
    if kind == "best":
        return keep_best(spec[1], "m", mode=spec[2])
    return any_of(*map(_policy, spec[1]))


leaf_specs = st.one_of(
    st.tuples(st.just("last"), st.integers(0, 8)),  # n up to 8 over at most 7 saves: mostly more than there are
    st.tuples(st.just("every"), st.integers(1, 4)),
    st.tuples(st.just("best"), st.integers(1, 8), st.sampled_from(["max", "min"])),
)
specs = st.one_of(leaf_specs, st.tuples(st.just("any"), st.lists(leaf_specs, min_size=1, max_size=3)))


def _on_disk(model_dir) -> set:
    """The steps of the snapshots on disk, either format."""
    return {int(p.name[5:].removesuffix(".pth")) for p in model_dir.glob("iter_*")}


def _save(model_dir, step, **kw):
    return save_checkpoint(
        model_dir, step=step, weights={"w": torch.full((1,), float(step))}, trainer={}, local={}, snapshot=True, **kw
    )


# -- the bug of the first release: fewer snapshots than n -----------------------------------------
def test_keep_last_with_fewer_snapshots_than_n_keeps_them_all():
    """keep_last(n) over fewer than n snapshots keeps every one (the first release kept only the newest few)."""
    snaps = [Snapshot(s) for s in (10, 20)]
    assert keep_last(3)(snaps) == {10, 20}
    assert keep_last(5)([Snapshot(s) for s in (1, 2, 3)]) == {1, 2, 3}
    assert keep_last(2)(snaps) == {10, 20} and keep_last(1)(snaps) == {20} and keep_last(0)(snaps) == set()


@pytest.mark.parametrize("fmt", ["standard", "legacy"])
@pytest.mark.parametrize("n", [3, 5])
def test_keep_snapshots_holds_min_of_saves_and_n_after_every_save(tmp_path, fmt, n):
    """keep_snapshots=n over 6 saves: after save i the i newest snapshots up to n are on disk, never fewer."""
    for step in range(1, 7):
        _save(tmp_path, step, format=fmt, keep_snapshots=n)
        assert _on_disk(tmp_path) == set(range(max(1, step - n + 1), step + 1)), f"after save {step}"


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


def test_loop_keep_snapshots_3_keeps_three_after_every_save(tmp_path):
    """Saving(keep=keep_last(3)) with a snapshot every step: after each step the newest min(step, 3) snapshots exist."""
    torch.manual_seed(0)
    model = _Net()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(1, 2)] * 6,
        hooks=[pf.save_every(1, snapshots=True)],
        max_epochs=1,
        save_dir=tmp_path,
        saving=pf.Saving(keep=pf.keep_last(3)),
        watching=pf.Watching(console=False, progress=False),
    )
    for step in range(1, 7):
        run.step()
        assert _on_disk(tmp_path / "model") == set(range(max(1, step - 2), step + 1)), f"after step {step}"


def test_background_saves_keep_last_n_with_fewer_snapshots(tmp_path):
    """A background save applies retention as the synchronous one: keep_last(4) over 3 saves keeps all three."""
    for step in (1, 2, 3):
        save_checkpoint_async(
            tmp_path, step=step, weights={"w": torch.zeros(1)}, trainer={}, local={}, snapshot=True, keep=keep_last(4)
        ).wait()
        assert _on_disk(tmp_path) == set(range(1, step + 1))


# -- the property: after every save, disk == the model ---------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    spec=specs,
    values=st.lists(st.one_of(st.none(), st.sampled_from([0.1, 0.5, 0.9]), st.floats(0, 1)), min_size=1, max_size=7),
    fmt=st.sampled_from(["standard", "legacy"]),
)
def test_disk_matches_an_independent_model_after_every_save(tmp_path_factory, spec, values, fmt):
    """For any policy and run (often fewer snapshots than a policy's n), the snapshots on disk after each save are
    exactly the model's: what it keeps of the previous survivors plus the new snapshot."""
    model_dir = tmp_path_factory.mktemp("run")
    policy, kept = _policy(spec), {}
    for step, value in enumerate(values, start=1):
        _save(model_dir, step, format=fmt, keep=policy, metrics={} if value is None else {"m": value})
        kept[step] = value
        kept = {s: kept[s] for s in _model(spec, kept)}
        assert _on_disk(model_dir) == set(kept), f"{spec} after save {step} ({values[:step]})"
        assert latest_checkpoint(model_dir).step == step


def test_the_model_agrees_with_policies_on_fewer_snapshots_than_n():
    """The model itself is checked on the case it exists for (so the property cannot pass by a shared mistake)."""
    snaps = {1: None, 2: 0.5}
    assert _model(("last", 5), snaps) == {1, 2} == keep_last(5)([Snapshot(1), Snapshot(2, {"m": 0.5})])
    assert _model(("best", 3, "max"), snaps) == {2}


# -- what retention never deletes -------------------------------------------------------------------
def _garble_marker(path):
    (path / "COMPLETE").write_text("{not json")


def _resize_a_file(path):
    with open(path / "model.pth", "ab") as f:
        f.write(b"\0" * 7)


def _escape_marker(path):
    """The marker lists a file outside the snapshot, with that file's right size."""
    marker = json.loads((path / "COMPLETE").read_text())
    outside = path.parent / "iter_2" / "model.pth"
    marker["files"]["../iter_2/model.pth"] = {"size": outside.stat().st_size}
    (path / "COMPLETE").write_text(json.dumps(marker))


@pytest.mark.parametrize("spoil", [_garble_marker, _resize_a_file, _escape_marker])
def test_retention_never_deletes_a_snapshot_it_cannot_read(tmp_path, spoil):
    """A snapshot whose marker does not parse, whose file changed size, or whose marker names a file outside it
    is no complete snapshot: keep_last(0) leaves it on disk, bytes untouched, and deletes the readable ones."""
    for step in (1, 2):
        _save(tmp_path, step)
    spoil(tmp_path / "iter_1")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "iter_1").rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError):
        pf.checkpoint.validate(tmp_path / "iter_1")
    _save(tmp_path, 3, keep=keep_last(0))
    assert _on_disk(tmp_path) == {1}
    assert {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "iter_1").rglob("*") if p.is_file()} == before


def test_retention_never_deletes_an_unreadable_legacy_snapshot(tmp_path):
    """A legacy iter_<step>.pth that does not load is left alone by keep_last(0)."""
    for step in (1, 2):
        _save(tmp_path, step, format="legacy")
    (tmp_path / "iter_1.pth").write_bytes(b"not a torch file")
    _save(tmp_path, 3, format="legacy", keep=keep_last(0))
    assert _on_disk(tmp_path) == {1}


@pytest.mark.parametrize("fmt, site", [("standard", "COMPLETE"), ("standard", "model.pth"), ("legacy", "last.pth")])
def test_retention_deletes_nothing_when_the_new_checkpoint_is_not_published(tmp_path, fmt, site):
    """A save that fails before its publish (the disk full at its marker, weights or file) runs no retention:
    every snapshot stays and the previous checkpoint stays the latest."""
    for step in (1, 2, 3):
        _save(tmp_path, step, format=fmt)
    with full_disk(tmp_path, site) as hits, pytest.raises(DiskFullError):
        _save(tmp_path, 4, format=fmt, keep=keep_last(0))
    assert hits, "the fault was not injected"
    assert _on_disk(tmp_path) == {1, 2, 3}
    assert latest_checkpoint(tmp_path).step == 3
