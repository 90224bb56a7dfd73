"""Every factory validates every argument at construction, naming it."""

import pytest

import pimm_fn as pf


def validate(model):
    return None


BAD = [
    (pf.save_every, (0,), {}, ValueError, "save_every: 'n' must be an int >= 1 (got 0)"),
    (pf.save_every, (-1,), {}, ValueError, "save_every: 'n' must be an int >= 1 (got -1)"),
    (pf.save_every, ("10",), {}, ValueError, "save_every: 'n' must be an int >= 1 (got '10')"),
    (pf.save_every, (1.0,), {}, ValueError, "save_every: 'n' must be an int >= 1 (got 1.0)"),
    (pf.save_every, (False,), {}, ValueError, "save_every: 'n' must be an int >= 1 (got False)"),
    (pf.save_every, (5,), {"snapshots": "yes"}, TypeError, "save_every: 'snapshots' must be a bool (got 'yes')"),
    (pf.save_every, (5,), {"snapshots": None}, TypeError, "save_every: 'snapshots' must be a bool (got None)"),
    (pf.best_on, ("",), {}, TypeError, "best_on: 'metric' must be a non-empty str (got '')"),
    (pf.best_on, (None,), {}, TypeError, "best_on: 'metric' must be a non-empty str (got None)"),
    (
        pf.best_on,
        ("miou",),
        {"mode": "maximum"},
        ValueError,
        "best_on: 'mode' must be one of ['max', 'min'] (got 'maximum')",
    ),
    (pf.best_on, ("miou",), {"mode": "MAX"}, ValueError, "best_on: 'mode' must be one of ['max', 'min'] (got 'MAX')"),
    (pf.evaluate_every, (-1, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got -1)"),
    (pf.evaluate_every, (2.5, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got 2.5)"),
    (pf.evaluate_every, (True, validate), {}, ValueError, "evaluate_every: 'n' must be an int >= 0 (got True)"),
    (pf.evaluate_every, (1, None), {}, TypeError, "evaluate_every: 'fn' must be callable (got None)"),
    (
        pf.evaluate_every,
        (1, validate),
        {"name": ""},
        TypeError,
        "evaluate_every: 'name' must be a non-empty str (got '')",
    ),
    (
        pf.evaluate_every,
        (1, validate),
        {"broadcast": 0},
        TypeError,
        "evaluate_every: 'broadcast' must be a bool (got 0)",
    ),
    (pf.log_every, (0,), {}, ValueError, "log_every: 'n' must be an int >= 1 (got 0)"),
    (pf.log_every, (None,), {}, ValueError, "log_every: 'n' must be an int >= 1 (got None)"),
    (pf.load_weights, ("",), {}, TypeError, "load_weights: 'path' must be a non-empty str (got '')"),
    (pf.load_weights, (None,), {}, TypeError, "load_weights: 'path' must be a non-empty str (got None)"),
    (pf.load_weights, ("w.pth",), {"strict": "true"}, TypeError, "load_weights: 'strict' must be a bool (got 'true')"),
    (
        pf.load_weights,
        ("w.pth",),
        {"replacements": [("a", "b")]},
        TypeError,
        "load_weights: 'replacements' must be a dict of {old_prefix: new_prefix} (got list: [('a', 'b')])",
    ),
    (
        pf.load_weights,
        ("w.pth",),
        {"replacements": {1: "b"}},
        TypeError,
        "load_weights: 'replacements' must map str prefixes to str prefixes (got 1: 'b')",
    ),
    (
        pf.chain,
        (pf.save_every(1), "save"),
        {},
        TypeError,
        "'chain' position 1: a hook must be callable as hook(state, event) (got 'save')",
    ),
]


@pytest.mark.parametrize(
    "factory, args, kwargs, exc, message", BAD, ids=[f"{b[0].__name__}-{i}" for i, b in enumerate(BAD)]
)
def test_factory_rejects_bad_argument_naming_it(factory, args, kwargs, exc, message):
    """A bad argument raises ValueError/TypeError at construction with the factory, argument and value."""
    with pytest.raises(exc) as info:
        factory(*args, **kwargs)
    assert str(info.value) == message


def test_hooks_are_frozen():
    """A built hook cannot be changed after construction."""
    import attrs

    hook = pf.save_every(5)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        hook.n = 0
