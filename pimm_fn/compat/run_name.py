"""pimm's ``WandbNamer`` as a pure hook: the run's name, made from config values before anything is logged."""

from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import is_bool

__all__ = ["wandb_namer"]


def _nested(config, path: str):
    """``config["a"]["b"]`` for ``"a.b"``; ``None`` where a part is missing (pimm's ``_get_nested``)."""
    value = config
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        else:
            return None
    return value


def _number(value: float) -> str:
    """pimm's K/M/B formatting: one decimal, trailing zeros stripped."""
    n = float(value)
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= size:
            return f"{n / size:.1f}".rstrip("0").rstrip(".") + suffix
    return str(int(n) if n == int(n) else n)


@attrs.frozen(repr=False)
class _WandbNamer:
    factory_name: ClassVar[str] = "wandb_namer"
    events: ClassVar[tuple] = (ev.ModifyConfig,)
    emits: ClassVar[tuple] = ()
    rank_consistent: ClassVar[bool] = True
    keys: tuple = attrs.field(default=(), converter=tuple)
    sep: str = "-"
    format_numbers: bool = attrs.field(default=True, validator=is_bool)
    extra: tuple = attrs.field(default=(), converter=lambda e: () if e is None else (e,) if isinstance(e, str) else tuple(e))

    def name(self, config: Mapping) -> str | None:
        """The run name for ``config``, or ``None`` when no part exists."""
        parts = []
        for key in self.keys:
            value = _nested(config, key)
            if value is not None:
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                parts.append(_number(value) if self.format_numbers and numeric else str(value))
        parts += list(self.extra)
        return self.sep.join(parts) if parts else None

    def __call__(self, state, event):
        config = state.config
        if "wandb_run_name" in (config.get("_cli_options") or ()):  # named on the command line: kept
            return state, ()
        name = self.name(config)
        return (state, ()) if name is None else (attrs.evolve(state, config=config.set("wandb_run_name", name)), ())

    def __repr__(self):
        args = [f"keys={self.keys!r}"] if self.keys else []
        args += [f"sep={self.sep!r}"] if self.sep != "-" else []
        args += ["format_numbers=False"] if not self.format_numbers else []
        args += [f"extra={self.extra!r}"] if self.extra else []
        return f"wandb_namer({', '.join(args)})"


@hook_factory
def wandb_namer(keys=(), sep: str = "-", format_numbers: bool = True, extra=None):
    """pimm's ``WandbNamer``: name the run from config values, into ``State.config["wandb_run_name"]``.

    At ``ModifyConfig`` (a fresh run, before anything is logged) it joins the
    values of the dotted ``keys`` of ``State.config`` (``loop(training=Training(config=cfg))``;
    missing ones skipped, numbers as ``1.5K``/``2M``/``1B``) and ``extra``
    with ``sep``. A name given on the command line (``wandb_run_name`` among
    ``config["_cli_options"]``, as ``apply_options`` records them) is kept.
    Pure: no W&B needed; a tracker handler reads the name from the config.

    >>> namer = wandb_namer(keys=("model.type", "data.max_len", "seed"), extra="fft")
    >>> namer.name({"model": {"type": "PTv3"}, "data": {"max_len": 1500000}, "seed": 0})
    'PTv3-1.5M-0-fft'
    """
    return _WandbNamer(keys, sep, format_numbers, extra)
