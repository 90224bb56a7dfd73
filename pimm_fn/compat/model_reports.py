"""pimm's hooks that report on the model as pure hooks: ``GradientNormLogger``, ``ParameterCounter``.

Each asks with an effect of ``pimm_fn.compat.effects`` (the gradients and
parameters are the handlers' to read, ``pimm_fn.compat.HANDLERS``), which
logs the figures as ``Log`` records. The gradient norm's cadence is in
global steps, the same after a resume (pimm's counts its own calls,
restarting at 0).
"""

from typing import ClassVar

import attrs

from pimm_fn.compat.effects import CountParameters, LogGradientNorm
from pimm_fn.core import events as ev
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, non_empty_str, number

__all__ = ["gradient_norm_logger", "parameter_counter"]


def _norm_type(instance, attribute, value):
    if value != float("inf"):
        number(above=0).check(value, "norm_type", owner="gradient_norm_logger")


@attrs.frozen(repr=False)
class _GradientNormLogger:
    factory_name: ClassVar[str] = "gradient_norm_logger"
    events: ClassVar[tuple] = (ev.AfterStep,)
    emits: ClassVar[tuple] = (LogGradientNorm,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    reads_outputs: ClassVar[bool] = False  # the handler reads the gradients, not the step's outputs
    norm_type: float = attrs.field(default=2.0, validator=_norm_type)
    log_per_layer: bool = attrs.field(default=False, validator=is_bool)
    log_frequency: int = attrs.field(default=1, validator=int_at_least(1))
    prefix: str = attrs.field(default="grad_norm", validator=non_empty_str)

    @property
    def every(self) -> int:
        return self.log_frequency

    def __call__(self, state, event):
        return state, (LogGradientNorm(event.step, float(self.norm_type), self.log_per_layer, self.prefix),)

    def __repr__(self):
        args = [f"norm_type={self.norm_type!r}"] if self.norm_type != 2.0 else []
        args += ["log_per_layer=True"] if self.log_per_layer else []
        args += [f"log_frequency={self.log_frequency}"] if self.log_frequency != 1 else []
        args += [f"prefix={self.prefix!r}"] if self.prefix != "grad_norm" else []
        return f"gradient_norm_logger({', '.join(args)})"


@hook_factory
def gradient_norm_logger(norm_type: float = 2.0, log_per_layer: bool = False, log_frequency: int = 1,
                         prefix: str = "grad_norm"):
    """pimm's ``GradientNormLogger``: the gradients' norm every ``log_frequency`` global steps.

    Emits:
        ``LogGradientNorm(step, norm_type, per_layer, prefix)`` (main rank);
        the handler logs ``Log(step, "grad_norm", {"<prefix>/total": ...,
        "<prefix>/layers/<name>": ...})`` from the gradients the step left
        (after clipping; with ``inf``, the largest absolute value).

    >>> gradient_norm_logger(log_frequency=10)
    gradient_norm_logger(log_frequency=10)
    """
    return _GradientNormLogger(norm_type, log_per_layer, log_frequency, prefix)


@attrs.frozen(repr=False)
class _ParameterCounter:
    factory_name: ClassVar[str] = "parameter_counter"
    events: ClassVar[tuple] = (ev.BeforeTrain,)
    emits: ClassVar[tuple] = (CountParameters,)
    rank_consistent: ClassVar[bool] = True
    show_details: bool = attrs.field(default=True, validator=is_bool)
    show_gradients: bool = attrs.field(default=True, validator=is_bool)
    sort_by_params: bool = attrs.field(default=True, validator=is_bool)
    min_params: int = attrs.field(default=0, validator=int_at_least(0))

    def __call__(self, state, event):
        return state, (CountParameters(self.show_details, self.show_gradients, self.sort_by_params, self.min_params),)

    def __repr__(self):
        defaults = {"show_details": True, "show_gradients": True, "sort_by_params": True, "min_params": 0}
        args = [f"{k}={getattr(self, k)!r}" for k, v in defaults.items() if getattr(self, k) != v]
        return f"parameter_counter({', '.join(args)})"


@hook_factory
def parameter_counter(show_details: bool = True, show_gradients: bool = True, sort_by_params: bool = True,
                      min_params: int = 0):
    """pimm's ``ParameterCounter``: log the model's parameter counts before training.

    Emits:
        ``CountParameters(...)`` at ``BeforeTrain`` (main rank); the handler
        logs ``Log(step, "parameters", {total, trainable, non_trainable, memory_mb})``
        and, with ``show_details``, one ``"parameters/module"`` record per
        module of at least ``min_params`` parameters.

    >>> parameter_counter(show_gradients=False, min_params=1)
    parameter_counter(show_gradients=False, min_params=1)
    """
    return _ParameterCounter(show_details, show_gradients, sort_by_params, min_params)
