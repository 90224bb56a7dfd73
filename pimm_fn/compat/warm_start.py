"""pimm's ``CheckpointLoader`` as a pure hook: a fresh run warm-started from a weights file, with pimm's key rules.

It asks with ``LoadPimmWeights`` (a ``LoadWeights`` in pimm's dialect),
carried out by ``pimm_fn.compat.HANDLERS``; a resumed run loads nothing.

pimm's warm start carried out: the weights found as ``CheckpointLoader`` finds them, renamed by pimm's rules.

``load_pimm_weights`` reads them safely (``pimm_fn.compat.reading``);
``remap_pimm_weights`` rewrites their keys through pimm_fn's one engine,
``pimm_fn.checkpoint.remap_state_dict``, fed ``pimm_rules``, with pimm's
shape and zero-match checks.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn import checkpoint
from pimm_fn.compat.effects import LoadPimmWeights
from pimm_fn.compat.reading import (
    WEIGHTS,
    PimmCheckpointError,
    holds_pimm_fn,
    is_pimm_fn,
    safe_load,
    state_dict_of,
    unwrapped,
)
from pimm_fn.core import events as ev
from pimm_fn.core.effects import LoadWeights
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import is_bool, non_empty_str, optional

__all__ = [
    "checkpoint_loader",
    "load_pimm_weights",
    "pimm_rules",
    "remap_pimm_weights",
]


def _rules(instance, attribute, value):
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value):
        raise TypeError(f"checkpoint_loader: each rule must map a str keyword to a str replacement (got {value!r:.80})")


@attrs.frozen(repr=False)
class _CheckpointLoader:
    factory_name: ClassVar[str] = "checkpoint_loader"
    events: ClassVar[tuple] = (ev.BeforeTrain,)
    emits: ClassVar[tuple] = (LoadWeights,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    weight: str | None = attrs.field(validator=optional(non_empty_str))
    rules: tuple = attrs.field(default=(), validator=_rules)
    strict: bool = attrs.field(default=False, validator=is_bool)
    form: str = "scalar"  # how the config gave the rules: "scalar" (keywords/replacement) or "replacements"

    def __call__(self, state, event):
        if event.resumed or self.weight is None:  # a resume restores its own weights; no weight: a fresh run
            return state, ()
        return state, (LoadPimmWeights(self.weight, self.rules, self.strict),)

    def __repr__(self):
        args = [repr(self.weight)] if self.weight is not None else []
        if self.form == "replacements":
            args.append(f"replacements={dict(self.rules)!r}")
        elif self.rules and self.rules[0] != ("", ""):
            keyword, replacement = self.rules[0]
            args.append(f"keywords={keyword!r}")
            args += [f"replacement={replacement!r}"] if replacement != keyword else []
        args += ["strict=True"] if self.strict else []
        return f"checkpoint_loader({', '.join(args)})"


@hook_factory
def checkpoint_loader(
    weight: str | None = None,
    *,
    keywords: str = "",
    replacement: str | None = None,
    replacements: dict | None = None,
    strict: bool = False,
) -> _CheckpointLoader:
    """pimm's ``CheckpointLoader``: warm-start a fresh run from ``weight`` with pimm's key rules.

    ``weight`` is pimm's ``cfg.weight``: a pimm ``weights.pth``, a pimm
    ``last/`` directory, ``model_last.pth``, a pimm_fn checkpoint or any
    state-dict file. ``None`` (pimm's default): a fresh run, nothing loaded.
    A resumed run loads nothing (``loop(resume=)`` restores everything).

    The rules are pimm's (``PIMM.md`` 3.7): ``replacements`` (a
    ``{keyword: replacement}`` dict) or the one rule ``keywords`` ->
    ``replacement`` (``None``: ``keywords``, keys unchanged). The longest
    keyword wins, ``module.`` prefixes are ignored on both sides, and, unlike
    pimm's raw string prefix, a keyword matches whole dotted components only
    (``backbone`` matches ``backbone.conv.weight``, not ``backbone2.conv.weight``).
    Non-strict, keys of another shape than the model's are skipped and
    reported, kept at their initial values; loading none of the model's
    keys is an error.

    Emits:
        ``LoadPimmWeights(weight, rules, strict)`` (a ``LoadWeights`` in pimm's dialect) at ``BeforeTrain``
        of a fresh run.

    Raises:
        TypeError: ``replacements`` is not a dict (pimm's message).

    >>> checkpoint_loader("w.pth", replacements={"backbone": "encoder"}, strict=True)
    checkpoint_loader('w.pth', replacements={'backbone': 'encoder'}, strict=True)
    >>> checkpoint_loader(replacements=[("a", "b")])
    Traceback (most recent call last):
    TypeError: CheckpointLoader.replacements must be a {keyword: replacement} dict, got list
    """
    fspath = getattr(weight, "__fspath__", None)
    weight = fspath() if fspath else weight
    if isinstance(weight, str) and weight.startswith("hf://"):
        raise ValueError(
            f"weight {weight!r}: download Hub weights first (huggingface_hub.hf_hub_download) and pass "
            f"the local file; the loop reads local files only"
        )
    if replacements is not None:
        if not isinstance(replacements, dict):
            raise TypeError(
                f"CheckpointLoader.replacements must be a {{keyword: replacement}} dict, got {type(replacements).__name__}"
            )
        return _CheckpointLoader(weight, tuple(replacements.items()), strict, "replacements")
    return _CheckpointLoader(weight, ((keywords, keywords if replacement is None else replacement),), strict)


def load_pimm_weights(path: str | os.PathLike) -> dict:
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
    return name[len("module.") :] if name.startswith("module.") else name


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
        skipped = tuple(
            k
            for k, v in out.items()
            if k in model_state and hasattr(v, "shape") and tuple(v.shape) != tuple(model_state[k].shape)
        )
        out = {k: v for k, v in out.items() if k not in skipped}
    loaded = sum(1 for k in model_state if k in out)
    if model_state and loaded == 0 and not strict:
        raise RuntimeError(
            f"Checkpoint load matched 0 of {len(model_state)} model parameters (rules={list(rules or [])!r}). The "
            f"model would train from random init. Fix the keyword/replacement rules, or set strict=True to find the "
            f"mismatch."
        )
    return out, skipped
