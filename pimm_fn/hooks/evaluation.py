"""A hook that requests evaluations on a step or epoch cadence."""

from typing import Any, ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.hook import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, is_callable, non_empty_str

__all__ = ["evaluate_every", "evaluator_name"]


def evaluator_name(fn) -> str:
    """A stable name for an evaluator callable (function or callable object)."""
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


@attrs.frozen(repr=False)
class _EvaluateEvery:
    factory_name: ClassVar[str] = "evaluate_every"
    emits: ClassVar[tuple] = (Evaluate,)
    rank_consistent: ClassVar[bool] = True  # decides from the global step or epoch alone
    n: int = attrs.field(validator=int_at_least(0))
    fn: Any = attrs.field(validator=is_callable)
    name: str = attrs.field(validator=non_empty_str)
    broadcast: bool = attrs.field(default=True, validator=is_bool)
    weights: str | None = attrs.field(default=None, validator=attrs.validators.optional(non_empty_str))

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

    def __call__(self, state, event):
        match event:
            case ev.AfterStep(step=step) if self.n:
                return state, (Evaluate(self.name, step, self.broadcast, self.weights),)
            case ev.AfterEpoch() if not self.n:
                return state, (Evaluate(self.name, state.progress.global_step, self.broadcast, self.weights),)
        return state, ()

    def __repr__(self):
        fn_name = evaluator_name(self.fn)
        extra = "" if self.name == fn_name else f", name={self.name!r}"
        extra += "" if self.broadcast else ", broadcast=False"
        extra += "" if self.weights is None else f", weights={self.weights!r}"
        return f"evaluate_every({self.n}, {fn_name}{extra})"


@hook_factory
def evaluate_every(n: int, fn, *, name: str | None = None, broadcast: bool = True, weights: str | None = None):
    """Evaluate the model every ``n`` global steps (``n=0``: at each epoch's end).

    The interpreter calls ``fn(model)`` on every rank (evaluation is
    collective, so ``fn`` may shard the validation set and all-reduce). It
    returns a mapping of metric names to numbers, a bare number (published
    as ``name``), or ``None`` on a rank that computed nothing; a name a log
    record holds itself (``step``, ``kind``, ``epoch``, ...:
    ``pimm_fn.core.records``) is refused with a ``ValueError``. The results
    reach the hooks as ``MetricsPublished``. With ``broadcast`` (default) the
    main rank's result is sent to every rank; with ``broadcast=False`` each
    rank keeps its own and nothing collective may depend on it.

    Put evaluators before savers in the hook list, so a save at an
    evaluation step runs after the evaluation and records its result.

    The loop runs ``fn`` with the model in eval mode under
    ``torch.inference_mode()`` and puts every module's training flag back
    afterwards, whatever ``fn`` did or raised. With ``weights="ema"`` the
    moving average kept by ``pimm_fn.ema()`` is swapped into the model for
    the call (and swapped back after), and ``best_on`` writes those weights.

    Args:
        n: steps between evaluations (>= 1), or 0 for once per epoch.
        fn: ``fn(model) -> Mapping[str, float] | float | None``; a module-level
            function or a picklable callable object.
        name: the evaluator's name in effects and logs (default: ``fn``'s name).
        broadcast: publish the main rank's result on every rank.
        weights: the name of an ``ema(...)`` average to evaluate instead of
            the model's own weights (default ``None``: the model's own).

    Emits:
        ``Evaluate(name, step, broadcast, weights)`` (collective).

    >>> def accuracy(model): return {"acc": 1.0}
    >>> evaluate_every(200, accuracy)
    evaluate_every(200, accuracy)
    """
    return _EvaluateEvery(n, fn, name if name is not None else evaluator_name(fn), broadcast, weights)
