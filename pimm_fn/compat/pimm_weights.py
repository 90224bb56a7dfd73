"""pimm's warm start carried out: the weights found as ``CheckpointLoader`` finds them, renamed by pimm's rules.

``load_pimm_weights`` reads them safely (``pimm_fn.compat.reading``);
``remap_pimm_weights`` rewrites their keys through pimm_fn's one engine,
``pimm_fn.checkpoint.remap_state_dict``, fed ``pimm_rules``, with pimm's
shape and zero-match checks.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

from pimm_fn import checkpoint
from pimm_fn.compat.reading import (
    WEIGHTS, PimmCheckpointError, holds_pimm_fn, is_pimm_fn, safe_load, state_dict_of, unwrapped,
)

__all__ = ["load_pimm_weights", "pimm_rules", "remap_pimm_weights"]


def load_pimm_weights(path) -> dict:
    """The model weights at ``path`` as pimm's ``CheckpointLoader`` finds them (``PIMM.md`` 3.6, warm start).

    A directory: ``model.safetensors``/``model.bin`` (an export), a pimm_fn
    checkpoint, or the first of ``weights.pth``, ``last/weights.pth``,
    ``model/last/weights.pth``; a file: its ``["model"]["state_dict"]``,
    ``["state_dict"]`` or itself. Keys come without ``module.``.

    Raises:
        FileNotFoundError: nothing there (pimm's messages).
        PimmCheckpointError: ``hf://`` (download first), or an unsafe file.
    """
    text = os.fspath(path)
    if text.startswith("hf://"):
        raise PimmCheckpointError(
            f"{text}: download Hub weights first (huggingface_hub.hf_hub_download) and pass the local file"
        )
    p = pathlib.Path(text)
    if p.is_dir():
        if (p / "model.safetensors").is_file():  # read, checked, as any warm start reads safetensors
            return unwrapped(checkpoint.load_weights_file(p / "model.safetensors"))
        if (p / "model.bin").is_file():
            return unwrapped(state_dict_of(safe_load(p / "model.bin"), p / "model.bin"))
        if is_pimm_fn(p) or holds_pimm_fn(p / "model"):
            return unwrapped(checkpoint.load_weights_file(p))
        for candidate in (p / WEIGHTS, p / "last" / WEIGHTS, p / "model" / "last" / WEIGHTS):
            if candidate.is_file():
                return unwrapped(state_dict_of(safe_load(candidate), candidate))
        if holds_pimm_fn(p):
            return unwrapped(checkpoint.load_weights_file(p))
        raise FileNotFoundError(
            f"Weight directory must contain weights.pth, last/weights.pth, or model/last/weights.pth: {p}"
        )
    if not p.is_file():
        raise FileNotFoundError(f"No weight found at: {p}")
    return unwrapped(state_dict_of(safe_load(p), p))


def _strip(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def pimm_rules(rules) -> list:
    """pimm's ``(keyword, replacement)`` pairs as rules of pimm_fn's one key-rewrite engine (``remap_state_dict``).

    Each keyword matches whole dotted components and may match nothing; of
    two rules for one keyword the one pimm tries first wins (the longer as
    written, then the earlier); a keyword that is empty once ``module.`` and
    a trailing dot are dropped matches nothing, as in pimm.

    >>> pimm_rules([("", ""), ("backbone", "encoder"), ("module.backbone.", "trunk.")])
    [KeyRule(old='module.backbone.', new='trunk.', whole=True, required=False)]
    """
    ordered = sorted(rules or (), key=lambda rule: len(_strip(rule[0])), reverse=True)  # stable: pimm's order
    chosen: dict = {}
    for keyword, replacement in ordered:
        bare = _strip(keyword).rstrip(".")
        if bare and bare not in chosen:
            chosen[bare] = checkpoint.KeyRule(keyword, replacement, whole=True, required=False)
    return list(chosen.values())


def remap_pimm_weights(weights: Mapping, rules, model_state: Mapping, *, strict: bool = False):
    """pimm's key rewrite (``PIMM.md`` 3.7), on whole dotted components, and its shape and zero-match checks.

    The rewrite is ``pimm_fn.checkpoint.remap_state_dict`` fed ``pimm_rules(rules)``.
    Returns ``(remapped, skipped)``: the dict to load and the keys left at
    their initial values for another shape (non-strict only).

    Raises:
        RuntimeError: no key of the model would load (pimm's message).
        ValueError: two keys of the file map to one name (pimm would load one of them silently).

    >>> import torch
    >>> model = {"encoder.w": torch.zeros(2), "encoder2.w": torch.zeros(2), "head.b": torch.zeros(1)}
    >>> out, skipped = remap_pimm_weights({"module.backbone.w": torch.ones(2), "head.b": torch.ones(3)},
    ...                                   [("backbone", "encoder")], model)
    >>> sorted(out), skipped
    (['encoder.w'], ('head.b',))
    """
    out, _ = checkpoint.remap_state_dict(weights, pimm_rules(rules), model_state)
    skipped = ()
    if not strict:
        skipped = tuple(k for k, v in out.items() if k in model_state and hasattr(v, "shape")
                        and tuple(v.shape) != tuple(model_state[k].shape))
        out = {k: v for k, v in out.items() if k not in skipped}
    loaded = sum(1 for k in model_state if k in out)
    if model_state and loaded == 0 and not strict:
        raise RuntimeError(
            f"Checkpoint load matched 0 of {len(model_state)} model parameters (rules={list(rules or [])!r}). The "
            f"model would train from random init. Fix the keyword/replacement rules, or set strict=True to find the "
            f"mismatch."
        )
    return out, skipped
