"""A hook that keeps an exponential moving average (EMA) of the model's weights."""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import UpdateEma
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, non_empty_str, number

__all__ = ["ema"]


@attrs.frozen(repr=False)
class _Ema:
    factory_name: ClassVar[str] = "ema"
    events: ClassVar[tuple] = (ev.AfterStep,)
    reads_outputs: ClassVar[bool] = False  # averages the weights: the step's outputs stay on the device
    emits: ClassVar[tuple] = (UpdateEma,)
    rank_consistent: ClassVar[bool] = True  # decides from the global step alone
    decay: float = attrs.field(
        converter=lambda v: float(v) if isinstance(v, int) and not isinstance(v, bool) else v,
        validator=number(at_least=0, below=1).with_hint("0.999 is usual"),
    )
    every: int = attrs.field(default=1, validator=int_at_least(1))
    name: str = attrs.field(default="ema", validator=non_empty_str)

    def averages(self) -> dict:
        """The average the runtime keeps for this hook (``pimm_fn.runtime.handlers.ema.EmaWeights``), by name."""
        return {self.name: self.decay}

    def update(self, slot, state, event):
        """The hook protocol's ``update`` (no slot): called so, it builds no ``State`` after a hook with one."""
        match event:
            case ev.AfterStep(step=step):  # the fold calls it only on the cadence
                return slot, state, (UpdateEma(self.name, step, self.decay),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        extra = ("" if self.every == 1 else f", every={self.every}") + (
            "" if self.name == "ema" else f", name={self.name!r}"
        )
        return f"ema({self.decay!r}{extra})"


@hook_factory
def ema(decay: float, *, every: int = 1, name: str = "ema") -> _Ema:
    """Keep an exponential moving average of the model's weights, updated after optimizer steps.

    Every ``every`` global steps, after the step's optimizer step, each
    parameter's average moves toward it: ``avg = decay * avg + (1 - decay) * p``
    (one fused ``torch._foreach_lerp_`` over all parameters, on their
    device, no host sync); buffers (BatchNorm statistics) are copied. The
    average starts as a copy of the weights at its first update. It is
    checkpointed with the run (its state is extra state named ``name``) and
    resumes exactly. ``evaluate_every(..., weights=name)`` evaluates it, and
    ``best_on`` then writes it as ``model_best``.

    Put it before the evaluators that use it in the hook list: an
    evaluation at a step then sees that step's update (``loop`` refuses the
    other order). A checkpoint holds it wherever the savers stand: a save
    runs after the other effects of its event.

    Args:
        decay: in ``[0, 1)``; the weight of the old average (``0.999`` is usual).
        every: steps between updates (>= 1).
        name: the average's name in ``evaluate_every(weights=)`` and in the checkpoint.

    Emits:
        ``UpdateEma(name, step, decay)`` (each rank) on each ``AfterStep`` of its cadence.

    >>> ema(0.999), ema(0.99, every=4, name="slow")
    (ema(0.999), ema(0.99, every=4, name='slow'))
    """
    return _Ema(decay, every, name)
