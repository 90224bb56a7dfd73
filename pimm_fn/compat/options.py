"""pimm's config overrides: ``--options KEY=VALUE`` and ``hooks_override``, as pimm applies them.

pimm's ``default_config_parser`` (``PIMM.md`` 1.1, 4) changes a loaded
config in this order:

1. ``hooks_override`` (a config key, ``{HookType: {"param.sub": value}}``):
   every hook entry of that type gets the (dotted, auto-created) parameter;
   the key is removed;
2. the ``--options`` that are not hook-type overrides, merged into the
   config (``hooks.4.save_freq=100`` indexes the hook list; any other key,
   ``epoch=3``, the config itself); their keys are recorded as
   ``_cli_options`` (``WandbNamer`` keeps a name given there);
3. the hook-type overrides ``hooks.<Type>.<param>=value``, applied to every
   hook of that type.

Values are parsed as pimm's ``DictAction`` does (``pimm_fn.compat.options``).

Where pimm is silent, these say so: a type override naming a type no
registry knows (a typo, which pimm ignores) is refused with a did-you-mean
message; ``hooks.Type=value`` without a parameter is refused with the form
to use. A type that exists but is not in the list is ignored, as in pimm
(launchers add overrides for hooks a config may not have).

>>> hooks = [dict(type="CheckpointLoader"), dict(type="CheckpointSaver", save_freq=None)]
>>> override_hooks(hooks, ["hooks.CheckpointSaver.save_freq=100", "hooks.0.strict=true"])
[{'type': 'CheckpointLoader', 'strict': True}, {'type': 'CheckpointSaver', 'save_freq': 100}]

pimm's ``--options KEY=VALUE`` strings as values, parsed as pimm's ``DictAction`` parses them.

int, then float, then ``true``/``false``, else the string (``None`` stays
the string ``"None"``, which a hook's validation then refuses); commas and
brackets make lists and tuples; quotes and spaces are dropped. Applying
them to a config: ``pimm_fn.compat.options``.

>>> parse_value("[(1,2),a]"), parse_value("1e-3"), parse_value("None")
([(1, 2), 'a'], 0.001, 'None')
"""

import copy
import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pimm_fn.compat.type_factories import BUILTINS

__all__ = [
    "parse_value",
    "parse_options",
    "apply_options",
    "override_hooks",
    "split_options",
]


def _scalar(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _next_comma(text: str) -> int:
    if text.count("(") != text.count(")") or text.count("[") != text.count("]"):
        raise ValueError(f"Imbalanced brackets exist in {text}")
    for i, char in enumerate(text):
        before = text[:i]
        if char == "," and before.count("(") == before.count(")") and before.count("[") == before.count("]"):
            return i
    return len(text)


def parse_value(text: str):
    """A ``--options`` value as pimm's ``DictAction`` parses it.

    >>> parse_value("1,2,3"), parse_value("'[a, b]'"), parse_value("TRUE")
    ([1, 2, 3], ['a', 'b'], True)
    """
    text = text.strip("'\"").replace(" ", "")
    is_tuple = False
    if text.startswith("(") and text.endswith(")"):
        is_tuple, text = True, text[1:-1]
    elif text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    elif "," not in text:
        return _scalar(text)
    values = []
    while text:
        comma = _next_comma(text)
        values.append(parse_value(text[:comma]))
        text = text[comma + 1 :]
    return tuple(values) if is_tuple else values


def parse_options(options: Iterable[str] | Mapping[str, Any] | None) -> dict:
    """``{key: value}`` from ``["KEY=VALUE", ...]`` (pimm's ``--options``); a mapping is taken as parsed.

    Raises:
        ValueError: an item without ``=``.

    >>> parse_options(["hooks.1.save_freq=7", "epoch=3"])
    {'hooks.1.save_freq': 7, 'epoch': 3}
    """
    if options is None:
        return {}
    if isinstance(options, Mapping):
        return dict(options)
    if isinstance(options, str):
        raise TypeError(
            f"options must be a list of 'KEY=VALUE' strings (got the string {options!r}): wrap it in a list"
        )
    parsed = {}
    for item in options:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"options: {item!r} is not KEY=VALUE (e.g. 'hooks.CheckpointSaver.save_freq=100')")
        key, value = item.split("=", 1)
        parsed[key] = parse_value(value)
    return parsed


def _is_type_override(key: str) -> bool:
    parts = key.split(".", 2)
    return key.startswith("hooks.") and len(parts) == 3 and not parts[1].isdigit()


def split_options(options: Mapping) -> tuple[dict, dict]:
    """``(hook-type overrides, merge options)``, as pimm's ``_split_hook_type_options``.

    >>> split_options({"hooks.CheckpointSaver.save_freq": 1, "hooks.2.x": 2, "lr": 0.1})
    ({'hooks.CheckpointSaver.save_freq': 1}, {'hooks.2.x': 2, 'lr': 0.1})
    """
    types = {k: v for k, v in options.items() if _is_type_override(k)}
    return types, {k: v for k, v in options.items() if k not in types}


def _set_nested(entry: dict, path: str, value) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        entry = entry.setdefault(key, {})
    entry[keys[-1]] = value


def _merge(a: Mapping, b, where: str):
    """pimm's ``Config._merge_a_into_b`` with list keys: ``a`` merged into a copy of ``b``."""
    b = list(b) if isinstance(b, list) else dict(b)
    for k, v in a.items():
        if isinstance(b, list):
            if not k.isdigit():
                raise KeyError(f"{where} is a list: index it with a number, not {k!r}")
            index = int(k)
            if len(b) <= index:
                raise KeyError(f"Index {index} exceeds the length of list {where} (length {len(b)})")
            b[index] = _merge(v, b[index], f"{where}.{k}") if isinstance(v, dict) else v
        elif isinstance(v, dict) and k in b and not v.pop("_delete_", False):
            if not isinstance(b[k], (dict, list)):
                raise TypeError(f"{where}.{k}={v} cannot merge into {where}.{k}, a {type(b[k]).__name__}")
            b[k] = _merge(v, b[k], f"{where}.{k}")
        else:
            b[k] = v
    return b


def _nested_options(options: Mapping) -> dict:
    nested: dict = {}
    for key, value in options.items():
        d = nested
        *path, last = key.split(".")
        for part in path:
            d = d.setdefault(part, {})
        d[last] = value
    return nested


def _check_hook_keys(options: Mapping, known) -> None:
    for key in options:
        parts = key.split(".")
        if parts[0] != "hooks" or len(parts) != 2 or parts[1].isdigit():
            continue
        raise ValueError(
            f"option {key!r} names a hook type but no parameter: write 'hooks.{parts[1]}.<param>=value' (all hooks "
            f"of that type) or 'hooks.<index>.<param>=value' (one hook)"
        )
    for key in options:
        if _is_type_override(key) and known is not None:
            _check_type(key.split(".")[1], known, f"option {key!r}")


def _check_type(name, known, where) -> None:
    if name not in known:
        match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f": did you mean {match[0]!r}?" if match else f" (known types: {sorted(known)})"
        raise ValueError(f"{where} names the unknown hook type {name!r}{hint}")


def _by_type(hooks: list, overrides: Mapping, known, where: str) -> None:
    for hook_type, params in overrides.items():
        if known is not None:
            _check_type(hook_type, known, f"{where}[{hook_type!r}]")
        if not isinstance(params, Mapping):
            raise TypeError(f"{where}[{hook_type!r}] must be a dict of {{'param.path': value}} (got {params!r:.80})")
        for entry in hooks:
            if isinstance(entry, dict) and entry.get("type") == hook_type:
                for path, value in params.items():
                    _set_nested(entry, path, copy.deepcopy(value))


def override_hooks(
    hooks: Iterable,
    options: Iterable[str] | Mapping[str, Any] | None = None,
    *,
    hooks_override: Mapping | None = None,
    known: Collection[str] | None = None,
) -> list:
    """The hook configs with pimm's overrides applied, in pimm's order; the input is not changed.

    Args:
        hooks: pimm's ``hooks`` list of dicts (built hooks pass through).
        options: ``["hooks.X.y=v", ...]`` or a parsed dict; only ``hooks.*`` keys.
        hooks_override: ``{HookType: {"param.path": value}}``, applied first.
        known: the hook type names a type override may name (``None``: any).

    Raises:
        ValueError: an option outside ``hooks.*`` (apply it to the config
            with ``apply_options``), a type override without parameter, or one
            naming an unknown type.
        KeyError: an index past the end of the list (pimm's message).
    """
    options = parse_options(options)
    outside = [k for k in options if k != "hooks" and not k.startswith("hooks.")]
    if outside:
        raise ValueError(
            f"options {outside} are not about hooks: apply them to the whole config with "
            f"pimm_fn.compat.apply_options(cfg, options), then build_hooks(cfg['hooks'])"
        )
    cfg = apply_options({"hooks": list(hooks), "hooks_override": hooks_override or {}}, options, known=known)
    return cfg["hooks"]


def apply_options(
    cfg: Mapping, options: Iterable[str] | Mapping[str, Any] | None = None, *, known: Collection[str] | None = None
) -> dict:
    """A copy of the pimm config ``cfg`` with its ``hooks_override`` and the ``options`` applied, pimm's way.

    Args:
        cfg: the loaded config as a dict (its ``hooks`` a list of dicts).
        options: ``["KEY=VALUE", ...]`` (pimm's ``--options``) or a parsed dict.
        known: hook type names a type override or ``hooks_override`` may name
            (default: the built-in registry's types).

    Returns:
        The new config: ``hooks_override`` removed, ``_cli_options`` the
        tuple of option keys when options were given.

    >>> cfg = {"epoch": 2, "hooks": [dict(type="CheckpointSaver", save_freq=None)],
    ...        "hooks_override": {"CheckpointSaver": {"save_freq": 5}}}
    >>> new = apply_options(cfg, ["epoch=3", "hooks.CheckpointSaver.save_freq=100"])
    >>> new["epoch"], new["hooks"], new["_cli_options"], "hooks_override" in new
    (3, [{'type': 'CheckpointSaver', 'save_freq': 100}], ('epoch', 'hooks.CheckpointSaver.save_freq'), False)
    """
    if known is None:
        known = BUILTINS  # the built-in registry's types
    out = copy.deepcopy(dict(cfg))
    hooks = out.get("hooks")
    if hooks is not None and not isinstance(hooks, list):
        hooks = out["hooks"] = list(hooks)
    override = out.pop("hooks_override", None)
    if override:
        if not isinstance(override, Mapping):
            raise TypeError(
                f"hooks_override must be a dict {{HookType: {{'param.path': value}}}} (got {override!r:.80})"
            )
        _by_type(hooks or [], override, known, "hooks_override")
    options = parse_options(options)
    if not options:
        return out
    _check_hook_keys(options, known)
    type_options, merge_options = split_options(options)
    out = _merge(_nested_options(copy.deepcopy(merge_options)), out, "cfg")
    out["_cli_options"] = tuple(options)
    grouped: dict = {}
    for key, value in type_options.items():
        _, hook_type, path = key.split(".", 2)
        grouped.setdefault(hook_type, {})[path] = value
    _by_type(out.get("hooks") or [], grouped, known, "options")
    return out
