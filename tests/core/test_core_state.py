"""Progress and State: validation, immutability, and the codec round trip."""

import copy
import json
import math
import pickle

import attrs
import pytest

from pimm_fn.core import codec
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.state import Progress, State
from pimm_fn.hooks import BestState, LogState, SaveEveryState


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("iters_per_epoch", 0, "'iters_per_epoch' must be an int >= 1 (got 0)"),
        ("iters_per_epoch", 2.0, "'iters_per_epoch' must be an int >= 1 (got 2.0)"),
        ("max_epochs", -1, "'max_epochs' must be an int >= 0 (got -1)"),
        ("epoch", -2, "'epoch' must be an int >= 0 (got -2)"),
        ("iter_in_epoch", True, "'iter_in_epoch' must be an int >= 0 (got True)"),
        ("global_step", "3", "'global_step' must be an int >= 0 (got '3')"),
        ("samples_seen", None, "'samples_seen' must be an int >= 0 (got None)"),
    ],
)
def test_progress_rejects_bad_field_naming_field_and_value(field, value, expected):
    """A bad Progress field raises ValueError naming the field and the value."""
    kwargs = {"iters_per_epoch": 10, "max_epochs": 3, field: value}
    with pytest.raises(ValueError) as info:
        Progress(**kwargs)
    assert str(info.value) == expected


def test_progress_evolve_revalidates():
    """attrs.evolve re-runs validators, so no update makes an invalid Progress."""
    with pytest.raises(ValueError, match=r"'global_step' must be an int >= 0 \(got -1\)"):
        attrs.evolve(Progress(10, 3), global_step=-1)


def test_progress_max_steps_and_epoch_end():
    """max_steps is iters_per_epoch * max_epochs; at_epoch_end holds only after the epoch's last step."""
    assert Progress(10, 3).max_steps == 30
    assert not Progress(10, 3, iter_in_epoch=9).at_epoch_end
    assert Progress(10, 3, iter_in_epoch=10).at_epoch_end


@pytest.mark.parametrize(
    "kwargs, exc, expected",
    [
        ({"progress": "p"}, TypeError, "'progress' must be a Progress (got 'p')"),
        ({"rank": -1}, ValueError, "'rank' must be an int >= 0 (got -1)"),
        ({"world_size": 0}, ValueError, "'world_size' must be an int >= 1 (got 0)"),
        ({"rank": 2, "world_size": 2}, ValueError, "'rank' must be < world_size=2 (got 2)"),
        ({"slots": [1]}, TypeError, "'slots' must be a tuple (got [1])"),
        ({"position": "AfterLunch"}, ValueError, "'position' must be None or one of"),
    ],
)
def test_state_rejects_bad_field_naming_field_and_value(kwargs, exc, expected):
    """A bad State field raises an error naming the field and the value."""
    kwargs = {"progress": Progress(10, 3), **kwargs}
    with pytest.raises(exc) as info:
        State(**kwargs)
    assert str(info.value).startswith(expected)
    if kwargs.get("position"):
        assert "'AfterLunch'" in str(info.value)


def test_state_converts_mappings_to_frozen_maps():
    """metrics, best and config become FrozenMap values, so a State is a value."""
    s = State(Progress(10, 3), metrics={"a": 1.0}, best={"a": 1.0}, config={"lr": 0.1})
    assert type(s.metrics) is type(s.best) is type(s.config) is FrozenMap
    assert s == State(Progress(10, 3), metrics={"a": 1.0}, best={"a": 1.0}, config={"lr": 0.1})
    assert hash(s) == hash(attrs.evolve(s))


def test_state_finished_and_is_main():
    """finished means position AfterTrain; is_main means rank 0."""
    s = State(Progress(10, 3), rank=1, world_size=2, position="AfterTrain")
    assert s.finished and not s.is_main
    assert not State(Progress(10, 3)).finished and State(Progress(10, 3)).is_main


def test_frozen_map_is_immutable():
    """A FrozenMap refuses item assignment, deletion and attribute changes."""
    m = FrozenMap({"a": 1})
    with pytest.raises(TypeError):
        m["a"] = 2
    with pytest.raises(TypeError):
        del m["a"]
    with pytest.raises(AttributeError, match="immutable"):
        m.x = 1
    with pytest.raises(AttributeError, match="immutable"):
        del m._data
    assert m == {"a": 1}


def test_frozen_map_set_and_merge_return_new_maps():
    """set and merge build new maps and leave the original unchanged."""
    m = FrozenMap({"a": 1})
    assert m.set("b", 2) == {"a": 1, "b": 2}
    assert m.merge({"a": 3, "c": 4}) == {"a": 3, "c": 4}
    assert m.merge({}) is m
    assert m == {"a": 1}


def test_frozen_map_eq_and_hash_by_value():
    """Equal maps (in any insertion order) compare equal and hash equal; they equal plain dicts."""
    a, b = FrozenMap({"x": 1, "y": 2.5}), FrozenMap([("y", 2.5), ("x", 1)])
    assert a == b and hash(a) == hash(b)
    assert a == {"x": 1, "y": 2.5}
    assert a != FrozenMap({"x": 1}) and a != [("x", 1)]
    assert len({a, b}) == 1
    assert repr(a) == "FrozenMap({'x': 1, 'y': 2.5})"


def test_frozen_map_pickles_and_copies_by_value():
    """pickle and deepcopy round trips give an equal, still-frozen map."""
    m = FrozenMap({"a": (1, 2), "b": FrozenMap({"c": 3.0})})
    for back in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert back == m and hash(back) == hash(m) and type(back) is FrozenMap
        with pytest.raises(AttributeError):
            back.y = 1


def _state_with_every_slot():
    return State(
        Progress(10, 3, epoch=1, iter_in_epoch=4, global_step=14, samples_seen=56),
        rank=1,
        world_size=4,
        metrics={"miou": 0.5, "loss": 1.25},
        best={"miou": 0.5},
        config={"lr": 0.1, "name": "exp", "sizes": (1, 2), "tags": ["a"], "nested": {"k": None}},
        slots=(
            SaveEveryState(last_saved=12, deferred=None),
            SaveEveryState(last_saved=10, deferred=20),
            BestState(0.5, 12),
            BestState(),
            LogState(FrozenMap({"loss": 5.5, "aux": 1.0}), 4, FrozenMap({"loss": 4, "aux": 1})),
            None,
            (SaveEveryState(), LogState()),
            {"count": 3, 7: "seven"},
            True,
        ),
        position="AfterStep",
    )


def test_codec_round_trips_state_with_every_builtin_slot():
    """A State holding every built-in slot type decodes to an equal State."""
    s = _state_with_every_slot()
    text = codec.dumps(s)
    json.loads(text)  # plain JSON
    back = codec.loads(text)
    assert back == s
    assert type(back.slots[6]) is tuple and type(back.slots[7]) is dict and type(back.config["tags"]) is list


def test_codec_is_deterministic():
    """dumps of equal states gives the same text."""
    assert codec.dumps(_state_with_every_slot()) == codec.dumps(_state_with_every_slot())


def test_codec_keeps_nan_and_infinities():
    """NaN, inf and -inf survive the round trip and the text is strict JSON."""
    s = State(Progress(2, 1), metrics={"nan": math.nan, "inf": math.inf, "ninf": -math.inf})
    text = codec.dumps(s)
    assert "NaN" not in text and "Infinity" not in text
    back = codec.loads(text)
    assert math.isnan(back.metrics["nan"])
    assert back.metrics["inf"] == math.inf and back.metrics["ninf"] == -math.inf


def test_codec_refuses_unregistered_type_on_encode():
    """Encoding an unregistered class raises TypeError naming the type and the fix."""

    @attrs.frozen
    class Mine:
        x: int = 1

    with pytest.raises(TypeError, match=r"cannot store Mine value .* pimm_fn.register_slot_type"):
        codec.dumps(State(Progress(2, 1), slots=(Mine(),)))
    with pytest.raises(TypeError, match="cannot store set value"):
        codec.encode({1, 2})


def test_codec_refuses_unregistered_name_on_decode():
    """Decoding a value naming an unregistered type raises ValueError and runs nothing."""
    data = {"__attrs__": "os:system", "fields": {"command": "echo hi"}}
    with pytest.raises(ValueError, match=r"type 'os:system', which is not registered"):
        codec.decode(data)


def test_codec_round_trips_registered_custom_slot():
    """A class decorated with register round-trips; register refuses non-attrs classes."""

    @codec.register_slot_type
    @attrs.frozen
    class Counter:
        n: int = 0
        seen: tuple = ()

    s = State(Progress(2, 1), slots=(Counter(3, (1.5, "a")),))
    assert codec.loads(codec.dumps(s)) == s
    with pytest.raises(TypeError, match=r"register\(\) takes an attrs class"):
        codec.register_slot_type(dict)


def test_codec_uses_no_pickle():
    """The codec module neither imports nor calls pickle."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(codec))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {"pickle", "marshal", "dill", "cloudpickle"} & (names | modules)


def test_frozen_map_plus_adds_values_of_the_same_keys_only():
    """plus() sums key by key when both maps hold the same keys (in any order), and is None otherwise."""
    m = FrozenMap({"loss": 1.0, "lr": 0.5})
    assert m.plus({"lr": 0.25, "loss": 2.0}) == {"loss": 3.0, "lr": 0.75}
    assert m.plus(FrozenMap({"loss": 1.0, "lr": 0.5})) == {"loss": 2.0, "lr": 1.0}
    assert m.plus({"loss": 1.0}) is None and m.plus({"loss": 1.0, "lr": 1.0, "aux": 1.0}) is None
    assert m == {"loss": 1.0, "lr": 0.5}  # unchanged
    assert FrozenMap().plus({}) == {}


def test_the_folds_copies_keep_every_other_field_as_attrs_evolve_does():
    """Progress.advanced and State.moved name each field: one added later and not copied fails here."""
    p = Progress(
        iters_per_epoch=10, max_epochs=3, epoch=1, iter_in_epoch=2, global_step=12, samples_seen=96, step_limit=25
    )
    assert p.advanced(3, 24) == attrs.evolve(p, iter_in_epoch=5, global_step=15, samples_seen=120)
    assert {f.name for f in attrs.fields(Progress)} == {
        "iters_per_epoch",
        "max_epochs",
        "epoch",
        "iter_in_epoch",
        "global_step",
        "samples_seen",
        "step_limit",
    }
    s = State(
        p,
        rank=1,
        world_size=2,
        metrics={"a": 1.0},
        best={"a": 1.0},
        config={"k": 2},
        slots=(1, 2),
        slot=3,
        position="AfterStep",
        stop="plateau",
    )
    q = p.advanced(1, 8)
    assert s.moved(q, "BeforeStep", (4, 5), None) == attrs.evolve(
        s, progress=q, position="BeforeStep", slots=(4, 5), slot=None
    )
    assert s.with_slot(9) == attrs.evolve(s, slot=9)
    assert {f.name for f in attrs.fields(State)} == {
        "progress",
        "rank",
        "world_size",
        "metrics",
        "best",
        "config",
        "slots",
        "slot",
        "position",
        "stop",
    }


def test_the_folds_copies_validate_what_they_build():
    """They go through __init__: an invalid position or a negative step is refused as by the constructor."""
    s = State(Progress(10, 1))
    with pytest.raises(ValueError, match="position"):
        s.moved(s.progress, "Sideways", (), None)
    with pytest.raises(ValueError, match="iter_in_epoch"):
        Progress(10, 1).advanced(-1, 0)
