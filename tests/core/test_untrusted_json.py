"""JSON from outside the process: nesting past ``MAX_DEPTH`` is a ValueError, found before the parser recurses."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import codec, slots, untrusted_json
from pimm_fn.core.untrusted_json import MAX_DEPTH, loads, nested_deeper_than

DEEP = {"list": "[" * 100000, "object": '{"a":' * 100000}


def _depth(value) -> int:
    """How deep ``value``'s lists and dicts nest (a scalar: 0)."""
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


# Keys and strings full of brackets and escapes: only brackets outside strings nest.
_TEXT = st.text(alphabet='[]{}"\\ab', max_size=6)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=30,
)


@given(_VALUES, st.integers(0, 8), st.booleans())
def test_the_scan_finds_the_depth_the_parser_would(value, most, as_bytes):
    text = json.dumps(value)
    data = text.encode() if as_bytes else text
    assert nested_deeper_than(data, most) == (_depth(value) > most)


@pytest.mark.parametrize("shape", sorted(DEEP))
@pytest.mark.parametrize("as_bytes", [False, True])
def test_deep_nesting_is_refused_without_calling_the_parser(shape, as_bytes, monkeypatch):
    """Refused by the scan, never by the parser meeting the recursion limit (where a finalizer run meanwhile fails)."""
    parsed = []
    monkeypatch.setattr(untrusted_json.json, "loads", lambda data, **options: parsed.append(data))
    data = DEEP[shape].encode() if as_bytes else DEEP[shape]
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        loads(data)
    assert parsed == []


def test_json_at_the_depth_limit_is_read_and_one_level_deeper_is_refused():
    assert str(loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)) == "[" * MAX_DEPTH + "]" * MAX_DEPTH
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        loads('{"a":' * MAX_DEPTH + "[]" + "}" * MAX_DEPTH)


def test_brackets_inside_strings_are_not_nesting():
    value = ["[" * (2 * MAX_DEPTH), {"quoted": 'a \\" [{', "deep": [[[]]]}]
    assert loads(json.dumps(value)) == value
    assert loads(json.dumps(value).encode()) == value


def test_options_reach_the_parser_and_malformed_json_is_a_value_error():
    assert loads('{"a": 1, "a": 2}', object_pairs_hook=list) == [("a", 1), ("a", 2)]
    with pytest.raises(ValueError):
        loads("{")


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_a_deep_slot_document_is_a_value_error_not_a_recursion_error(shape):
    """A checkpoint's slots and codec values decode recursively after the parser: both refuse deep text first."""
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        codec.loads(DEEP[shape])
    with pytest.raises(ValueError, match="nested too deeply to parse"):
        slots.loads(DEEP[shape])
