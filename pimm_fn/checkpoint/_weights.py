"""Model weights on their own: the best-model file, warm starts, key remapping."""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Iterable, Mapping

import attrs
import torch

from . import _layout as L
from . import _legacy, dist
from ._discovery import find_checkpoint
from .errors import storage_errors, tensor_bytes

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


def remap_state_dict(
    state: Mapping, replacements: Mapping[str, str] | None, target_keys: Iterable[str]
) -> tuple[dict, WeightsReport]:
    """Rewrite a state_dict's keys to fit a target model (warm start).

    Each key first loses a leading ``module.`` (DDP's prefix); then the rule
    with the longest matching prefix, if any, replaces that prefix; finally
    ``module.`` is put back when every target key has it. Rules may be written
    with or without ``module.``.

    Args:
        state: the source state_dict.
        replacements: ``{old_prefix: new_prefix}``, or ``None`` for none.
        target_keys: the target model's state_dict keys.

    Returns:
        ``(remapped, report)``; pass ``remapped`` to ``load_state_dict``.

    Raises:
        TypeError: ``replacements`` is not a dict of strings.
        ValueError: a rule matched no key, or two keys map to the same name.

    Example:
        >>> sd, report = remap_state_dict({"module.backbone.w": 1, "head.b": 2},
        ...                               {"backbone.": "encoder."}, ["encoder.w", "head.b"])
        >>> sorted(sd), report.num_missing
        (['encoder.w', 'head.b'], 0)
    """
    rules = _normalized_rules(replacements)
    targets = list(target_keys)
    wrapped = bool(targets) and all(k.startswith(_MODULE) for k in targets)
    out: dict = {}
    origin: dict[str, str] = {}
    used: set[str] = set()
    for key, value in state.items():
        name = key[len(_MODULE):] if key.startswith(_MODULE) else key
        matches = [prefix for prefix in rules if name.startswith(prefix)]
        if matches:
            prefix = max(matches, key=len)
            used.add(prefix)
            name = rules[prefix][1] + name[len(prefix):]
        name = _MODULE + name if wrapped else name
        if name in out:
            raise ValueError(f"remap_state_dict: keys {origin[name]!r} and {key!r} both map to {name!r}; make the rules disjoint")
        out[name], origin[name] = value, key
    unmatched = [rules[p][0] for p in rules if p not in used]
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


def _normalized_rules(replacements) -> dict[str, tuple[str, str]]:
    """Map a rule's prefix without ``module.`` to (original prefix, new prefix)."""
    if replacements is None:
        return {}
    if not isinstance(replacements, Mapping):
        raise TypeError(
            "remap_state_dict: 'replacements' must be a dict {old_prefix: new_prefix}, e.g. {'backbone.': 'encoder.'} "
            f"(got {type(replacements).__name__}: {replacements!r:.80})"
        )
    rules: dict[str, tuple[str, str]] = {}
    for old, new in replacements.items():
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise TypeError(f"remap_state_dict: rule {old!r}: {new!r} must map a non-empty str to a str")
        bare_old = old[len(_MODULE):] if old.startswith(_MODULE) else old
        bare_new = new[len(_MODULE):] if new.startswith(_MODULE) else new
        if bare_old in rules and rules[bare_old][1] != bare_new:
            raise ValueError(f"remap_state_dict: rules {rules[bare_old][0]!r} and {old!r} conflict (same prefix once 'module.' is ignored)")
        rules[bare_old] = (old, bare_new)
    return rules


def write_best(
    model_dir: str | os.PathLike, weights: dict, *, metric: str, value: float, step: int, per_metric: bool = False
) -> pathlib.Path:
    """Atomically write ``model_best.pth`` and ``model_best.json`` (main rank only).

    With ``per_metric`` the files are ``model_best_<metric>.pth`` and
    ``.json``, so runs tracking several metrics keep one best model each.

    Both files are written in full under temporary names first, then
    replaced, the weights file first; each replace is atomic. A write that
    fails (a full disk) leaves the previous best files as they were.

    Args:
        model_dir: the checkpoint root.
        weights: the model state_dict.
        metric: the metric's name, e.g. ``"mIoU"``.
        value: its finite value.
        step: the global step the weights come from.
        per_metric: name the files after ``metric``.

    Returns:
        The path of the weights file written.

    Raises:
        RuntimeError: called on a rank other than 0.
        ValueError: a bad ``metric``, ``value`` or ``step``.
        DiskFullError: the disk filled up; the previous best files are intact.
    """
    if not dist.is_main():
        raise RuntimeError(f"write_best must run on the main rank only (called on rank {dist.rank()}); guard it with dist.is_main()")
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"write_best: 'metric' must be a non-empty str (got {metric!r})")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"write_best: 'value' must be a finite number (got {value!r}); a NaN metric never improves")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"write_best: 'step' must be an int >= 0 (got {step!r})")
    root = pathlib.Path(model_dir)
    stem = L.best_stem(metric if per_metric else None)
    meta = json.dumps({"metric": metric, "value": float(value), "step": step}, sort_keys=True).encode()
    files = {root / f"{stem}.pth": lambda f: torch.save(weights, f), root / f"{stem}.json": lambda f: f.write(meta)}
    nbytes = lambda: tensor_bytes(weights) + len(meta)
    with storage_errors(root, nbytes, f"{stem}.pth and {stem}.json", f"the previous {stem} is intact"):
        staged = _stage_all(root, files)
    for tmp, path in zip(staged, files):
        os.replace(tmp, path)
    L.fsync_dir(root)
    return root / f"{stem}.pth"


def _stage_all(root: pathlib.Path, files: dict) -> list[pathlib.Path]:
    """Write each file durably under a ``.staging-*`` name (mode by the umask); on failure remove them all (the old files stay)."""
    staged: list[pathlib.Path] = []
    try:
        for path, write in files.items():
            staged.append(L.staged_write(path, write))
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    return staged


def load_weights_file(path: str | os.PathLike) -> dict:
    """Load model weights from any file or checkpoint pimm_fn understands.

    Args:
        path: a state_dict file; a file holding ``{"state_dict": ...}`` or
            ``{"model": ...}`` (pimm, other trainers); a legacy checkpoint; a
            standard checkpoint directory; or a model_dir / save_dir (newest).

    Returns:
        The state_dict, on CPU.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: the file is not loadable with ``weights_only=True`` or
            holds no recognizable state_dict.
    """
    p, owner = pathlib.Path(path), None
    if p.is_dir():
        info = find_checkpoint(p)
        if info.format == "standard" and (info.path / L.WEIGHTS_SKIPPED).is_file():
            from .sharded import read_full_weights  # a sharded model saved without a weights file

            return read_full_weights(info.path)
        p, owner = (info.path / L.WEIGHTS if info.format == "standard" else info.path), info.path
    elif not p.exists():
        raise FileNotFoundError(f"load_weights_file: {str(p)!r} does not exist")
    content = _legacy._load(p, mmap=False, checkpoint=owner)  # a checkpoint's damaged file is a CheckpointError
    if isinstance(content, Mapping) and isinstance(content.get("marker"), Mapping) and "weights" in content:
        return content["weights"]
    if isinstance(content, Mapping):
        for key in ("state_dict", "model"):
            if isinstance(content.get(key), Mapping):
                return content[key]
        if content and all(isinstance(v, torch.Tensor) for v in content.values()):
            return content
    keys = list(content)[:8] if isinstance(content, Mapping) else type(content).__name__
    raise ValueError(
        f"load_weights_file: {str(p)!r} holds no state_dict (got {keys}); expected a dict of tensors or a dict "
        "with a 'state_dict' or 'model' entry"
    )
