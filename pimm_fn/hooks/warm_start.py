"""The warm-start hook: ``load_weights``, the model's weights from a file before a fresh run trains.

It only asks: the ``LoadWeights`` effect it emits is carried out by the
runtime (key remapping in ``pimm_fn.checkpoint.warm_start``).
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import LoadWeights
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import PathLike, is_bool, non_empty_str

__all__ = ["load_weights"]


def _replacement_pairs(replacements) -> tuple:
    if replacements is None:
        return ()
    if not isinstance(replacements, dict):
        raise TypeError(
            f"load_weights: 'replacements' must be a dict of {{old_prefix: new_prefix}} "
            f"(got {type(replacements).__name__}: {replacements!r:.80})"
        )
    for old, new in replacements.items():
        if not isinstance(old, str) or not isinstance(new, str):
            raise TypeError(
                f"load_weights: 'replacements' must map str prefixes to str prefixes (got {old!r}: {new!r})"
            )
    return tuple(replacements.items())


@attrs.frozen(repr=False)
class _LoadWeights:
    factory_name: ClassVar[str] = "load_weights"
    events: ClassVar[tuple] = (ev.BeforeTrain,)
    emits: ClassVar[tuple] = (LoadWeights,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    path: str = attrs.field(validator=non_empty_str)
    replacements: tuple = ()
    strict: bool = attrs.field(default=False, validator=is_bool)

    def __call__(self, state, event):
        if event.resumed:
            return state, ()  # a resume restores the weights it saved
        return state, (LoadWeights(self.path, self.replacements, self.strict),)

    def __repr__(self):
        extra = f", replacements={dict(self.replacements)!r}" if self.replacements else ""
        extra += ", strict=True" if self.strict else ""
        return f"load_weights({self.path!r}{extra})"


@hook_factory
def load_weights(path: str | PathLike, *, replacements: dict | None = None, strict: bool = False) -> _LoadWeights:
    """Warm-start the model from a weights file before a fresh run trains.

    ``path`` is anything ``pimm_fn.checkpoint.load_weights_file`` reads: a
    state_dict file, a checkpoint, save_dir or best model (their recorded
    digests checked), a ``.safetensors`` file (exported by pimm_fn, or a
    Hub model's) or a sharded Hub model's ``model.safetensors.index.json``.
    Keys are rewritten by ``replacements`` (prefix rules, longest match wins;
    ``module.`` prefixes are handled). The report counts loaded, missing and
    unexpected keys; a rule that matched nothing is an error.

    Emits:
        ``LoadWeights(path, replacements, strict)`` at ``BeforeTrain`` of a
        fresh run (each rank loads its own replica).

    >>> load_weights("pretrained.pth", replacements={"backbone.": "encoder."})
    load_weights('pretrained.pth', replacements={'backbone.': 'encoder.'})
    >>> load_weights("w.pth", replacements=[("a", "b")])
    Traceback (most recent call last):
    TypeError: load_weights: 'replacements' must be a dict of {old_prefix: new_prefix} (got list: [('a', 'b')])
    """
    name = path.__fspath__() if isinstance(path, PathLike) else path
    return _LoadWeights(name, _replacement_pairs(replacements), strict)
