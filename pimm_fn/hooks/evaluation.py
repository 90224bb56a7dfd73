"""A hook that requests evaluations on a step or epoch cadence."""

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, is_callable, non_empty_str, refused_call

__all__ = ["evaluate_every", "evaluator_name", "Evaluator"]

Evaluator = Callable[[Any], Mapping[str, float] | float | None]
"""``fn(model)``: the metrics by name, one number (published under the evaluator's name), or ``None``."""


def evaluator_name(fn) -> str:
    """A stable name for an evaluator callable: the ``evaluator_name`` it declares
    (``pimm_fn.loader_evaluator(..., name=)``), a function's qualified name, or its class's."""
    declared = getattr(fn, "evaluator_name", None)
    if isinstance(declared, str) and declared:
        return declared
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _takes_the_model(instance, attribute, fn) -> None:
    """An evaluator is called as ``fn(model)``: one taking ``(model, loader)`` is refused now, not at step 5000."""
    is_callable(instance, attribute, fn)
    signature = refused_call(fn, None)
    if signature is not None:
        raise TypeError(
            f"evaluate_every: the evaluator {evaluator_name(fn)}{signature} cannot be called as fn(model): the loop "
            f"passes the model alone. Bind the rest first (functools.partial(fn, loader=val_loader)), or let the "
            f"loop iterate the loader: pimm_fn.loader_evaluator(val_loader, metric_fn)"
        )


@attrs.frozen(repr=False)
class _EvaluateEvery:
    factory_name: ClassVar[str] = "evaluate_every"
    emits: ClassVar[tuple] = (Evaluate,)
    rank_consistent: ClassVar[bool] = True  # decides from the global step or epoch alone
    n: int = attrs.field(validator=int_at_least(0))
    fn: Any = attrs.field(validator=_takes_the_model)
    name: str = attrs.field(validator=non_empty_str)
    broadcast: bool = attrs.field(default=True, validator=is_bool)
    weights: str | None = attrs.field(default=None, validator=attrs.validators.optional(non_empty_str))

    duplicate_fix: ClassVar[str] = "give each its own name: evaluate_every(n, fn, name='...')"

    @property
    def events(self) -> tuple:
        """``AfterStep`` on a step cadence, ``AfterEpoch`` for ``n=0``."""
        return (ev.AfterStep,) if self.n else (ev.AfterEpoch,)

    @property
    def every(self) -> int:
        """Called for ``AfterStep(step)`` only when ``step % n == 0`` (the fold enforces it)."""
        return self.n or 1

    def evaluators(self) -> dict:
        """The callables the interpreter may run for this hook's ``Evaluate``."""
        return {self.name: self.fn}

    def with_evaluator(self, name: str, fn) -> "_EvaluateEvery":
        """This hook with ``fn`` as its evaluator (same cadence, name and broadcast)."""
        if name != self.name:
            raise ValueError(f"evaluate_every provides evaluator {self.name!r}, not {name!r}")
        return attrs.evolve(self, fn=fn)

    def update(self, slot, state, event):
        """The hook protocol's ``update``: it keeps no slot, so the fold builds no ``State`` to hand it one."""
        match event:
            case ev.AfterStep(step=step) if self.n:
                return slot, state, (Evaluate(self.name, step, self.broadcast, self.weights),)
            case ev.AfterEpoch() if not self.n:
                return slot, state, (Evaluate(self.name, state.progress.global_step, self.broadcast, self.weights),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        fn_name = evaluator_name(self.fn)
        extra = "" if self.name == fn_name else f", name={self.name!r}"
        extra += "" if self.broadcast else ", broadcast=False"
        extra += "" if self.weights is None else f", weights={self.weights!r}"
        return f"evaluate_every({self.n}, {fn_name}{extra})"


@hook_factory
def evaluate_every(
    n: int,
    fn: Evaluator,
    *,
    name: str | None = None,
    broadcast: bool = True,
    weights: str | None = None,
) -> _EvaluateEvery:
    """Evaluate the model every ``n`` global steps (``n=0``: at each epoch's end).

    The interpreter calls ``fn(model)`` on every rank (evaluation is
    collective, so ``fn`` may shard the validation set and all-reduce). It
    returns a mapping of metric names to numbers, a bare number (published
    as ``name``), or ``None`` on a rank that computed nothing; a name a log
    record holds itself (``step``, ``kind``, ``epoch``, ...:
    ``pimm_fn.core.effects``) is refused with a ``ValueError``. The results
    reach the hooks as ``MetricsPublished``. With ``broadcast`` (default) the
    main rank's result is sent to every rank; with ``broadcast=False`` each
    rank keeps its own and nothing collective may depend on it.

    ``fn`` must be callable as ``fn(model)``: one needing more (``(model,
    loader)``) is refused here with the fix. To have the loop iterate a
    validation DataLoader (eval mode, one shard per rank, sums reduced
    once), pass ``pimm_fn.loader_evaluator(val_loader, metric_fn, name="val")``:
    it names itself, and its metrics are ``"val/<metric>"``. Two evaluators
    need two names (``name=``); two sharing one are refused, saying so.

    A save at an evaluation step runs after the evaluation, wherever the
    saver stands, and records its result.

    The loop runs ``fn`` with the model in eval mode under
    ``torch.inference_mode()`` and puts every module's training flag back
    afterwards, whatever ``fn`` did or raised. With ``weights="ema"`` the
    moving average kept by ``pimm_fn.ema()`` is swapped into the model for
    the call (and swapped back after), and ``best_on`` writes those weights.

    Args:
        n: steps between evaluations (>= 1), or 0 for once per epoch.
        fn: ``fn(model) -> Mapping[str, float] | float | None``; a module-level
            function or a picklable callable object.
        name: the evaluator's name in effects and logs (default: ``fn``'s
            declared ``evaluator_name``, else its qualified name).
        broadcast: publish the main rank's result on every rank.
        weights: the name of an ``ema(...)`` average to evaluate instead of
            the model's own weights (default ``None``: the model's own).

    Emits:
        ``Evaluate(name, step, broadcast, weights)`` (collective).

    >>> def accuracy(model): return {"acc": 1.0}
    >>> evaluate_every(200, accuracy)
    evaluate_every(200, accuracy)
    >>> def validate(model, loader): ...
    >>> evaluate_every(200, validate)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: evaluate_every: the evaluator validate(model, loader) cannot be called as fn(model): ...
    """
    return _EvaluateEvery(n, fn, name if name is not None else evaluator_name(fn), broadcast, weights)
