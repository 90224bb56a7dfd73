"""Hook slots by identity: reordered, added and removed hooks each get their own slot back."""

import json
from typing import ClassVar

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pimm_fn.core import codec, slots
from pimm_fn.core.fold import chain
from pimm_fn.core.hook_list import DuplicateHookError
from pimm_fn.hooks import BestState, LogState, SaveEveryState, best_on, log_every, save_every


@codec.register_slot_type
@attrs.frozen
class Count:
    n: int = 0


@codec.register_slot_type
@attrs.frozen
class Renamed:
    m: int = 0


@attrs.frozen
class Counter:
    """A leaf hook called ``name`` whose slot is a ``Count``."""

    name: str

    @property
    def hook_key(self) -> str:
        return self.name

    def init(self) -> Count:
        return Count()

    def __call__(self, state, event):
        return state.with_slot(Count(state.slot.n + 1)), ()


@attrs.frozen
class Other:
    """A leaf hook called ``name`` whose slot is a ``Renamed``: the same identity as a ``Counter``, another slot."""

    name: str

    @property
    def hook_key(self) -> str:
        return self.name

    def init(self) -> Renamed:
        return Renamed()

    def __call__(self, state, event):
        return state, ()


def stateless(state, event):
    return state, ()


HOOKS = [save_every(3), chain(best_on("acc"), log_every(2), name="watch"), stateless]
SLOTS = (SaveEveryState(3), (BestState(0.5, 2), LogState(count=1)), 7)


def test_keyed_keeps_each_slot_under_its_hook_identity_and_a_chain_under_its_childrens():
    """A top-level slot sits under its hook's key; a chain's slots sit, keyed, under the chain's name."""
    saved = slots.keyed(HOOKS, SLOTS)
    assert saved.keys() == ("save_every(3)", "watch", "test_core_slots.stateless")
    assert dict(saved.entries)["watch"] == slots.Keyed(
        (("best_on('acc')", BestState(0.5, 2)), ("log_every(2)", LogState(count=1)))
    )


def test_an_unnamed_chain_holding_a_function_hook_has_the_same_identity_in_every_process():
    """Its identity is built from its children's: a function by its qualified name, never its address."""
    from pimm_fn.core.hook import key

    assert key(chain(save_every(2), stateless)) == "chain(save_every(2), test_core_slots.stateless)"
    assert key(chain(save_every(2), save_every(3))) == repr(chain(save_every(2), save_every(3)))


def test_the_same_hooks_in_the_same_order_get_their_slots_back_and_drop_nothing():
    """unkeyed inverts keyed for an unchanged hook list."""
    assert slots.unkeyed(HOOKS, slots.keyed(HOOKS, SLOTS)) == (SLOTS, ())


def test_reordered_hooks_get_their_own_slots_at_every_depth():
    """Permuting the hooks, and a named chain's children, hands each hook the slot it saved."""
    reordered = [stateless, chain(log_every(2), best_on("acc"), name="watch"), save_every(3)]
    restored, dropped = slots.unkeyed(reordered, slots.keyed(HOOKS, SLOTS))
    assert restored == (7, (LogState(count=1), BestState(0.5, 2)), SaveEveryState(3)) and dropped == ()


def test_a_new_hook_starts_from_its_initial_slot():
    """A hook the checkpoint does not know gets its init() slot, or None without one."""

    def progress(state, event):
        return state, ()

    restored, dropped = slots.unkeyed(HOOKS + [Counter("tally"), progress], slots.keyed(HOOKS, SLOTS))
    assert restored == SLOTS + (Count(), None) and dropped == ()


def test_a_removed_hook_is_dropped_and_reported_with_its_path_inside_chains():
    """Keys no hook claims are reported, a chain child's as 'chain / child'."""
    fewer = [chain(best_on("acc"), name="watch")]
    restored, dropped = slots.unkeyed(fewer, slots.keyed(HOOKS, SLOTS))
    assert restored == ((BestState(0.5, 2),),)
    assert dropped == ("save_every(3)", "test_core_slots.stateless", "watch / log_every(2)")


def test_a_hook_whose_slot_type_changed_is_a_mismatch_naming_key_found_and_expected():
    """The same identity with another slot type raises SlotMismatch carrying the key and both types."""
    saved = slots.keyed([Counter("tally")], (Count(4),))
    with pytest.raises(
        slots.SlotMismatch, match=r"hook 'tally'.* type test_core_slots\.Count.* test_core_slots\.Renamed"
    ):
        slots.unkeyed([Other("tally")], saved)
    nested = slots.keyed([chain(Counter("tally"), name="outer")], ((Count(),),))
    with pytest.raises(slots.SlotMismatch) as caught:
        slots.unkeyed([chain(Other("tally"), name="outer")], nested)
    assert (caught.value.key, caught.value.found, caught.value.expected) == (
        "outer / tally",
        "test_core_slots.Count",
        "test_core_slots.Renamed",
    )


def test_a_chain_claiming_a_leaf_slot_is_a_mismatch():
    """A chain given the identity a leaf hook had cannot take that leaf's slot."""
    saved = slots.keyed([Counter("x")], (Count(1),))
    with pytest.raises(slots.SlotMismatch, match="the slots of a chain"):
        slots.unkeyed([chain(Counter("y"), name="x")], saved)


def test_a_hook_without_an_initial_slot_takes_any_saved_slot_and_numbers_may_change_kind():
    """No init() means no type to check; an int slot may come back as a float for an int-started hook."""
    assert slots.unkeyed([stateless], slots.keyed([stateless], ("anything",)))[0] == ("anything",)

    @attrs.frozen
    class Sum:
        hook_key: ClassVar[str] = "sum"

        def init(self):
            return 0

        def __call__(self, state, event):
            return state, ()

    assert slots.unkeyed([Sum()], slots.keyed([Sum()], (2.5,)))[0] == (2.5,)
    with pytest.raises(slots.SlotMismatch, match="type bool"):
        slots.unkeyed([Sum()], slots.keyed([Sum()], (True,)))


def test_keyed_slots_round_trip_through_json():
    """dumps writes plain JSON; loads gives back an equal Keyed value, nested chains included."""
    saved = slots.keyed(HOOKS, SLOTS)
    text = slots.dumps(saved)
    json.loads(text)
    assert slots.loads(text) == saved and slots.dumps(slots.loads(text)) == text


def test_an_unregistered_slot_class_fails_only_for_the_hook_that_claims_it(monkeypatch):
    """A slot whose class is no longer registered loads as Undecodable: dropped quietly, or a mismatch if claimed."""
    text = slots.dumps(slots.keyed([Counter("tally"), save_every(3)], (Count(2), SaveEveryState(3))))
    monkeypatch.delitem(codec._REGISTRY, "test_core_slots:Count")
    loaded = slots.loads(text)
    assert isinstance(dict(loaded.entries)["tally"], slots.Undecodable)
    assert slots.unkeyed([save_every(3)], loaded) == ((SaveEveryState(3),), ("tally",))
    with pytest.raises(slots.SlotMismatch, match=r"type test_core_slots\.Count.* no longer decodes .*not registered"):
        slots.unkeyed([Counter("tally")], loaded)


def test_a_slot_class_whose_fields_changed_is_undecodable(monkeypatch):
    """A registered name whose class now has other fields reports the failure instead of raising TypeError."""
    text = slots.dumps(slots.keyed([Counter("tally")], (Count(2),)))
    monkeypatch.setitem(codec._REGISTRY, "test_core_slots:Count", Renamed)
    with pytest.raises(slots.SlotMismatch, match=r"hook 'tally'.*no longer decodes \(TypeError: .*unexpected keyword"):
        slots.unkeyed([Counter("tally")], slots.loads(text))


def test_loads_refuses_text_that_is_not_keyed_slots():
    """Positional JSON or garbage is a ValueError naming what was expected."""
    with pytest.raises(ValueError, match="expected keyed slots"):
        slots.loads(codec.dumps((1, 2)))
    with pytest.raises(ValueError, match="not valid JSON"):
        slots.loads("{")


def test_keyed_refuses_a_wrong_number_of_slots_and_duplicate_identities():
    """One slot per hook, and each identity once."""
    with pytest.raises(ValueError, match="2 hook.* 1 slot"):
        slots.keyed([save_every(3), log_every(2)], (None,))
    with pytest.raises(DuplicateHookError, match="save_every"):
        slots.keyed([save_every(3), save_every(3)], (None, None))


def test_by_position_reads_old_slots_and_refuses_another_hook_count_or_type():
    """Checkpoints from before keyed slots resume positionally when the count and types fit."""
    assert slots.by_position(HOOKS, SLOTS) == SLOTS
    with pytest.raises(slots.SlotMismatch, match=r"written by a run with 3 hook\(s\), this run has 1"):
        slots.by_position([save_every(3)], SLOTS)
    with pytest.raises(slots.SlotMismatch, match=r"hook .best_on\('acc'\).: .*SaveEveryState.*BestState"):
        slots.by_position([best_on("acc")], (SaveEveryState(3),))


# -- properties -----------------------------------------------------------------------------------
_NAMES = st.sampled_from("abcdef")


def _trees(depth: int = 2):
    """Hook trees as nested lists of (name, count) leaves and (name, [children]) chains, names unique per level.

    Shrinks towards fewer, shallower hooks.
    """
    leaf = st.tuples(_NAMES, st.integers(0, 9))
    node = leaf if depth == 0 else st.one_of(leaf, st.tuples(_NAMES, st.deferred(lambda: _trees(depth - 1))))
    return st.lists(node, unique_by=lambda n: n[0], max_size=4)


def _hooks(tree) -> list:
    return [chain(*_hooks(v), name=name) if isinstance(v, list) else Counter(name) for name, v in tree]


def _slots(tree) -> tuple:
    return tuple(_slots(v) if isinstance(v, list) else Count(v) for _, v in tree)


def _flat(tree, prefix=()) -> dict:
    """{path: count} of every leaf; new leaves hold None."""
    out = {}
    for name, v in tree:
        if isinstance(v, list):
            out.update(_flat(v, prefix + (name,)))
        else:
            out[prefix + (name,)] = v
    return out


def _reshape(data, tree) -> list:
    """A random new run of ``tree``: each level keeps a subset, permuted, plus new leaves (upper-case names)."""
    kept = data.draw(st.lists(st.sampled_from(tree), unique_by=lambda n: n[0]) if tree else st.just([]))
    kept = [(name, _reshape(data, v) if isinstance(v, list) else v) for name, v in kept]
    new = [(name, None) for name in data.draw(st.lists(st.sampled_from("XYZ"), unique=True, max_size=2))]
    return data.draw(st.permutations(kept + new))


def _dropped(old, new, prefix=()) -> set:
    now = dict(new)
    out = set()
    for name, v in old:
        if name not in now:
            out.add(" / ".join(prefix + (name,)))
        elif isinstance(v, list):
            out |= _dropped(v, now[name], prefix + (name,))
    return out


@given(_trees())
def test_any_hook_tree_round_trips_through_keyed_json(tree):
    """For any nested hook tree, keyed -> dumps -> loads -> unkeyed gives the slots back and drops nothing."""
    hooks, saved = _hooks(tree), _slots(tree)
    assert slots.unkeyed(hooks, slots.loads(slots.dumps(slots.keyed(hooks, saved)))) == (saved, ())


@given(_trees(), st.data())
def test_permuting_adding_and_removing_hooks_gives_each_kept_hook_its_own_slot(tree, data):
    """After any reshaping at any depth: kept hooks get their saved slot, new ones a fresh one, removed ones are dropped."""
    new_tree = _reshape(data, tree)
    saved = slots.loads(slots.dumps(slots.keyed(_hooks(tree), _slots(tree))))
    restored, dropped = slots.unkeyed(_hooks(new_tree), saved)
    expected = {path: Count(n if n is not None else 0) for path, n in _flat(new_tree).items()}
    assert _flat(_as_tree(new_tree, restored)) == expected
    assert set(dropped) == _dropped(tree, new_tree) and len(dropped) == len(set(dropped))


def _as_tree(tree, restored) -> list:
    """``tree`` with each leaf's value replaced by the slot ``unkeyed`` gave it."""
    return [(name, slot if not isinstance(v, list) else _as_tree(v, slot)) for (name, v), slot in zip(tree, restored)]
