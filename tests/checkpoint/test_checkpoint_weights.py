"""Best weights, warm-start key remapping and loading weights from any file."""

import json

import pytest
import torch

from pimm_fn.checkpoint import WeightsReport, load_weights_file, remap_state_dict, save_checkpoint, write_best


def test_write_best_writes_weights_and_metadata_atomically(tmp_path, same):
    """model_best.pth holds the state_dict, model_best.json the metric; no temp files remain."""
    sd = {"w": torch.arange(3.0)}
    path = write_best(tmp_path, sd, metric="mIoU", value=0.5, step=10)
    write_best(tmp_path, {"w": torch.ones(3)}, metric="mIoU", value=0.75, step=20)
    assert path == tmp_path / "model_best.pth"
    same(torch.load(path, weights_only=True), {"w": torch.ones(3)})
    assert json.loads((tmp_path / "model_best.json").read_text()) == {"metric": "mIoU", "value": 0.75, "step": 20}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_best.json", "model_best.pth"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"value": float("nan")}, "'value' must be a finite number"),
        ({"metric": ""}, "'metric' must be a non-empty str"),
        ({"step": -1}, "'step' must be an int >= 0"),
    ],
)
def test_write_best_rejects_bad_values(tmp_path, kwargs, match):
    """NaN values, empty metric names and negative steps are refused before writing."""
    with pytest.raises(ValueError, match=match):
        write_best(tmp_path, {}, **{"metric": "acc", "value": 1.0, "step": 1, **kwargs})
    assert list(tmp_path.iterdir()) == []


def test_remap_longest_rule_wins():
    """Of two matching prefixes the longer one applies."""
    sd, _ = remap_state_dict(
        {"backbone.stem.w": 1, "backbone.x": 2}, {"backbone.": "enc.", "backbone.stem.": "stem."}, ["stem.w", "enc.x"]
    )
    assert sd == {"stem.w": 1, "enc.x": 2}


@pytest.mark.parametrize(
    "source_prefix, target_prefix", [("module.", ""), ("", "module."), ("module.", "module."), ("", "")]
)
def test_remap_adapts_module_prefix_to_target(source_prefix, target_prefix):
    """DDP's 'module.' prefix is stripped or added to match the target; rules work either way."""
    state = {source_prefix + "a.w": 1, source_prefix + "b": 2}
    target = [target_prefix + "c.w", target_prefix + "b"]
    for rule in ({"a.": "c."}, {"module.a.": "module.c."}):
        sd, report = remap_state_dict(state, rule, target)
        assert sorted(sd) == sorted(target) and report.complete


def test_remap_unmatched_rule_raises_naming_it():
    """A rule that matches no key is an error naming the rule."""
    with pytest.raises(ValueError, match=r"\['decoder\.'\] matched no key"):
        remap_state_dict({"a": 1}, {"a": "b", "decoder.": "head."}, ["b"])


@pytest.mark.parametrize("bad", [["a", "b"], "a->b", 3])
def test_remap_requires_a_dict(bad):
    """A non-dict replacements argument is a TypeError that says what came."""
    with pytest.raises(TypeError, match=f"must be a dict .*got {type(bad).__name__}"):
        remap_state_dict({"a": 1}, bad, ["a"])


def test_remap_report_counts_and_summary():
    """The report lists loaded, missing and unexpected keys with counts."""
    _, report = remap_state_dict({"a": 1, "x": 2}, None, ["a", "b", "c"])
    assert report == WeightsReport(loaded=("a",), missing=("b", "c"), unexpected=("x",))
    assert (report.num_loaded, report.num_missing, report.num_unexpected) == (1, 2, 1)
    assert report.summary() == "loaded 1/3 target keys; 2 missing: b, c; 1 unexpected: x"


def test_remap_collision_raises():
    """Two source keys mapping to one name is an error, not a silent overwrite."""
    with pytest.raises(ValueError, match="both map to 'b.w'"):
        remap_state_dict({"a.w": 1, "b.w": 2}, {"a.": "b."}, ["b.w"])


def test_load_weights_file_accepts_every_supported_source(tmp_path, same):
    """Plain state_dicts, {'state_dict'}/{'model'} wrappers, both checkpoint formats and model dirs load."""
    sd = {"w": torch.randn(3), "b": torch.zeros(1, dtype=torch.int64)}
    torch.save(sd, tmp_path / "plain.pth")
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "pimm.pth")
    torch.save({"model": sd}, tmp_path / "other.pth")
    save_checkpoint(tmp_path / "std", step=1, weights=sd, trainer={}, local={})
    save_checkpoint(tmp_path / "leg", step=1, weights=sd, trainer={}, local={}, format="legacy")
    for source in ("plain.pth", "pimm.pth", "other.pth", "std/last", "std", "leg/last.pth", "leg"):
        same(load_weights_file(tmp_path / source), sd)


def test_load_weights_file_errors(tmp_path):
    """Missing files, arbitrary pickles and dicts without weights are refused with the path named."""
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_weights_file(tmp_path / "nope.pth")
    torch.save({"opt": {"lr": 1}}, tmp_path / "nostate.pth")
    with pytest.raises(ValueError, match="holds no state_dict"):
        load_weights_file(tmp_path / "nostate.pth")
    torch.save({"obj": WeightsReport((), (), ())}, tmp_path / "code.pth")
    with pytest.raises(ValueError, match="weights_only"):
        load_weights_file(tmp_path / "code.pth")
