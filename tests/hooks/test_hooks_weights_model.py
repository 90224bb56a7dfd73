"""load_weights and model_hook."""

import pathlib

import attrs
import pytest

from pimm_fn.core import events as ev
from pimm_fn.core.effects import LoadWeights, Log
from pimm_fn.core.fold import chain
from pimm_fn.hooks import load_weights, model_hook
from _hook_helpers import at, run


def test_load_weights_emits_only_on_a_fresh_before_train():
    """A fresh BeforeTrain requests LoadWeights; a resumed one and every other event request nothing."""
    hook = load_weights("w.pth", replacements={"backbone.": "encoder."}, strict=True)
    state = at(0)
    assert hook(state, ev.BeforeTrain()) == (state, (LoadWeights("w.pth", (("backbone.", "encoder."),), True),))
    assert hook(state, ev.BeforeTrain(resumed=True)) == (state, ())
    assert hook.events == (ev.BeforeTrain,)
    _, rec = run([load_weights("w.pth")], iters=2, epochs=2)
    assert [(event, effect) for _, event, effect, _, _ in rec.seen] == [(ev.BeforeTrain(), LoadWeights("w.pth"))]


def test_load_weights_accepts_path_objects():
    """A path-like is stored as its string."""
    assert load_weights(pathlib.Path("a/b.pth")) == load_weights("a/b.pth")


@pytest.mark.parametrize("replacements", [[("a", "b")], "a=b", (("a", "b"),)])
def test_load_weights_rejects_non_dict_replacements(replacements):
    """replacements that are not a dict raise TypeError naming the argument and the type."""
    with pytest.raises(
        TypeError,
        match=r"load_weights: 'replacements' must be a dict of \{old_prefix: new_prefix\} \(got "
        + type(replacements).__name__,
    ):
        load_weights("w.pth", replacements=replacements)


def test_load_weights_rejects_non_str_rules():
    """A replacement rule must map str to str."""
    with pytest.raises(
        TypeError, match=r"load_weights: 'replacements' must map str prefixes to str prefixes \(got 'a': 1\)"
    ):
        load_weights("w.pth", replacements={"a": 1})


def test_load_weights_repr_reads_like_the_call():
    """repr shows path, then replacements and strict only when given."""
    assert repr(load_weights("w.pth")) == "load_weights('w.pth')"
    assert repr(load_weights("w.pth", replacements={"a.": "b."}, strict=True)) == (
        "load_weights('w.pth', replacements={'a.': 'b.'}, strict=True)"
    )


def test_unbound_model_hook_emits_nothing():
    """model_hook() outside a loop (plan, simulator) returns the state unchanged and no effects."""
    state = at(3)
    for event in (ev.BeforeTrain(), ev.AfterStep(3), ev.AfterTrain()):
        assert model_hook()(state, event) == (state, ())
    assert model_hook() == model_hook() and repr(model_hook()) == "model_hook()"


class Model:
    """A model taking part in the loop: counts AfterSteps in its slot and logs every second."""

    def on_event(self, state, event):
        if isinstance(event, ev.AfterStep):
            count = (state.slot or 0) + 1
            effects = (Log(event.step, "model", {"count": count}),) if count % 2 == 0 else ()
            return state.with_slot(count), effects
        return None


def test_bound_model_hook_calls_model_on_event():
    """A bound model_hook forwards each event to model.on_event; None means no change."""
    hook = model_hook().bind(Model())
    state = at(1)
    assert hook(state, ev.BeforeTrain()) == (state, ())
    assert hook(state, ev.AfterStep(1)) == (attrs.evolve(state, slot=1), ())
    final, rec = run([hook], iters=2, epochs=2)
    assert [effect for _, _, effect, _, _ in rec.seen] == [Log(2, "model", {"count": 2}), Log(4, "model", {"count": 4})]
    assert final.slots == (4,)
    assert repr(hook) == "model_hook()"


def test_bound_model_hook_without_on_event_does_nothing():
    """A model with no on_event is left alone."""
    state = at(1)
    assert model_hook().bind(object())(state, ev.AfterStep(1)) == (state, ())


def test_bound_model_hook_bad_return_is_a_type_error():
    """A model's on_event returning a non-pair fails in the fold with TypeError naming the hook."""

    class Bad:
        def on_event(self, state, event):
            return 1

    hooks = chain(model_hook().bind(Bad()))
    with pytest.raises(TypeError, match=r"hook model_hook\(\) must return \(State, tuple_of_effects\)"):
        hooks(at(1), ev.BeforeTrain())
