"""The hook behind the progress bar: it moves the bar every ``n`` steps and reads no tensor for it.

``loop(watching=Watching(progress=...))`` adds it, last, when the bar is shown (rank 0's
terminal or notebook decides, for every rank); its ``ShowProgress``
effects go to the bar (``pimm_fn.runtime.handlers.progress``) on the main rank.
It never makes the loop read a step's outputs off the device
(``reads_outputs = False``): it passes on the outputs a hook had read on
that step anyway (``log_every``, or one that asked for a value), and each
evaluation's metrics.
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Effect, Scope
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.frozen import FrozenMap, freeze
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.outputs import StepOutputs
from pimm_fn.core.validate import int_at_least

__all__ = ["progress_bar", "ShowProgress", "BAR_KEY"]

BAR_KEY = "progress_bar()"  # the hook's identity: a checkpoint keeps its (empty) slot under it
_EMPTY = FrozenMap()


@attrs.frozen
class ShowProgress(Effect):
    """Move the progress bar to global step ``step``; show ``values`` (outputs read, metrics) beside it.

    Not traced (``traced = False``): it only shows the run, so a run's trace
    stays equal to the plan of its hooks with or without a bar.
    """

    scope: ClassVar[Scope] = Scope.MAIN
    traced: ClassVar[bool] = False
    step: int
    values: FrozenMap = attrs.field(default=_EMPTY, converter=freeze)


@attrs.frozen(repr=False)
class _ProgressBar:
    factory_name: ClassVar[str] = "progress_bar"
    events: ClassVar[tuple] = (ev.AfterStep, ev.AfterEpoch, ev.MetricsPublished)
    reads_outputs: ClassVar[bool] = False  # shows what others read: the bar alone leaves outputs on the device
    emits: ClassVar[tuple] = (ShowProgress,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    hook_key: ClassVar[str] = BAR_KEY
    n: int = attrs.field(default=1, validator=int_at_least(1))

    @property
    def every(self) -> int:
        """Called for ``AfterStep(step)`` only when ``step % n == 0``: the steps between are quiet."""
        return self.n

    def update(self, slot, state, event):
        """The hook protocol's ``update`` (no slot): called so, it builds no ``State`` after a hook with one."""
        match event:
            case ev.AfterStep(step=step, outputs=outputs):
                if isinstance(outputs, StepOutputs) and not outputs.was_read:  # no hook asked: the bar does not
                    outputs = _EMPTY
                return slot, state, (ShowProgress(step, outputs),)
            case ev.AfterEpoch():  # the bar reaches the epoch's last step, whatever n
                return slot, state, (ShowProgress(state.progress.global_step),)
            case ev.MetricsPublished(values=values) if values:
                return slot, state, (ShowProgress(state.progress.global_step, values),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        return "progress_bar()" if self.n == 1 else f"progress_bar({self.n})"


def bar_cadence(iters_per_epoch: int, updates: int = 200) -> int:
    """The ``n`` of a bar that moves about ``updates`` times an epoch: every step of a short one.

    >>> bar_cadence(32), bar_cadence(10_000)
    (1, 50)
    """
    return max(1, iters_per_epoch // updates)


@hook_factory
def progress_bar(n: int = 1):
    """Move a progress bar every ``n`` steps and at each epoch's end, showing what others read.

    ``loop`` adds it when the bar is shown (``loop(watching=Watching(progress=...))``), with
    ``n = bar_cadence(iters_per_epoch)`` so a long epoch's quiet steps stay
    quiet; a hook list rarely names it. It reads no tensor: the loss beside
    the bar is the one ``log_every`` read on a step the bar also moved on,
    so the bar costs no host sync.

    Emits:
        ``ShowProgress(step, outputs)`` every ``n`` steps (outputs empty on
        a step no reading hook fired on) and at each epoch's end;
        ``ShowProgress(step, metrics)`` for each published evaluation.

    State:
        none (its slot stays ``None``).

    >>> progress_bar()
    progress_bar()
    """
    return _ProgressBar(n)
