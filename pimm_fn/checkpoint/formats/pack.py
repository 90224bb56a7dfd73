"""Split nested plain state into a JSON skeleton and a flat dict of tensors.

Trainer state (optimizer, scheduler and scaler state dicts, counters, JSON
strings, RNG states) is a tree of containers whose leaves are tensors or plain
values. ``torch.distributed.checkpoint`` stores tensors well but would pickle
everything else. :func:`pack` therefore replaces each tensor by a numbered
placeholder and writes the rest as JSON, which loads without running any
code; :func:`unpack` puts the tree back together.

The skeleton keeps what JSON alone would lose: ``tuple`` vs ``list``, ``int``
vs ``float``, non-string dict keys (optimizer ``state`` is keyed by ints), key
order, and non-finite floats. numpy arrays and scalars (``np.random.get_state``)
are stored as raw bytes plus their dtype and shape, so they come back
bit-identical.

Example:
    >>> import torch
    >>> skeleton, tensors = pack({"step": 3, "betas": (0.9, 0.99), "t": torch.ones(2)})
    >>> sorted(tensors)
    ['0']
    >>> unpack(skeleton, tensors)["betas"]
    (0.9, 0.99)
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

from pimm_fn.core import untrusted_json

__all__ = ["pack", "unpack", "skeleton_to_tensor", "tensor_to_skeleton"]

_VERSION = 1
_SUPPORTED = "None, bool, int, float, str, list, tuple, dict, torch.Tensor, numpy arrays/scalars"


def pack(obj: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """Split ``obj`` into a JSON skeleton and the tensors it references.

    Args:
        obj: a tree of ``dict``/``list``/``tuple`` whose leaves are ``None``,
            ``bool``, ``int``, ``float``, ``str``, tensors or numpy values.

    Returns:
        ``(skeleton, tensors)``: a JSON string and a dict from placeholder
        name (``"0"``, ``"1"``, ...) to a detached tensor.

    Raises:
        TypeError: a leaf has another type; the message gives its path.
    """
    tensors: dict[str, torch.Tensor] = {}
    root = _encode(obj, "obj", tensors)
    skeleton = json.dumps({"pack": _VERSION, "root": root}, allow_nan=False)
    return skeleton, tensors


def unpack(skeleton: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Rebuild the tree that :func:`pack` split.

    Args:
        skeleton: the JSON string returned by :func:`pack`.
        tensors: the tensors returned by :func:`pack` (or loaded back).

    Returns:
        The original tree, with tensors taken from ``tensors``.

    Raises:
        ValueError: the skeleton is malformed or references a missing tensor,
            or ``tensors`` holds entries the skeleton does not reference.
    """
    try:
        doc = untrusted_json.loads(skeleton)
    except ValueError as exc:
        raise ValueError(f"unpack: skeleton is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("pack") != _VERSION or "root" not in doc:
        raise ValueError(f"unpack: expected a pack skeleton of version {_VERSION}, got {skeleton[:80]!r}")
    used: set[str] = set()
    obj = _decode(doc["root"], tensors, used)
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"unpack: tensors {extra[:5]} are not referenced by the skeleton; wrong pairing?")
    return obj


def skeleton_to_tensor(skeleton: str) -> torch.Tensor:
    """Encode a skeleton as a 1-D ``uint8`` tensor (UTF-8 bytes)."""
    return torch.frombuffer(bytearray(skeleton.encode("utf-8")), dtype=torch.uint8).clone()


def tensor_to_skeleton(tensor: torch.Tensor) -> str:
    """Decode a tensor made by :func:`skeleton_to_tensor`."""
    return bytes(tensor.cpu().numpy().tobytes()).decode("utf-8")


def _encode(x: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if x is None or isinstance(x, bool):  # before int: bool is an int subclass
        return x
    if isinstance(x, str):
        return str(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x) if math.isfinite(x) else {"float": repr(float(x))}
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_meta:
            raise TypeError(
                f"pack: {path} is a {x.layout} tensor on {x.device}; only dense tensors with data can be saved"
            )
        key = str(len(tensors))
        tensors[key] = x.detach().resolve_conj().resolve_neg()
        return {"tensor": key}
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.dtype.hasobject:
            raise TypeError(f"pack: {path} is a numpy array of dtype object; convert it to a plain dtype first")
        key = str(len(tensors))
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        tensors[key] = torch.from_numpy(raw.copy())
        return {"ndarray": key, "dtype": arr.dtype.str, "shape": list(arr.shape), "scalar": isinstance(x, np.generic)}
    if isinstance(x, dict):
        return {
            "dict": [
                [_encode(k, f"{path} key {k!r}", tensors), _encode(v, f"{path}[{k!r}]", tensors)] for k, v in x.items()
            ]
        }
    if isinstance(x, (list, tuple)):
        tag = "tuple" if isinstance(x, tuple) else "list"
        return {tag: [_encode(v, f"{path}[{i}]", tensors) for i, v in enumerate(x)]}
    raise TypeError(
        f"pack: {path} has type {type(x).__module__}.{type(x).__qualname__}; supported leaves are {_SUPPORTED}. "
        "Convert it first (to a tensor, or to a JSON string)."
    )


def _decode(node: Any, tensors: dict[str, torch.Tensor], used: set[str]) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, dict) and len(node) >= 1:
        if "tensor" in node:
            return _take(node["tensor"], tensors, used)
        if "ndarray" in node:
            raw = _take(node["ndarray"], tensors, used).numpy().tobytes()
            arr = np.frombuffer(raw, dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
            return arr[()] if node["scalar"] else arr
        if "float" in node:
            return float(node["float"])
        if "dict" in node:
            return {_hashable(_decode(k, tensors, used)): _decode(v, tensors, used) for k, v in node["dict"]}
        if "list" in node:
            return [_decode(v, tensors, used) for v in node["list"]]
        if "tuple" in node:
            return tuple(_decode(v, tensors, used) for v in node["tuple"])
    raise ValueError(f"unpack: malformed skeleton node {str(node)[:80]!r}")


def _take(key: str, tensors: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    if key not in tensors:
        raise ValueError(f"unpack: skeleton references tensor {key!r}, which is missing from the tensors given")
    used.add(key)
    return tensors[key]


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"unpack: dict key {key!r} is not hashable; the skeleton is corrupt") from None
    return key
