"""A genuine checkpoint, altered one thing at a time, never runs code and never loads half-way.

Each example republishes a genuine checkpoint with pimm_fn's own writer
(``_crafted``) with one mutation: a trainer or per-rank field of another type
(or gone), the sharded flag set, a DCP entry swapped for a pickled object
whose unpickling creates a marker file, or a field of the ``COMPLETE``
marker changed. Resuming it into a plain model (``pf.loop(resume=...)``),
reading it through compat (``load_pimm_weights``) and the CLI
(``verify``, ``inspect``) either gives what the genuine checkpoint gives, or
a ``CheckpointError`` / ``ResumeError`` (the CLI: an exit code); the marker
never appears. pimm's own layout is read the same way, each of its DCP entries
swapped in turn. Failures shrink towards the first field and the simplest value.
The DDP and FSDP2 variants run in one 2-rank launch (``test_mutated_checkpoints_ranks``).
"""

import contextlib
import io
import json
import pathlib
import sys

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.checkpoint.formats import dcp_reading as safe_reading
from pimm_fn.cli import main as cli

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "compat"))
import _tiny_workload as tw  # noqa: E402
from _crafted import Payload, parts, republish  # noqa: E402

REFUSED = (pf.CheckpointError, pf.ResumeError)
OTHERS = (None, 0, 3, 2.5, "x", True, [], [1, 2], {"a": 1})  # values of each plain type a packed field can hold


@attrs.frozen
class Mutation:
    """One change to a genuine checkpoint: ``where`` is trainer, local, entry, marker or claim (sharded, with
    pickled shards); ``value`` ``...`` removes the field."""

    where: str
    key: str | tuple  # a tuple: a path into the marker's JSON
    value: object = None

    def apply(self, genuine: pathlib.Path, model_dir: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
        if self.where == "entry":
            return republish(genuine, model_dir, entries={self.key: Payload(marker)})
        if self.where == "claim":  # the crafted exploit: 'sharded', and each model shard a pickled object
            shards = {f"sharded/model/{name}": Payload(marker) for name in parts(genuine)[2]}
            claim = {"sharded": True, "optimizer": {"state": {}, "param_groups": None}}
            return republish(genuine, model_dir, trainer=claim, entries=shards)
        if self.where == "marker":
            path = republish(genuine, model_dir)
            fields = json.loads((path / "COMPLETE").read_text())
            _set(fields, list(self.key) if isinstance(self.key, tuple) else [self.key], self.value)
            (path / "COMPLETE").write_text(json.dumps(fields))
            return path
        trainer, local, weights, info = parts(genuine)
        part = {"trainer": trainer, "local": local}[self.where]
        _set(part, [self.key], self.value)
        from pimm_fn.checkpoint import save_checkpoint

        return save_checkpoint(model_dir, step=info.step, weights=dict(weights), trainer=trainer, local=local).path


def _set(tree: dict, path: list, value) -> None:
    for part in path[:-1]:
        tree = tree[part]
    if value is ...:
        tree.pop(path[-1], None)
    else:
        tree[path[-1]] = value


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A finished one-epoch run's last checkpoint, and what resuming it for a second epoch gives."""
    root = tmp_path_factory.mktemp("genuine")
    tw.build(root / "run", max_epochs=1)[1]()
    path = root / "run" / "model" / "last"
    return (path, *_resumed(path, root / "reference"))


def _resumed(path, save_dir):
    """Resume ``path`` into a plain model (``pf.loop(resume=path)``), train its second epoch: weights and state.

    The weights after 5 more Adam steps with StepLR, dropout and shuffling depend on every part resumed.
    """
    model, run = tw.build(save_dir, resume=str(path), max_epochs=2)
    run()
    return tw.weights(model), (run.state.progress, run.state.best, run.state.metrics)


def _retyped(genuine) -> st.SearchStrategy:
    """A value of another type than ``genuine`` (``True`` counts as another type than ``1``), or ``...``: removed."""
    return st.sampled_from([v for v in OTHERS if type(v) is not type(genuine)] + [...])


def _field(where: str, part: dict) -> st.SearchStrategy:
    return st.sampled_from(sorted(part)).flatmap(
        lambda key: st.builds(Mutation, st.just(where), st.just(key), _retyped(part[key]))
    )


def mutations(path: pathlib.Path) -> st.SearchStrategy:
    """Every kind of mutation of the checkpoint at ``path``, its fields read from it: each field retyped or removed,
    the sharded and layout flags set to any value, each DCP entry pickled, each marker field retyped or removed."""
    trainer, local, _, _ = parts(path)
    entries = sorted(safe_reading.metadata(path).state_dict_metadata)
    marker = json.loads((path / "COMPLETE").read_text())
    files = {("files", name, "size"): record["size"] for name, record in marker["files"].items()}
    return st.one_of(
        _field("trainer", trainer),
        st.builds(Mutation, st.just("trainer"), st.sampled_from(["sharded", "layout"]), st.sampled_from(OTHERS)),
        _field("local", local),
        st.builds(Mutation, st.just("entry"), st.sampled_from(entries)),
        _field("marker", marker),
        st.just(Mutation("claim", "sharded/model")),
        st.sampled_from(sorted(files, key=str)).flatmap(
            lambda key: st.builds(Mutation, st.just("marker"), st.just(key), _retyped(files[key]))
        ),
    )


def _outcome(action):
    """``("ok", result)`` or ``("refused", error)``; anything else raised fails the test."""
    try:
        return "ok", action()
    except REFUSED as exc:
        return "refused", exc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_checkpoint_loads_identically_or_is_refused_and_never_runs_code(genuine, tmp_path_factory, data):
    """Resume (plain model), compat's weight reading and the CLI: the genuine result or CheckpointError/ResumeError
    (the CLI: an exit code, no traceback); the payload's marker file never appears."""
    path, reference_weights, reference_state = genuine
    mutation = data.draw(mutations(path), label="mutation")
    root = tmp_path_factory.mktemp("mutated")
    marker = root / "payload-ran"
    crafted = mutation.apply(path, root / "crafted" / "model", marker)

    status, result = _outcome(lambda: _resumed(crafted, root / "resumed"))
    if status == "ok":
        weights, state = result
        assert tw.same_weights(weights, reference_weights), f"{mutation} resumed other weights"
        assert state == reference_state, f"{mutation} resumed another state"

    from pimm_fn.compat.warm_start import load_pimm_weights

    status, read = _outcome(lambda: load_pimm_weights(crafted))
    if status == "ok":
        assert tw.same_weights(read, parts(path)[2])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli(["verify", str(crafted)]) in (0, 1)
        assert cli(["inspect", str(crafted)]) in (0, 1)
    assert not marker.exists(), f"{mutation} ran the payload"


def test_a_checkpoint_without_scheduler_state_is_not_resumed_into_a_scheduler_in_silence(genuine, tmp_path):
    """A checkpoint whose trainer part holds no scheduler state (its classes record one) resumed into a run with a
    StepLR is refused, never resumed with its schedule silently restarted."""
    path, reference_weights, _ = genuine
    crafted = Mutation("trainer", "scheduler", None).apply(path, tmp_path / "crafted" / "model", tmp_path / "ran")
    status, result = _outcome(lambda: _resumed(crafted, tmp_path / "resumed"))
    assert status == "refused" or tw.same_weights(result[0], reference_weights)


# -- pimm's split layout, read by compat ----------------------------------------------------------------
def _pimm_payload() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return {
        "model": {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}},
        "optimizer": {
            "state_dict": {
                "state": {"weight": {"step": torch.tensor(1.0)}},
                "param_groups": [{"lr": 0.1, "params": ["weight"]}],
            }
        },
        "trainer": {"epoch": 2, "iter_in_epoch": 0, "global_step": 10, "samples_seen": 40, "best": None},
        "dataloader": {"state": b"\x80\x04K\x01."},
    }


def _leaves(tree, prefix=()):
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from _leaves(v, (*prefix, k))
    else:
        yield prefix


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_pimms_layout_with_any_entry_pickled_is_refused_unrun(tmp_path_factory, data):
    """pimm's split checkpoint with one DCP entry (a plain value or a tensor) swapped for a pickled object: compat's
    reader raises CheckpointError naming it and never unpickles it; unaltered, it reads back as written."""
    from _pimm_layouts import write_split
    from pimm_fn.compat.reading import read_pimm_checkpoint

    payload = _pimm_payload()
    leaves = [p for p in _leaves({k: v for k, v in payload.items() if k != "model"})]
    leaf = data.draw(st.sampled_from(leaves), label="entry")
    root = tmp_path_factory.mktemp("pimm")
    marker = root / "payload-ran"
    write_split(root / "genuine", payload)
    read = read_pimm_checkpoint(root / "genuine" / "last")
    assert read.payload["trainer"] == payload["trainer"] and read.payload["dataloader"] == payload["dataloader"]
    _set(payload, list(leaf), Payload(marker))
    write_split(root / "crafted", payload)
    with pytest.raises(pf.CheckpointError, match="pickled"):
        read_pimm_checkpoint(root / "crafted" / "last")
    assert not marker.exists()
