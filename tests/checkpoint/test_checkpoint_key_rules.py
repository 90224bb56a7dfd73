"""remap_state_dict is the one key-rewrite engine: KeyRule values carry another rule language (pimm's keywords on
whole dotted components, optional) to the same longest-match, module.-aware rewrite."""

import pytest

from pimm_fn.checkpoint import KeyRule, remap_state_dict
from pimm_fn.compat.warm_start import pimm_rules, remap_pimm_weights

torch = pytest.importorskip("torch")


def test_a_whole_component_rule_never_matches_a_longer_name():
    """'backbone' renames backbone and backbone.*, never backbone2.*; a trailing dot on either side changes nothing."""
    state = {"backbone": 0, "backbone.w": 1, "backbone2.w": 2}
    for rule in (KeyRule("backbone", "enc", whole=True), KeyRule("backbone.", "enc.", whole=True)):
        sd, report = remap_state_dict(state, [rule], ["enc", "enc.w", "backbone2.w"])
        assert sd == {"enc": 0, "enc.w": 1, "backbone2.w": 2} and report.complete


def test_an_empty_replacement_drops_the_components():
    """A whole-component rule to '' removes the prefix and its dot."""
    sd, _ = remap_state_dict({"module.backbone.w": 1}, [KeyRule("backbone", "", whole=True)], ["w"])
    assert sd == {"w": 1}


def test_an_optional_rule_may_match_nothing_and_a_required_one_may_not():
    """required=False (pimm's keywords) matches nothing silently; the default is the same error as a dict rule."""
    sd, _ = remap_state_dict({"a": 1}, [KeyRule("trunk", "b", whole=True, required=False)], ["a"])
    assert sd == {"a": 1}
    with pytest.raises(ValueError, match=r"\['trunk'\] matched no key"):
        remap_state_dict({"a": 1}, [KeyRule("trunk", "b", whole=True)], ["a"])


def test_the_longest_rule_wins_across_both_kinds():
    """A whole-component rule and a prefix rule compete by length, as two prefixes do."""
    rules = [KeyRule("backbone", "enc", whole=True), KeyRule("backbone.stem.", "stem.")]
    sd, _ = remap_state_dict({"backbone.stem.w": 1, "backbone.x": 2}, rules, ["stem.w", "enc.x"])
    assert sd == {"stem.w": 1, "enc.x": 2}


def test_a_list_of_anything_but_rules_is_refused_naming_both_forms():
    """replacements is a dict or a list of KeyRule values; anything else says so."""
    with pytest.raises(TypeError, match=r"must be a dict .* or a list of KeyRule values \(got list"):
        remap_state_dict({"a": 1}, [("a", "b")], ["b"])
    with pytest.raises(ValueError, match=r"Length of .old. must be >= 1"):
        KeyRule("", "x")


def test_pimms_rules_are_keyrules_in_pimms_order():
    """pimm tries the longer keyword as written first, then the earlier; empty keywords never match."""
    given = [("", ""), ("module.", "x"), ("backbone", "a"), ("backbone.", "b"), ("head", "h"), ("head", "g")]
    optional = {"whole": True, "required": False}
    assert pimm_rules(given) == [KeyRule("backbone.", "b", **optional), KeyRule("head", "h", **optional)]


def test_pimms_remap_refuses_two_keys_landing_on_one_name():
    """The engine's check applies to pimm's rules too: two source tensors for one model key are an error, not a
    silent pick of whichever came last."""
    model = {"w": torch.zeros(1)}
    with pytest.raises(ValueError, match="both map to 'w'"):
        remap_pimm_weights({"backbone.w": torch.ones(1), "w": torch.ones(1)}, [("backbone", "")], model)
