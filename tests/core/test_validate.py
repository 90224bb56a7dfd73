"""The one validator module: each validator accepts what it says, refuses the rest naming owner, argument and value."""

import math
import pickle

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pimm_fn.core import validate as v
from pimm_fn.core.effects import Effect, SaveCheckpoint


@pytest.mark.parametrize(
    "validator, good, bad, error, message",
    [
        (v.int_at_least(1), [1, 7], [0, -3, 1.0, "2", True, None], ValueError, "f: 'x' must be an int >= 1 (got {!r})"),
        (
            v.number(at_least=0),
            [0, 0.5, 10**6],
            [-0.1, math.nan, math.inf, True, "1"],
            ValueError,
            "f: 'x' must be a finite number >= 0 (got {!r})",
        ),
        (
            v.number(at_least=0, below=1),
            [0, 0.999],
            [1, 1.0, -1e-9, math.nan],
            ValueError,
            "f: 'x' must be a number in [0, 1) (got {!r})",
        ),
        (
            v.one_of("max", "min"),
            ["max", "min"],
            ["MAX", 1, None],
            ValueError,
            "f: 'x' must be one of ['max', 'min'] (got {!r})",
        ),
        (v.is_bool, [True, False], [0, 1, "true", "no", None], TypeError, "f: 'x' must be a bool (got {!r})"),
        (v.non_empty_str, ["a"], ["", None, b"a", 3], TypeError, "f: 'x' must be a non-empty str (got {!r})"),
        (v.is_callable, [print, len], [3, None, "print"], TypeError, "f: 'x' must be callable (got {!r})"),
        (
            v.subclass_of(Effect),
            [Effect, SaveCheckpoint],
            [Effect(), "SaveCheckpoint", int],
            TypeError,
            "f: 'x' must be a subclass of Effect (got {!r})",
        ),
        (
            v.optional(v.int_at_least(0)),
            [None, 0, 3],
            [-1, "3", False],
            ValueError,
            "f: 'x' must be None or an int >= 0 (got {!r})",
        ),
    ],
)
def test_each_validator_accepts_what_it_says_and_names_argument_and_value_otherwise(
    validator, good, bad, error, message
):
    """Good values come back unchanged; each bad one raises the validator's error with owner, argument and value."""
    for value in good:
        assert validator.check(value, "x", owner="f") is value
    for value in bad:
        with pytest.raises(error) as raised:
            validator.check(value, "x", owner="f")
        assert str(raised.value) == message.format(value)


def test_a_hint_ends_the_message_with_the_fix():
    """with_hint appends the fix after the value, also through optional()."""
    with pytest.raises(TypeError, match=r"^loop: 'ddp' must be a bool \(got 'true'\); pass True or False$"):
        v.is_bool.with_hint("pass True or False").check("true", "ddp", owner="loop")
    with pytest.raises(ValueError, match=r"must be None or an int >= 1 \(got 0\); leave it None$"):
        v.optional(v.int_at_least(1)).with_hint("leave it None").check(0, "iters_per_epoch")


def test_duck_typed_objects_are_named_with_what_they_lack():
    """has_methods says which methods are missing, and that a class is not an instance."""
    scheduler = v.has_methods("step", "state_dict", expected="a scheduler")
    with pytest.raises(
        TypeError,
        match=r"'s' must be a scheduler, with step\(\), state_dict\(\) \(got \[1\]\); "
        r"it has no step\(\), state_dict\(\)",
    ):
        scheduler.check([1], "s")
    with pytest.raises(TypeError, match="a class, not an instance of it"):
        scheduler.check(type("Sched", (), {"step": lambda self: 0, "state_dict": lambda self: {}}), "s")


def test_a_mapping_names_the_entry_that_is_wrong():
    """mapping_of names the bad key, or the entry whose value is bad, and what the whole must be."""
    handlers = v.mapping_of(v.subclass_of(Effect), v.is_callable, expected="a dict of effect types to handlers")
    assert handlers.check({SaveCheckpoint: print}, "handlers") == {SaveCheckpoint: print}
    with pytest.raises(TypeError, match=r"'handlers' has the key 'SaveCheckpoint', which is not a subclass of Effect"):
        handlers.check({"SaveCheckpoint": print}, "handlers")
    with pytest.raises(TypeError, match=r"'handlers' entry SaveCheckpoint must be callable \(got 3\)"):
        handlers.check({SaveCheckpoint: 3}, "handlers")
    with pytest.raises(TypeError, match=r"'handlers' must be a dict of effect types to handlers \(got \[<built-in"):
        handlers.check([print], "handlers")


def test_long_or_multiline_values_are_shown_by_their_type():
    """A model or a long list in a message is 'a Linear', not a screen of repr."""
    with pytest.raises(ValueError, match=r"\(got a list of 200 items\)$"):
        v.int_at_least(0).check(list(range(200)), "n")


@attrs.frozen
class _Configured:
    factory_name = "configured"
    every: int = attrs.field(alias="n", validator=v.int_at_least(1))
    mode: str = attrs.field(default="max", validator=v.one_of("max", "min"))


def test_as_attrs_validators_they_name_the_factory_and_the_argument_as_spelled():
    """On an attrs class the message names factory_name and the field's alias (the factory's argument)."""
    with pytest.raises(ValueError, match=r"^configured: 'n' must be an int >= 1 \(got 0\)$"):
        _Configured(0)
    with pytest.raises(ValueError, match=r"^configured: 'mode' must be one of \['max', 'min'\] \(got 'best'\)$"):
        _Configured(1, "best")


def test_validators_are_values_with_a_call_like_repr_equality_and_pickle():
    """A validator reads like its factory call, compares by value and survives pickling (spawned processes)."""
    built = [
        v.int_at_least(1),
        v.optional(v.number(at_least=0, below=1)),
        v.one_of("a", "b"),
        v.is_bool,
        v.mapping_of(v.non_empty_str, v.is_callable),
        v.subclass_of(Effect),
    ]
    assert [repr(x) for x in built[:3]] == [
        "int_at_least(1)",
        "optional(number(at_least=0, below=1))",
        "one_of('a', 'b')",
    ]
    for validator in built:
        assert pickle.loads(pickle.dumps(validator)) == validator
    assert v.int_at_least(1) == v.int_at_least(1) != v.int_at_least(2)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(-5, 5), st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.none()))
def test_int_at_least_accepts_exactly_the_ints_in_range(value):
    """int_at_least(0) accepts exactly non-bool ints >= 0; every other value raises naming the argument."""
    valid = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if valid:
        assert v.int_at_least(0).check(value, "n") == value
    else:
        with pytest.raises(ValueError, match="'n' must be an int >= 0"):
            v.int_at_least(0).check(value, "n")


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**400), 10**400), st.booleans()))
def test_finite_is_true_exactly_for_real_finite_non_bool_numbers(value):
    """finite() never raises: NaN, +/-inf, bools and ints too large for a float are not finite numbers."""
    expected = (
        not isinstance(value, bool) and abs(value) < math.inf
        if not isinstance(value, int)
        else (not isinstance(value, bool) and abs(value) <= 1.7976931348623157e308)
    )
    assert v.finite(value) is bool(expected)
