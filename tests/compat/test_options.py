"""pimm's config overrides: --options values and keys, hooks_override, their order, and the errors pimm lacks."""

import re

import pytest

from pimm_fn.compat import apply_options, build_hooks, checkpoint_saver, checkpoint_saver_iteration, parse_options
from pimm_fn.compat.options import parse_value


@pytest.mark.parametrize(
    "text, value",
    [
        ("100", 100),
        ("1e-3", 0.001),
        ("true", True),
        ("False", False),
        ("None", "None"),
        ("dcp", "dcp"),
        ("1,2,3", [1, 2, 3]),
        ("[a, b]", ["a", "b"]),
        ("(1,2)", (1, 2)),
        ("[(1,2),[a,b],c]", [(1, 2), ["a", "b"], "c"]),
        ("'quoted value'", "quotedvalue"),
    ],
)
def test_values_parse_as_pimms_dict_action(text, value):
    """int, then float, then true/false, else the string; commas and brackets make lists and tuples (PIMM.md 4)."""
    assert parse_value(text) == value


HOOKS = [
    dict(type="CheckpointLoader"),
    dict(type="CheckpointSaver", save_freq=None),
    dict(type="CheckpointSaverIteration", save_freq=1000),
    dict(type="CheckpointSaver", save_freq=2),
]


@pytest.mark.parametrize(
    "options, override, expected",
    [
        # A type override sets the parameter on every hook of that type.
        (
            ["hooks.CheckpointSaver.save_freq=100"],
            None,
            [None, checkpoint_saver(100), checkpoint_saver_iteration(1000), checkpoint_saver(100)],
        ),
        # An index override sets one hook.
        (
            ["hooks.3.save_freq=7"],
            None,
            [None, checkpoint_saver(), checkpoint_saver_iteration(1000), checkpoint_saver(7)],
        ),
        # hooks_override comes first, then the options: the option wins.
        (
            ["hooks.CheckpointSaverIteration.save_freq=50"],
            {"CheckpointSaverIteration": {"save_freq": 10}, "CheckpointSaver": {"evaluator_every_n_steps": 5}},
            [None, checkpoint_saver(None, 5), checkpoint_saver_iteration(50), checkpoint_saver(2, 5)],
        ),
        # Index merges come before type overrides, as pimm merges the plain options first.
        (
            ["hooks.CheckpointSaver.save_freq=9", "hooks.1.save_freq=3"],
            None,
            [None, checkpoint_saver(9), checkpoint_saver_iteration(1000), checkpoint_saver(9)],
        ),
        # A type the registry knows but the list lacks is ignored (a launcher's default option), as in pimm.
        (
            ["hooks.WandbNamer.extra=fft"],
            None,
            [None, checkpoint_saver(), checkpoint_saver_iteration(1000), checkpoint_saver(2)],
        ),
    ],
)
def test_overrides_apply_in_pimms_order(options, override, expected):
    """hooks_override, then --options index merges, then --options type overrides (PIMM.md 1.1 step 2-3)."""
    hooks = build_hooks(HOOKS, options=options, hooks_override=override)
    assert hooks[1:] == expected[1:]


def test_overrides_leave_the_given_configs_unchanged():
    """The config list is copied, not edited in place."""
    before = [dict(h) for h in HOOKS]
    build_hooks(
        HOOKS, options=["hooks.CheckpointSaver.save_freq=5"], hooks_override={"CheckpointLoader": {"strict": True}}
    )
    assert HOOKS == before


def test_apply_options_changes_a_whole_config_and_records_the_cli_keys():
    """apply_options: hooks_override removed, plain keys merged (lists by index), _cli_options recorded."""
    cfg = {
        "epoch": 2,
        "data": {"train": {"max_len": 10}},
        "hooks": [dict(type="WandbNamer", keys=["seed"])],
        "hooks_override": {"WandbNamer": {"extra": "fft"}},
    }
    new = apply_options(cfg, ["epoch=3", "data.train.max_len=20", "hooks.0.sep=_", "wandb_run_name=mine"])
    assert new == {
        "epoch": 3,
        "data": {"train": {"max_len": 20}},
        "wandb_run_name": "mine",
        "hooks": [dict(type="WandbNamer", keys=["seed"], extra="fft", sep="_")],
        "_cli_options": ("epoch", "data.train.max_len", "hooks.0.sep", "wandb_run_name"),
    }
    assert "hooks_override" in cfg and cfg["epoch"] == 2


def test_nested_parameters_are_created_as_pimm_does():
    """A dotted parameter path creates the nested dicts it needs."""
    cfg = apply_options({"hooks": [dict(type="PretrainEvaluator")]}, ["hooks.PretrainEvaluator.train_config.lr=0.1"])
    assert cfg["hooks"][0]["train_config"] == {"lr": 0.1}


@pytest.mark.parametrize(
    "options, override, error, message",
    [
        (
            ["hooks.CheckpointSavr.save_freq=1"],
            None,
            ValueError,
            "option 'hooks.CheckpointSavr.save_freq' names the unknown hook type 'CheckpointSavr': did you mean "
            "'CheckpointSaver'?",
        ),
        (
            None,
            {"CheckpointSavr": {"save_freq": 1}},
            ValueError,
            "hooks_override['CheckpointSavr'] names the unknown hook type 'CheckpointSavr': did you mean 'CheckpointSaver'?",
        ),
        (
            ["hooks.CheckpointSaver=1"],
            None,
            ValueError,
            "option 'hooks.CheckpointSaver' names a hook type but no parameter: write 'hooks.CheckpointSaver.<param>=value' "
            "(all hooks of that type) or 'hooks.<index>.<param>=value' (one hook)",
        ),
        (["hooks.9.save_freq=1"], None, KeyError, "Index 9 exceeds the length of list cfg.hooks (length 4)"),
        (
            ["epoch=3"],
            None,
            ValueError,
            "options ['epoch'] are not about hooks: apply them to the whole config with "
            "pimm_fn.compat.apply_options(cfg, options), then build_hooks(cfg['hooks'])",
        ),
        (
            ["hooks.CheckpointSaver.save_frq=1"],
            None,
            TypeError,
            "build_hooks: hooks[1] CheckpointSaver got unknown keyword 'save_frq': did you mean 'save_freq'? "
            "(CheckpointSaver accepts ['save_freq', 'evaluator_every_n_steps'])",
        ),
        (
            ["hooks.CheckpointSaver.save_freq=None"],
            None,
            ValueError,
            "build_hooks: hooks[1] CheckpointSaver: checkpoint_saver: 'save_freq' must be None or an int >= 1 (got 'None')",
        ),
        (
            ["save_freq"],
            None,
            ValueError,
            "options: 'save_freq' is not KEY=VALUE (e.g. 'hooks.CheckpointSaver.save_freq=100')",
        ),
    ],
)
def test_bad_overrides_are_refused_with_the_fix(options, override, error, message):
    """Typos pimm silently ignores, and the forms pimm fails on obscurely, are refused with a clear message."""
    with pytest.raises(error, match=re.escape(message)):
        build_hooks(HOOKS, options=options, hooks_override=override)


def test_parse_options_takes_a_list_or_a_parsed_dict():
    """A list of KEY=VALUE strings is parsed; a dict is taken as parsed; a bare string is refused."""
    assert parse_options(["a.b=1", "c=x,y"]) == {"a.b": 1, "c": ["x", "y"]}
    assert parse_options({"a": 1}) == {"a": 1}
    with pytest.raises(TypeError, match="wrap it in a list"):
        parse_options("a=1")
