"""pimm's ``CheckpointLoader`` as a pure hook: a fresh run warm-started from a weights file, with pimm's key rules.

It asks with ``LoadPimmWeights`` (a ``LoadWeights`` in pimm's dialect),
carried out by ``pimm_fn.compat.HANDLERS``; a resumed run loads nothing.
"""

from typing import ClassVar

import attrs

from pimm_fn.compat.effects import LoadPimmWeights
from pimm_fn.core import events as ev
from pimm_fn.core.effects import LoadWeights
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import is_bool, non_empty_str, optional

__all__ = ["checkpoint_loader"]


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
def checkpoint_loader(weight: str | None = None, *, keywords: str = "", replacement: str | None = None,
                      replacements: dict | None = None, strict: bool = False):
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
        raise ValueError(f"weight {weight!r}: download Hub weights first (huggingface_hub.hf_hub_download) and pass "
                         f"the local file; the loop reads local files only")
    if replacements is not None:
        if not isinstance(replacements, dict):
            raise TypeError(
                f"CheckpointLoader.replacements must be a {{keyword: replacement}} dict, got {type(replacements).__name__}"
            )
        return _CheckpointLoader(weight, tuple(replacements.items()), strict, "replacements")
    return _CheckpointLoader(weight, ((keywords, keywords if replacement is None else replacement),), strict)
