"""pimm's ``--options KEY=VALUE`` strings as values, parsed as pimm's ``DictAction`` parses them.

int, then float, then ``true``/``false``, else the string (``None`` stays
the string ``"None"``, which a hook's validation then refuses); commas and
brackets make lists and tuples; quotes and spaces are dropped. Applying
them to a config: ``pimm_fn.compat.options``.

>>> parse_value("[(1,2),a]"), parse_value("1e-3"), parse_value("None")
([(1, 2), 'a'], 0.001, 'None')
"""

from collections.abc import Mapping

__all__ = ["parse_value", "parse_options"]


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
        text = text[comma + 1:]
    return tuple(values) if is_tuple else values


def parse_options(options) -> dict:
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
        raise TypeError(f"options must be a list of 'KEY=VALUE' strings (got the string {options!r}): wrap it in a list")
    parsed = {}
    for item in options:
        if not isinstance(item, str) or "=" not in item:
            raise ValueError(f"options: {item!r} is not KEY=VALUE (e.g. 'hooks.CheckpointSaver.save_freq=100')")
        key, value = item.split("=", 1)
        parsed[key] = parse_value(value)
    return parsed
