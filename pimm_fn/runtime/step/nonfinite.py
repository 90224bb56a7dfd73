"""A NaN or infinite training loss: the loop's policy for one, and its error and warning.

What the loop does with a non-finite loss is ``loop(training=Training(on_nonfinite=...))``'s
policy, carried by a ``NonFinite`` value:

* ``"raise"`` (the default): ``NonFiniteLossError`` naming the global step
  and the batch of the epoch;
* ``"skip"``: a built-in step (the default one, or a ``TrainStep``) leaves
  that batch out of the update (no optimizer, scaler or scheduler step: the
  gradients are zeroed) but the step counts: progress advances and the
  batch is consumed. The default step reads the loss before the backward
  and runs none; a ``TrainStep`` reads it after the backward of its
  micro-batches, before unscaling or clipping. Refused with a custom
  ``step_fn``, whose loss is seen only after its step ran;
* ``"warn"``: a ``NonFiniteLossWarning``, and the step goes on as usual.

Each occurrence under ``"skip"``/``"warn"`` is a warning with the count so
far. The error's advice names only what works for the step in use: with a
custom ``step_fn``, not ``"skip"``, which ``loop()`` would refuse.

``"skip"`` must decide before the update, so the step reads the loss there
(``loss.item()``: one host sync per step on GPU). ``"raise"`` and ``"warn"``
read nothing per step: the losses wait on their device with the other
outputs and are read with them (``pimm_fn.runtime.engine.outputs``), where a hook
reads the outputs, at each epoch's end, and every 1 000 steps at the latest
(``NonFinite.read``). So the error names the step, comes before any
checkpoint of a later step is written, and finds the weights in memory
already updated from the non-finite loss: resume from the last checkpoint.
With several ranks each read is agreed by one all-reduce of a flag, so
every rank skips, warns or raises alike instead of one rank leaving a
collective.

Under ``FaultTolerance`` with a built-in step (``replicated``) every policy
reads each loss before the update, as ``"skip"`` does, and the decision is
agreed over the replica groups too (``across``): a loss that is not finite
on one group skips the step, warns, or raises ``NonFiniteLossError`` on
every group, before any optimizer steps. Read later, the groups would
average its non-finite gradients into every group's weights before any
group knew, and a group that had not seen it could save them. Such a run
syncs at every step anyway (its quorum and its vote), so the read costs
little there. A custom ``step_fn`` keeps the later read.
"""

import math
import warnings

import torch

from pimm_fn import dist
from pimm_fn.runtime.engine.outputs import WAIT_AT_MOST
from pimm_fn.runtime.errors import _ADVICE, NonFiniteLossError, NonFiniteLossWarning

__all__ = ["NonFinite", "NONFINITE_POLICIES"]


NONFINITE_POLICIES = ("raise", "skip", "warn")


_FIX = {
    True: "Pass loop(training=pimm_fn.Training(on_nonfinite='skip')) to leave such batches out of the update, "
    "or on_nonfinite='warn' to warn and go on",
    False: "Pass loop(training=pimm_fn.Training(on_nonfinite='warn')) to warn and go on",
}


class NonFinite:
    """The loop's policy for a NaN or infinite loss, and where training stands when one comes.

    Args:
        policy: ``"raise"``, ``"skip"`` or ``"warn"``.
        world_size: ranks that must agree on the decision (one all-reduce a step when > 1).
        where: ``() -> Progress`` before the step being trained (``loop()`` sets it).
        can_skip: the step in use can leave an update out (a built-in step), so
            the error's advice may name ``"skip"``.
        replicated: the run is replica groups (``FaultTolerance``) trained by
            a built-in step: every policy reads each loss before the update.

    Attributes:
        across: under ``FaultTolerance``, for a loss read before the update,
            ``(finite here) -> finite on every replica group`` (the replica
            groups set it: ``pimm_fn.runtime.replicas.switch``); ``None``
            otherwise.
    """

    def __init__(
        self,
        policy: str = "raise",
        *,
        world_size: int = 1,
        where=None,
        can_skip: bool = True,
        replicated: bool = False,
    ):
        self.policy = policy
        self.world_size = world_size
        self.where = where
        self.can_skip = can_skip
        self.replicated = replicated
        self.count = 0  # occurrences so far in this process
        self.across = None  # the replica groups' agreement on a loss read before the update (FaultTolerance)

    @property
    def before_update(self) -> bool:
        """Whether each loss is read before the update (``"skip"``, or any policy of replica groups).

        Else the loop reads them later, in batches.
        """
        return self.policy == "skip" or self.replicated

    def read(self, losses: list) -> None:
        """Act on the first non-finite of ``losses``, ``[(global step, float)]`` read after their steps ran.

        With several ranks one all-reduce agrees whether any rank saw one
        (every rank reads at the same points).

        Raises:
            NonFiniteLossError: under ``"raise"``, naming the step.
        """
        bad = next(((step, v) for step, v in losses if not math.isfinite(v)), None)
        if self.world_size > 1 and not self._agree(bad is None):
            bad = bad or (losses[-1] if losses else (None, 0.0))
        elif bad is None:
            return
        step, value = bad
        self(value, ran=True, step=step)
        for step, value in losses:  # under "warn": each further one is said too
            if (step, value) != bad and not math.isfinite(value):
                self(value, ran=True, step=step)

    def _agree(self, finite: bool) -> bool:
        """Whether every rank's losses were finite (one all-reduce)."""
        import torch.distributed as td

        device = dist.collective_device()
        flag = torch.tensor([0.0 if finite else 1.0], device=device)
        td.all_reduce(flag, op=td.ReduceOp.MAX)
        return flag.item() == 0.0

    def finite(self, value: float, device) -> bool:
        """Whether the loss ``value`` is finite on every rank (one all-reduce with several ranks) and replica group."""
        finite = math.isfinite(value) if self.world_size == 1 else self._agree(math.isfinite(value))
        return finite if self.across is None else self.across(finite)

    def __call__(self, value: float, *, ran: bool = False, step: int | None = None) -> bool:
        """Act on a non-finite loss ``value``; True when the step is to go ahead (``"warn"``).

        ``ran``: the step already ran (a custom ``step_fn``), so nothing can be skipped.
        ``step``: the global step of a loss read after it ran.

        Raises:
            NonFiniteLossError: under ``"raise"``.
        """
        self.count += 1
        p = self.where() if self.where is not None else None
        if step is not None:
            place = (
                f"global step {step} (read where a hook reads the step's outputs, at the epoch's end, or every "
                f"{WAIT_AT_MOST} steps)"
            )
        elif p is not None:
            place = (
                f"global step {p.global_step + 1} (batch index {p.iter_in_epoch} of epoch {p.epoch}, counting from 0)"
            )
        else:
            place = "this step"
        elsewhere = "another rank or replica group" if self.across is not None else "another rank"
        which = f"is {value}" if not math.isfinite(value) else f"is not finite on {elsewhere} (here {value})"
        if self.policy == "raise":
            advice = _ADVICE[self.can_skip]
            error = NonFiniteLossError(f"the training loss {which} at {place}. {_FIX[self.can_skip]}; {advice}")
            error.advice = advice  # kept when pickled (an exception's __dict__ is)
            raise error
        if self.policy == "skip" and not ran:
            action = "its optimizer step was skipped (the step still counts)"
        else:
            action = "the step ran" if ran else "the step goes ahead (on_nonfinite='warn')"
        warnings.warn(
            f"the training loss {which} at {place}: {action}; {self.count} non-finite loss(es) so far",
            NonFiniteLossWarning,
            stacklevel=4,
        )
        return self.policy == "warn" or ran

    def __repr__(self):
        return f"NonFinite({self.policy!r}, world_size={self.world_size})"
