"""pimm's hooks that act on the model, as pure hooks with effects: ``AttentionMaskAnnealingHook``,
``DtypeOverrider``, ``GarbageHandler``, ``ModelHook``.

Each decides from the state alone (the global step, pimm's schedules as pure
functions of it) and requests the work as an effect that
``pimm_fn.compat.HANDLERS`` carries out. The model's state that pimm drives
from hook counters (the annealing step) is a function of the global step
here, so a resumed run sets the same values as the uninterrupted one (pimm
re-derives some of them from counters restarted at 0). pimm's weight decay
hooks: ``pimm_fn.compat.weight_decay``.

pimm's hooks that report on the model as pure hooks: ``GradientNormLogger``, ``ParameterCounter``.

Each asks with an effect of ``pimm_fn.compat.effects`` (the gradients and
parameters are the handlers' to read, ``pimm_fn.compat.HANDLERS``), which
logs the figures as ``Log`` records. The gradient norm's cadence is in
global steps, the same after a resume (pimm's counts its own calls,
restarting at 0).
"""

from collections.abc import Iterable
from typing import ClassVar

import attrs

from pimm_fn.compat.effects import AnnealAttention, CollectGarbage, CountParameters, LogGradientNorm, OverrideDtype
from pimm_fn.compat.hookbase import _METHODS, TrainerView, _call, _effects
from pimm_fn.core import events as ev
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, non_empty_str, number, one_of

__all__ = [
    "attention_mask_annealing",
    "dtype_overrider",
    "DTYPES",
    "garbage_handler",
    "pimm_model_hook",
    "gradient_norm_logger",
    "parameter_counter",
]


DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32")  # pimm's DtypeOverrider names


@attrs.frozen(repr=False)
class _AttentionMaskAnnealing:
    factory_name: ClassVar[str] = "attention_mask_annealing"
    events: ClassVar[tuple] = (ev.BeforeTrain, ev.AfterStep)
    emits: ClassVar[tuple] = (AnnealAttention,)
    rank_consistent: ClassVar[bool] = True
    reads_outputs: ClassVar[bool] = False
    log_frequency: int = attrs.field(default=100, validator=int_at_least(1))
    log_per_layer: bool = attrs.field(default=False, validator=is_bool)
    prefix: str = attrs.field(default="anneal", validator=non_empty_str)

    def __call__(self, state, event):
        step = state.progress.global_step
        log = isinstance(event, ev.AfterStep) and step % self.log_frequency == 0
        return state, (AnnealAttention(step, log, self.log_per_layer, self.prefix),)

    def __repr__(self):
        args = [f"log_frequency={self.log_frequency}"] if self.log_frequency != 100 else []
        args += ["log_per_layer=True"] if self.log_per_layer else []
        args += [f"prefix={self.prefix!r}"] if self.prefix != "anneal" else []
        return f"attention_mask_annealing({', '.join(args)})"


@hook_factory
def attention_mask_annealing(
    log_frequency: int = 100, log_per_layer: bool = False, prefix: str = "anneal"
) -> _AttentionMaskAnnealing:
    """pimm's ``AttentionMaskAnnealingHook``: the model's annealing follows the global step.

    Before training (fresh or resumed) and after every step the handler calls
    ``model.update_anneal_step(global_step)`` when the model has it; every
    ``log_frequency`` steps it logs the mean ``get_anneal_factor()`` of
    ``model.decoder.blocks`` as ``<prefix>/average`` (and per layer).

    Emits:
        ``AnnealAttention(step, log, per_layer, prefix)`` (each rank).

    >>> attention_mask_annealing(log_frequency=10)
    attention_mask_annealing(log_frequency=10)
    """
    return _AttentionMaskAnnealing(log_frequency, log_per_layer, prefix)


@attrs.frozen(repr=False)
class _DtypeOverrider:
    factory_name: ClassVar[str] = "dtype_overrider"
    events: ClassVar[tuple] = (ev.BeforeTrain,)
    emits: ClassVar[tuple] = (OverrideDtype,)
    rank_consistent: ClassVar[bool] = True
    patterns: tuple = attrs.field(default=(), converter=lambda v: tuple(v or ()))
    class_patterns: tuple = attrs.field(default=(), converter=lambda v: tuple(v or ()))
    dtype: str = attrs.field(default="float32", validator=one_of(*DTYPES))
    methods_to_override: tuple = attrs.field(default=("forward",), converter=lambda v: tuple(v or ("forward",)))
    override_parameters: bool = attrs.field(default=False, validator=is_bool)
    verbose: bool = attrs.field(default=False, validator=is_bool)

    def __call__(self, state, event):
        return state, (
            OverrideDtype(
                self.patterns,
                self.class_patterns,
                self.dtype,
                self.methods_to_override,
                self.override_parameters,
                self.verbose,
            ),
        )

    def __repr__(self):
        defaults = {
            "patterns": (),
            "class_patterns": (),
            "dtype": "float32",
            "methods_to_override": ("forward",),
            "override_parameters": False,
            "verbose": False,
        }
        args = [f"{k}={getattr(self, k)!r}" for k, v in defaults.items() if getattr(self, k) != v]
        return f"dtype_overrider({', '.join(args)})"


@hook_factory
def dtype_overrider(
    patterns: Iterable[str] | None = None,
    class_patterns: Iterable[str] | None = None,
    dtype: str = "float32",
    methods_to_override: Iterable[str] | None = None,
    override_parameters: bool = False,
    verbose: bool = False,
) -> _DtypeOverrider:
    """pimm's ``DtypeOverrider``: run matched modules in ``dtype`` (LayerNorm in float32 under bf16, say).

    A module matches when ``re.search`` finds one of ``patterns`` in its
    dotted name or one of ``class_patterns`` in its class name. The handler
    wraps its ``methods_to_override`` to cast the first tensor argument to
    ``dtype`` and the outputs back, once per module, and with
    ``override_parameters`` casts its own parameters in place. Runs at every
    ``BeforeTrain``, so a resumed run's model is overridden as the original's.

    Emits:
        ``OverrideDtype(...)`` at ``BeforeTrain`` (each rank).

    >>> dtype_overrider(class_patterns=["LayerNorm"], override_parameters=True)
    dtype_overrider(class_patterns=('LayerNorm',), override_parameters=True)
    """
    return _DtypeOverrider(patterns, class_patterns, dtype, methods_to_override, override_parameters, verbose)


@attrs.frozen(repr=False)
class _GarbageHandler:
    factory_name: ClassVar[str] = "garbage_handler"
    events: ClassVar[tuple] = (ev.BeforeTrain, ev.AfterStep, ev.AfterTrain)
    emits: ClassVar[tuple] = (CollectGarbage,)
    rank_consistent: ClassVar[bool] = True
    reads_outputs: ClassVar[bool] = False
    interval: int = attrs.field(default=150, validator=int_at_least(1))
    disable_auto: bool = attrs.field(default=True, validator=is_bool)
    empty_cache: bool = attrs.field(default=False, validator=is_bool)

    def __call__(self, state, event):
        step = state.progress.global_step
        match event:
            case ev.BeforeTrain() if self.disable_auto:
                return state, (CollectGarbage(step, collect=False, automatic=False),)
            case ev.AfterStep() if state.progress.iter_in_epoch % self.interval == 0:  # pimm counts per epoch
                return state, (CollectGarbage(step, empty_cache=self.empty_cache),)
            case ev.AfterTrain():
                return state, (CollectGarbage(step, empty_cache=True, automatic=True if self.disable_auto else None),)
        return state, ()

    def __repr__(self):
        args = [f"interval={self.interval}"] if self.interval != 150 else []
        args += ["disable_auto=False"] if not self.disable_auto else []
        args += ["empty_cache=True"] if self.empty_cache else []
        return f"garbage_handler({', '.join(args)})"


@hook_factory
def garbage_handler(interval: int = 150, disable_auto: bool = True, empty_cache: bool = False) -> _GarbageHandler:
    """pimm's ``GarbageHandler``: collect garbage every ``interval`` steps of each epoch, and after training.

    ``disable_auto`` turns Python's automatic collection off before training;
    unlike pimm, it is turned back on after training.

    Emits:
        ``CollectGarbage(step, empty_cache, automatic)`` (each rank).

    >>> garbage_handler(interval=50)
    garbage_handler(interval=50)
    """
    return _GarbageHandler(interval, disable_auto, empty_cache)


class _BoundPimmModelHook:
    """A model taking part through pimm's hook methods, called with a ``TrainerView`` (not ``modify_config``)."""

    hook_key = "pimm_model_hook()"

    def __init__(self, model):
        self.model = model

    @property
    def events(self) -> tuple | None:
        """Every event for a model with ``on_event``; else the events of the pimm methods it has (quiet steps stay quiet)."""
        if callable(getattr(self.model, "on_event", None)):
            return None
        return tuple(
            cls
            for cls, name in _METHODS.items()
            if name != "modify_config" and callable(getattr(self.model, name, None))
        )

    def __call__(self, state, event):
        on_event = getattr(self.model, "on_event", None)
        if callable(on_event):  # pimm_fn's own model protocol
            result = on_event(state, event)
            return (state, ()) if result is None else result
        name = _METHODS.get(type(event))
        method = getattr(self.model, name, None) if name and name != "modify_config" else None
        if not callable(method):
            return state, ()
        return state, _effects(_call(self.model, method, TrainerView.of(state, event)), self.model, name)

    def __repr__(self):
        return "pimm_model_hook()"


@attrs.frozen(repr=False)
class _PimmModelHook:
    factory_name: ClassVar[str] = "pimm_model_hook"

    def __call__(self, state, event):
        return state, ()

    def bind(self, model) -> _BoundPimmModelHook:
        return _BoundPimmModelHook(model)

    def __repr__(self):
        return "pimm_model_hook()"


@hook_factory
def pimm_model_hook() -> _PimmModelHook:
    """pimm's ``ModelHook``: the model takes part in the loop through its own hook methods.

    ``loop`` binds it to the model (unwrapped from DDP). A model with
    ``on_event`` takes part as with ``pimm_fn.model_hook()``; one with
    pimm's methods (``before_train`` ... ``after_train``) has them called at
    their events with ``self.trainer`` a read-only ``TrainerView``, returning
    ``None`` or effects (``modify_config`` is not forwarded, as in pimm).
    In ``plan`` there is no model: it emits nothing.

    >>> pimm_model_hook()
    pimm_model_hook()
    """
    return _PimmModelHook()


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
def gradient_norm_logger(
    norm_type: float = 2.0, log_per_layer: bool = False, log_frequency: int = 1, prefix: str = "grad_norm"
) -> _GradientNormLogger:
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
def parameter_counter(
    show_details: bool = True, show_gradients: bool = True, sort_by_params: bool = True, min_params: int = 0
) -> _ParameterCounter:
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
