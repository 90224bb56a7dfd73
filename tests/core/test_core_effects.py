"""Call: a function named, never carried, with plain arguments and a scope; refused clearly otherwise."""

import math
import pickle
import re

import pytest

import pimm_fn as pf
from pimm_fn.core.effects import Call, Scope
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.testing import simulate


def module_level(state, ctx):
    """A function Call.of can name."""


class Holder:
    def method(self, state, ctx):
        """A bound method: no name another process can find it by."""


def test_call_of_names_a_function_by_module_and_qualified_name():
    """Call.of(fn) is Call('module:qualname'), equal, hashable and equal again after a pickle round trip."""
    call = Call.of(module_level, 3, args=[1, "a", [2.5, None]], kwargs={"k": {"x": (1, 2)}}, scope=Scope.LOCAL)
    assert call == Call(
        f"{__name__}:module_level", 3, (1, "a", (2.5, None)), {"k": FrozenMap({"x": (1, 2)})}, Scope.LOCAL
    )
    assert call.scope is Scope.LOCAL and Call("m:f", 1).scope is Scope.MAIN
    assert pickle.loads(pickle.dumps(call)) == call and hash(pickle.loads(pickle.dumps(call))) == hash(call)
    assert Call.of(math.hypot, 2).function == "math:hypot" and Call.of(Holder.method, 2).function.endswith(
        "Holder.method"
    )


@pytest.mark.parametrize(
    "fn",
    [lambda state, ctx: None, Holder().method, pickle.dumps.__call__],
    ids=["a lambda", "a bound method", "a method-wrapper"],
)
def test_call_of_refuses_a_callable_no_process_can_find_by_name(fn):
    """A lambda or a bound method is refused at once, saying what to define instead."""
    with pytest.raises(
        ValueError, match="has no name another process can find it by .* define a function at the top level"
    ):
        Call.of(fn, 1)


def test_a_function_defined_inside_another_is_refused():
    """A nested function's qualified name holds '<locals>': refused as Call.of and as a Call name alike."""

    def inner(state, ctx): ...

    with pytest.raises(ValueError, match="has no name another process can find"):
        Call.of(inner, 1)
    with pytest.raises(ValueError, match=r"'function' must name a function .* as 'module:qualname'"):
        Call(f"{__name__}:{inner.__qualname__}", 1)


@pytest.mark.parametrize("name", ["module_level", "mod:", ":f", "a b:f", "m:f()", 3])
def test_a_function_name_not_shaped_module_colon_qualname_is_refused(name):
    """'function' must read 'module:qualname'; the error shows the value and the fix."""
    with pytest.raises(ValueError, match=re.escape(f"(got {name!r}); Call.of(fn, step) writes it for you")):
        Call(name, 1)


@pytest.mark.parametrize(
    "args, kwargs, says",
    [
        ((object(),), {}, r"args\[0\] is a object"),
        ((), {"model": pf}, r"kwargs\['model'\] is a module"),
        (([1, {"a": {1, 2}}],), {}, r"args\[0\]\[1\]\['a'\] is a set"),
    ],
)
def test_arguments_that_are_not_plain_values_are_refused_naming_where(args, kwargs, says):
    """An object, a module or a set among the arguments is a TypeError naming where it is and the fix."""
    with pytest.raises(TypeError, match=rf"Call: {says} .*not a plain value: pass numbers, strings"):
        Call("m:f", 1, args, kwargs)


def test_keyword_names_and_scope_are_checked():
    """A keyword that is no identifier, or a scope that is no Scope, is refused naming it."""
    with pytest.raises(TypeError, match=r"kwargs names must be identifiers, .* \(got 'not a name'\)"):
        Call("m:f", 1, kwargs={"not a name": 1})
    with pytest.raises(TypeError, match="'scope' must be Scope.MAIN, Scope.LOCAL or Scope.COLLECTIVE \\(got 'main'\\)"):
        Call("m:f", 1, scope="main")


def test_plan_shows_a_call_with_its_scope_and_simulate_runs_a_main_one_on_rank_0_only():
    """A hook's Calls are in plan's trace; simulate records MAIN on rank 0 only, LOCAL and COLLECTIVE on every rank."""

    def asks(state, event):
        if isinstance(event, pf.events.AfterStep):
            return state, tuple(Call.of(module_level, event.step, scope=s) for s in Scope)
        return state, ()

    trace = pf.plan([asks], iters_per_epoch=2, max_epochs=1)
    assert [(e.step, e.effect.scope) for e in trace] == [(s, scope) for s in (1, 2) for scope in Scope]
    assert f"Call(function='{__name__}:module_level', step=2, scope=Scope.LOCAL)" in str(trace)
    result = simulate([asks], world_size=2, iters_per_epoch=2, max_epochs=1)
    assert [e.effect.scope for e in result.traces[1]] == [Scope.COLLECTIVE, Scope.LOCAL] * 2
    assert [e.effect for e in result.collective(0)] == [e.effect for e in result.collective(1)]


def test_a_call_after_saves_says_so_and_runs_in_the_last_group():
    """after_saves=True shows in the repr and puts the Call after the saves of its event; a non-bool is refused."""
    from pimm_fn.core.effects import SaveCheckpoint
    from pimm_fn.core.processing import in_order

    late = Call("m:f", 2, after_saves=True)
    assert (
        repr(late) == "Call('m:f', 2, after_saves=True)"
        and late.runs_after_saves
        and not Call("m:f", 2).runs_after_saves
    )
    assert in_order([(0, late), (1, SaveCheckpoint(2)), (2, Call("m:g", 2))]) == [
        (2, Call("m:g", 2)),
        (1, SaveCheckpoint(2)),
        (0, late),
    ]
    with pytest.raises(TypeError, match="'after_saves' must be a bool"):
        Call("m:f", 2, after_saves=1)
