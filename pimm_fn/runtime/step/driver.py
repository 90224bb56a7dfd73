"""The driver's work of one training step: its batch (one, or micro-batches), the train step, the scheduler step.

Each is a unit of the step's transaction (``pimm_fn.runtime.engine.transaction``),
and what an interrupted try leaves is kept there for the next one: a drawn
batch is trained next with the torch RNG its first forward started from (so
dropout draws the same masks); a train step that raised is placed around
``optimizer.step()`` (``StepWatch``; inside it or after it the retry is not
exact, and warned about); with the default step the driver steps the
scheduler itself, after the step, so an exception there finds the optimizer
step done and its outputs kept, and the retry only steps the scheduler.

What a step gets from the feed (one batch, or a group of micro-batches) and how many samples it holds.
"""

import torch

from pimm_fn.runtime.engine.transaction import (
    LOADING,
    SCHEDULING,
    TRAINING,
    StepWatch,
    fetched_inexactly,
    retried_inexactly,
)
from pimm_fn.runtime.replicas.commit import Discarded
from pimm_fn.runtime.step.rng import set_torch_rng, torch_rng
from pimm_fn.runtime.step.train_step import scalar_outputs

__all__ = [
    "MicroBatches",
    "batch_size",
    "Driver",
]


_Tensor = torch.Tensor


class MicroBatches(tuple):
    """The ``k`` batches of one optimizer step, as a grouped feed gives them (``Feed(group=k)``)."""

    __slots__ = ()

    def __repr__(self):
        return f"MicroBatches({list(self)!r})"


def batch_size(batch) -> int:
    """The samples in ``batch``: the first dimension of its first tensor (0 when it has none)."""
    cls = batch.__class__
    if cls is MicroBatches:  # a step's micro-batches: all their samples
        return sum(batch_size(part) for part in batch)
    if (cls is tuple or cls is list) and batch:  # the common (inputs, targets) batch, without a getattr miss
        first = batch[0]
        if first.__class__ is _Tensor:  # a plain tensor: its shape, without a call
            shape = first.shape
            return shape[0] if shape else 0
        return batch_size(first)
    dims = getattr(batch, "shape", None)
    if dims:
        return int(dims[0])
    if isinstance(batch, dict):
        return max((batch_size(v) for v in batch.values()), default=0)
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    return 0


class Driver:
    """Trains one global step at a time and hands each on (``trained(step, scalars, batch size)``).

    Args:
        ctx: the run's parts (feed, model, optimizer, scheduler, scaler, non-finite policy).
        tx: the step's ``Transaction``.
        run_step: the step function as the loop calls it (``pimm_fn.runtime.step.train_step.runner``).
        scheduler_in_step: the step function steps the scheduler (no hook emits ``StepScheduler``).
        default_step: the step function is the default ``train_step``: the driver steps the scheduler after it.
        trained: called with each trained step: the loop counts it or folds its ``AfterStep``.
    """

    __slots__ = (
        "_ctx",
        "_tx",
        "_run_step",
        "_trained",
        "_handed",
        "_after",
        "_skipping",
        "_exact",
        "_watch",
        "_loading",
        "_training",
        "_scheduling",
        "_replicas",
    )

    def __init__(self, ctx, tx, run_step, *, scheduler_in_step: bool, default_step: bool, trained):
        self._ctx, self._tx, self._run_step, self._trained = ctx, tx, run_step, trained
        self._replicas = ctx.replicas  # under FaultTolerance: a step whose commit vote failed is discarded
        scheduler = ctx.scheduler if scheduler_in_step else None
        self._after = default_step and scheduler is not None  # the driver steps it after the step
        self._handed = None if self._after else scheduler  # the scheduler the step function is handed
        nonfinite = ctx.nonfinite  # under "skip", a batch left out of the update leaves the scheduler too
        self._skipping = nonfinite if self._after and nonfinite is not None and nonfinite.policy == "skip" else None
        self._exact = exact = ctx.exact_retry  # else no RNG kept and no watch: a retry is not exact (warned)
        # One watch per optimizer: drivers rebuilt around it share it.
        self._watch = watch = StepWatch.of(ctx.optimizer) if exact else None
        # Without exact retry, a fetch that may draw from the RNG and raised is fetched again from it as it is.
        self._loading = tx.unit(LOADING if ctx.feed.refetched_exactly else fetched_inexactly)
        self._scheduling = tx.unit(SCHEDULING)
        # Where, around optimizer.step(), the train step raised (not exact once it began: warned).
        self._training = tx.unit(watch.stopped if watch is not None else TRAINING if exact else retried_inexactly)

    def train(self, step: int) -> None:
        """Train global step ``step`` and hand it on."""
        ctx, tx, watch = self._ctx, self._tx, self._watch
        tx.step = step
        if tx.held is None:
            with self._loading:
                batch = ctx.feed.next_batch()  # on an exception the feed is back before this fetch
            tx.held = (batch, torch_rng() if self._exact else None)
        else:  # the batch an interrupted try drew, with the RNG its forward started from (when kept)
            batch, rng = tx.held
            if rng is not None:
                set_torch_rng(rng)
        skipping = self._skipping
        skips = skipping.count if skipping is not None else 0
        if watch is not None:
            watch.arm()  # it then tells where, around optimizer.step(), the train step raised
        with self._training:
            scalars = self._run_step(ctx.model, ctx.optimizer, batch, self._handed, ctx.scaler)
        replicas = self._replicas
        if replicas is not None and not replicas.took(step):
            replicas.discard(step)  # its positions dealt again, after a new quorum
            raise Discarded(step)  # outside every unit: the walker draws the step again after a new quorum
        tx.held = None
        if self._after and (skipping is None or skipping.count == skips):  # a skipped batch leaves the scheduler
            return self.schedule(step, scalars, batch_size(batch))
        self._trained(step, scalars, batch_size(batch))

    def schedule(self, step: int, scalars: dict, size: int) -> None:
        """The scheduler step after the default step's optimizer step, then the step handed on."""
        tx = self._tx
        tx.step, tx.trained = step, (step, scalars, size)
        with self._scheduling, tx.keys.holding_back():  # a scheduler step stopped half-way is not exact
            self._ctx.scheduler.step()
        tx.trained = None
        if "lr" in scalars:  # the default step reports the learning rate after its scheduler step
            lr = self._ctx.optimizer.param_groups[0]["lr"]
            scalars["lr"] = lr if lr.__class__ is float else scalar_outputs({"lr": lr})["lr"]
        self._trained(step, scalars, size)
