"""Parsing JSON that came from outside this process (a file, a checkpoint, a peer) with its nesting bounded.

``json.loads`` recurses once per nested array or object, so ``"[" * 100000``
(a crafted or damaged file) meets the interpreter's recursion limit. Catching
the ``RecursionError`` is not enough: a garbage collection the parser's
allocations set off runs finalizers at that depth, and they fail ("Exception
ignored"), their work lost. So ``loads`` counts the brackets outside strings
first, without recursion, and refuses text nested deeper than ``MAX_DEPTH``
with a ``ValueError``, as it refuses any other malformed JSON: the parser, and
the decoders that walk its result recursively, never see it.

>>> loads('{"a": [1, 2]}')
{'a': [1, 2]}
>>> loads("[" * 100000)
Traceback (most recent call last):
ValueError: nested too deeply to parse
"""

import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_DEPTH", "loads", "nested_deeper_than"]


MAX_DEPTH = 256
"""How deep ``loads`` lets arrays and objects nest: far deeper than anything pimm_fn writes, far shallower than the
interpreter's recursion limit, which the parser and the decoders after it would otherwise meet."""


# A JSON string (its brackets are not nesting), an opening bracket or a closing one; as text and as bytes.
_TOKENS = r'(?P<string>"[^"\\]*(?:\\.[^"\\]*)*")|(?P<open>[\[{])|(?P<close>[\]}])'
_TEXT = re.compile(_TOKENS)
_BYTES = re.compile(_TOKENS.encode())


def nested_deeper_than(data: str | bytes | bytearray, most: int) -> bool:
    """Whether ``data``'s arrays and objects nest deeper than ``most``, found without recursion.

    >>> nested_deeper_than('["[[[["]', 1), nested_deeper_than("[[]]", 1)
    (False, True)
    """
    tokens: Iterator[re.Match[str]] | Iterator[re.Match[bytes]]
    if isinstance(data, str):
        brackets, tokens = data.count("[") + data.count("{"), _TEXT.finditer(data)
    else:
        brackets, tokens = data.count(b"[") + data.count(b"{"), _BYTES.finditer(data)
    if brackets <= most:  # too few brackets to nest that deep: no scan
        return False
    depth = 0
    for token in tokens:
        kind = token.lastgroup
        if kind == "open":
            depth += 1
            if depth > most:
                return True
        elif kind == "close":
            depth -= 1
    return False


def loads(data: str | bytes | bytearray, **options: Any) -> Any:
    """``json.loads(data, **options)``, refusing nesting deeper than ``MAX_DEPTH`` before the parser sees it.

    Raises:
        ValueError: ``data`` is not JSON, or nests deeper than ``MAX_DEPTH`` (``json.JSONDecodeError`` is one).
    """
    if nested_deeper_than(data, MAX_DEPTH):
        raise ValueError("nested too deeply to parse")
    return json.loads(data, **options)
