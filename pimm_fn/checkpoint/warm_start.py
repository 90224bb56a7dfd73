"""Warm-start weights read from any file or checkpoint pimm_fn understands, their keys fitted to the model.

From a checkpoint directory the files read are checked against the SHA-256
digests its marker records, as a resume checks them, and a best-model file
against the digest its ``.json`` records, and a safetensors file pimm_fn
exported against the digest its header records: a warm start never trains
on bytes changed since the save.

Warm-start key remapping: the one engine that fits a state_dict's keys to a model's.

``remap_state_dict`` rewrites keys by rules (``{old_prefix: new_prefix}``, or
``KeyRule`` values for another rule language, such as pimm's keywords on
whole dotted components) and reports how the result lines up with the
model: ``pf.load_weights`` and pimm's ``CheckpointLoader`` both go through it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, cast

import attrs
import torch

from pimm_fn.checkpoint import files, storage, validation
from pimm_fn.checkpoint.discovery import find_checkpoint
from pimm_fn.checkpoint.formats import one_file, safetensors_files, sharded
from pimm_fn.checkpoint.formats.one_file import check_best

__all__ = [
    "KeyRule",
    "WeightsReport",
    "remap_state_dict",
]


def load_weights_file(path: str | os.PathLike) -> dict:
    """Load model weights from any file or checkpoint pimm_fn understands.

    Args:
        path: a state_dict file; a file holding ``{"state_dict": ...}`` or
            ``{"model": ...}`` (pimm, other trainers); a legacy checkpoint; a
            standard checkpoint directory; a model_dir / save_dir (newest); a
            ``.safetensors`` file (one ``python -m pimm_fn export`` wrote, or a
            Hub model's), a sharded Hub model's ``model.safetensors.index.json``,
            or a downloaded Hub model's directory holding either (and no checkpoint).

    Returns:
        The state_dict, on CPU.

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: (a ``ValueError``) a checkpoint directory that is
            damaged, or whose files read differ from the SHA-256 its marker records;
            a best-model file whose bytes differ from the SHA-256 its ``.json`` records;
            a safetensors file that is damaged or crafted, holds a dtype torch lacks,
            or differs from the SHA-256 its header records (``safetensors_files``).
        ValueError: the file is not loadable with ``weights_only=True`` or
            holds no recognizable state_dict.
    """
    p, owner = storage.location(path), None
    if p.is_dir():
        try:
            info = find_checkpoint(p)
        except FileNotFoundError:
            found = safetensors_files.in_directory(p)  # no checkpoint: a downloaded Hub model's weights?
            if found is None:
                raise
            return safetensors_files.read_safetensors(found)
        skipped = info.format == "standard" and (info.path / files.WEIGHTS_SKIPPED).is_file()
        if info.format == "standard":  # a sharded model saved without a weights file is read from its shards
            validation.check_digests(info.path, files.TRAINER if skipped else files.WEIGHTS)
        if skipped:
            return sharded.read_full_weights(info.path)
        p, owner = (info.path / files.WEIGHTS if info.format == "standard" else info.path), info.path
    elif not p.exists():
        raise FileNotFoundError(f"load_weights_file: {str(p)!r} does not exist")
    elif safetensors_files.is_safetensors(p):
        return safetensors_files.read_safetensors(p)
    elif files.is_best_name(p):
        check_best(p)
    content = one_file._load(p, mmap=False, checkpoint=owner)  # a checkpoint's damaged file is a CheckpointError
    if isinstance(content, Mapping) and isinstance(content.get("marker"), Mapping) and "weights" in content:
        return one_file.checked_weights(
            content["weights"], p, p.name
        )  # a legacy checkpoint's: a state_dict, or damaged
    if isinstance(content, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(content.get(key), Mapping):
                return content[key]
        if content and all(isinstance(v, torch.Tensor) for v in content.values()):
            return cast("dict[str, Any]", content)  # torch.load(weights_only=True) makes no Mapping but a dict
    keys = list(content)[:8] if isinstance(content, Mapping) else type(content).__name__
    raise ValueError(
        f"load_weights_file: {str(p)!r} holds no state_dict (got {keys}); expected a dict of tensors or a dict "
        "with a 'state_dict' or 'model' entry"
    )


_MODULE = "module."


@attrs.frozen
class WeightsReport:
    """How a remapped state_dict lines up with the target model's keys.

    Attributes:
        loaded: keys present in both, in the source's order.
        missing: target keys the source does not provide.
        unexpected: source keys (after remapping) the target does not have.

    Example:
        >>> WeightsReport(loaded=("a",), missing=("b",), unexpected=()).summary()
        'loaded 1/2 target keys; 1 missing: b; 0 unexpected'
    """

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]

    @property
    def num_loaded(self) -> int:
        return len(self.loaded)

    @property
    def num_missing(self) -> int:
        return len(self.missing)

    @property
    def num_unexpected(self) -> int:
        return len(self.unexpected)

    @property
    def complete(self) -> bool:
        """True when every key matched (what ``strict=True`` requires)."""
        return not self.missing and not self.unexpected

    def summary(self, limit: int = 5) -> str:
        """One readable line; lists at most ``limit`` keys per group."""

        def group(name: str, keys: tuple[str, ...]) -> str:
            shown = ", ".join(keys[:limit]) + (f", ... (+{len(keys) - limit})" if len(keys) > limit else "")
            return f"{len(keys)} {name}" + (f": {shown}" if keys else "")

        total = self.num_loaded + self.num_missing
        return f"loaded {self.num_loaded}/{total} target keys; {group('missing', self.missing)}; {group('unexpected', self.unexpected)}"


@attrs.frozen
class KeyRule:
    """One rule of :func:`remap_state_dict`: a key that starts with ``old`` gets ``new`` in its place.

    ``{old: new}`` dict entries are such rules with the defaults. A plug-in
    feeds its own rule language to the same engine as ``KeyRule`` values
    (``pimm_fn.compat`` turns pimm's ``CheckpointLoader`` keywords into
    ``KeyRule(keyword, replacement, whole=True, required=False)``).

    Attributes:
        old, new: the prefix and its replacement (``module.`` ignored on both).
        whole: match whole dotted components only: ``backbone`` matches
            ``backbone`` and ``backbone.x``, never ``backbone2.x`` (a trailing
            dot on either side is optional; an empty ``new`` drops the prefix).
        required: a rule that matches no key is an error (a mistyped prefix).

    Example:
        >>> sd, _ = remap_state_dict({"backbone.w": 1, "backbone2.w": 2},
        ...                          [KeyRule("backbone", "encoder", whole=True)], ["encoder.w", "backbone2.w"])
        >>> sorted(sd)
        ['backbone2.w', 'encoder.w']
    """

    old: str = attrs.field(validator=(attrs.validators.instance_of(str), attrs.validators.min_len(1)))
    new: str = attrs.field(validator=attrs.validators.instance_of(str))
    whole: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    required: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def bare(self) -> "KeyRule":
        """This rule without ``module.`` (and, for whole components, without a trailing dot) on either side."""
        old, new = _unwrapped_key(self.old), _unwrapped_key(self.new)
        if self.whole:
            old, new = old.rstrip("."), new.rstrip(".")
        return attrs.evolve(self, old=old, new=new)

    def matches(self, name: str) -> bool:
        """Whether this (bare) rule applies to the bare key ``name``."""
        if self.whole:
            return bool(self.old) and (name == self.old or name.startswith(self.old + "."))
        return name.startswith(self.old)

    def rewrite(self, name: str) -> str:
        """``name`` with this (bare) rule's prefix replaced."""
        rest = name[len(self.old) :]
        if self.whole and not self.new:
            return rest.lstrip(".")
        return self.new + rest


def _unwrapped_key(name: str) -> str:
    return name[len(_MODULE) :] if name.startswith(_MODULE) else name


def remap_state_dict(
    state: Mapping, replacements: Mapping[str, str] | Iterable[KeyRule] | None, target_keys: Iterable[str]
) -> tuple[dict, WeightsReport]:
    """Rewrite a state_dict's keys to fit a target model (warm start).

    Each key first loses a leading ``module.`` (DDP's prefix); then the rule
    with the longest matching prefix, if any, replaces that prefix; finally
    ``module.`` is put back when every target key has it. Rules may be written
    with or without ``module.``. This is the one key-rewrite engine of
    pimm_fn: ``load_weights`` and pimm's ``CheckpointLoader`` both use it.

    Args:
        state: the source state_dict.
        replacements: ``{old_prefix: new_prefix}``, a sequence of
            :class:`KeyRule` values, or ``None`` for none.
        target_keys: the target model's state_dict keys.

    Returns:
        ``(remapped, report)``; pass ``remapped`` to ``load_state_dict``.

    Raises:
        TypeError: ``replacements`` is neither a dict of strings nor a sequence of ``KeyRule``.
        ValueError: a required rule matched no key, two rules conflict, or two keys map to the same name.

    Example:
        >>> sd, report = remap_state_dict({"module.backbone.w": 1, "head.b": 2},
        ...                               {"backbone.": "encoder."}, ["encoder.w", "head.b"])
        >>> sorted(sd), report.num_missing
        (['encoder.w', 'head.b'], 0)
    """
    rules = _normalized_rules(replacements)
    longest_first = sorted(rules.values(), key=lambda pair: len(pair[1].old), reverse=True)
    targets = list(target_keys)
    wrapped = bool(targets) and all(k.startswith(_MODULE) for k in targets)
    out: dict = {}
    origin: dict[str, str] = {}
    used: set[str] = set()
    for key, value in state.items():
        name = _unwrapped_key(key)
        rule = next((bare for _, bare in longest_first if bare.matches(name)), None)
        if rule is not None:
            used.add(rule.old)
            name = rule.rewrite(name)
        name = _MODULE + name if wrapped else name
        if name in out:
            raise ValueError(
                f"remap_state_dict: keys {origin[name]!r} and {key!r} both map to {name!r}; make the rules disjoint"
            )
        out[name], origin[name] = value, key
    unmatched = [given.old for given, bare in rules.values() if bare.required and bare.old not in used]
    if unmatched:
        sample = list(state)[:5]
        raise ValueError(
            f"remap_state_dict: replacement rule(s) {unmatched} matched no key; source keys look like {sample}. "
            "Fix the prefix or drop the rule."
        )
    target_set = set(targets)
    report = WeightsReport(
        loaded=tuple(k for k in out if k in target_set),
        missing=tuple(k for k in targets if k not in out),
        unexpected=tuple(k for k in out if k not in target_set),
    )
    return out, report


def _rules_given(replacements) -> list[KeyRule]:
    """``replacements`` as ``KeyRule`` values, refused with the expected forms when it is neither."""
    if isinstance(replacements, Mapping):
        for old, new in replacements.items():
            if not isinstance(old, str) or not isinstance(new, str) or not old:
                raise TypeError(f"remap_state_dict: rule {old!r}: {new!r} must map a non-empty str to a str")
        return [KeyRule(old, new) for old, new in replacements.items()]
    if isinstance(replacements, (list, tuple)) and all(isinstance(r, KeyRule) for r in replacements):
        return list(replacements)
    raise TypeError(
        "remap_state_dict: 'replacements' must be a dict {old_prefix: new_prefix}, e.g. {'backbone.': 'encoder.'}, "
        f"or a list of KeyRule values (got {type(replacements).__name__}: {replacements!r:.80})"
    )


def _normalized_rules(replacements) -> dict[str, tuple[KeyRule, KeyRule]]:
    """Each rule's bare prefix -> (the rule as given, the rule without ``module.``); conflicting rules refused."""
    if replacements is None:
        return {}
    rules: dict[str, tuple[KeyRule, KeyRule]] = {}
    for given in _rules_given(replacements):
        bare = given.bare()
        if bare.old in rules and rules[bare.old][1] != bare:
            raise ValueError(
                f"remap_state_dict: rules {rules[bare.old][0].old!r} and {given.old!r} conflict "
                f"(same prefix once 'module.' is ignored)"
            )
        rules.setdefault(bare.old, (given, bare))
    return rules
