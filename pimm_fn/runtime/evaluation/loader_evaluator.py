"""An evaluator over a DataLoader, the ecosystem's way: its arguments checked, one shard per rank, sums reduced once.

``loader_evaluator(val_loader, metric, name="val")`` is an evaluator for
``evaluate_every`` (``fn(model) -> metrics``). The ``evaluate`` handler
already runs it with the model in eval mode under ``torch.inference_mode()``
(``pimm_fn.runtime.handlers.evaluation``); this module iterates the loader, moves each
batch to the model's device, calls the model and feeds the metric.

With several ranks each rank evaluates its own part of the dataset: indices
``rank, rank + world, ...``, uneven when the dataset does not divide (a
``DistributedSampler`` pads the last shard by repeating samples, which would
count them twice, so it is replaced). The per-batch sums are added on each
rank and all-reduced once, so every sample counts exactly once. Evaluating
draws nothing from the training's torch RNG (a DataLoader draws its seed from
it): the training's random stream is the same with or without evaluators.

A metric is either:

* a function ``fn(outputs, batch) -> {name: sum}`` of per-batch sums (a
  number or a one-element tensor each). The totals are finished into
  metrics by ``finish(totals)``; by default, with a ``"count"`` among them,
  every other total is divided by it (``{"correct": c, "count": n}`` gives
  ``{"correct": c / n}``), and without one the totals are published as they are;
* a torchmetrics ``Metric``, ``MetricCollection`` or ``{name: Metric}`` (any
  object with ``update``, ``compute`` and ``reset``): each is reset, updated
  with ``(outputs, target(batch))`` and computed, which syncs its state over
  the ranks.

Published names are namespaced by the evaluator's name: ``"val/acc"``. The
hook's name wins: ``evaluate_every(n, loader_evaluator(..., name="val"), name="test")``
publishes ``"test/acc"`` (the run evaluates ``named("test")``), so the name in
effects, logs and metrics is always the one ``evaluate_every`` shows.

What ``loader_evaluator``'s arguments must be, each refused at construction with what came and the fix.

A metric is a function ``fn(outputs, batch)`` (its signature checked), a
torchmetrics ``Metric`` or ``MetricCollection`` (anything with ``update``,
``compute`` and ``reset``), or a dict of them; the loader an iterable of
batches. The other arguments take ``pimm_fn.core.validate``'s validators.

Evaluating on several ranks: each rank its own part of the data, as many forwards each, the sums reduced once.

``shard_of`` splits a DataLoader by index, ``rank, rank + world, ...``, with
no padding (a ``DistributedSampler`` repeats samples to even the shards,
which would count them twice); ``missing_forwards`` says how many extra
forwards a rank owes when a sharded model's forward is collective; and
``reduce_sums`` adds the per-batch sums of every rank in one all-reduce.
Used by ``pimm_fn.runtime.evaluation.loader_evaluator``.
"""

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import attrs
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from pimm_fn import dist
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.core import validate as v
from pimm_fn.core.validate import refused_call
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.step.rng import set_torch_rng, torch_rng
from pimm_fn.runtime.step.train_step import TARGET_KEYS, to_device

__all__ = [
    "is_torchmetric",
    "check_metric",
    "check_arity",
    "check_loader",
    "shard_of",
    "missing_forwards",
    "reduce_sums",
    "LoaderEvaluator",
    "loader_evaluator",
    "default_forward",
    "default_target",
    "mean_over_count",
]


def is_torchmetric(obj) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("update", "compute", "reset"))


def check_metric(instance, attribute, value) -> None:
    if isinstance(value, Mapping):
        if value and all(is_torchmetric(m) for m in value.values()):
            return
    elif is_torchmetric(value):
        return
    elif callable(value):
        check_arity(value, 2, "metric", "fn(outputs, batch) -> {name: per-batch sum}")
        return
    raise TypeError(
        f"loader_evaluator: 'metric' must be fn(outputs, batch) -> {{name: per-batch sum}}, a torchmetrics Metric "
        f"(or MetricCollection) or a dict of them (got {type(value).__name__}: {value!r:.80})"
    )


def check_arity(fn, n: int, what: str, shape: str) -> None:
    """``fn`` can be called with ``n`` positional arguments, else a ``TypeError`` showing its signature."""
    signature = refused_call(fn, *([None] * n))
    if signature is not None:
        raise TypeError(
            f"loader_evaluator: {what!r} must be callable as {shape} (got {getattr(fn, '__qualname__', fn)!r} "
            f"with signature {signature})"
        )


def check_loader(instance, attribute, value) -> None:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"loader_evaluator: 'loader' must be a DataLoader (or an iterable of batches) "
            f"(got {type(value).__name__}: {value!r:.80})"
        )


def shard_of(loader, rank: int, world: int):
    """``loader`` over the indices ``rank, rank + world, ...`` of its dataset: no padding, so no sample twice.

    The batch size, collate function, workers and the rest are kept.

    Raises:
        TypeError: a loader that cannot be split by index (an iterable
            dataset, a custom batch sampler, not a DataLoader).
    """
    fix = "pass shard=False and give each rank its own disjoint part of the data"
    if not isinstance(loader, DataLoader):
        raise TypeError(f"loader_evaluator cannot split a {type(loader).__name__} over {world} ranks: {fix}")
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(f"loader_evaluator cannot split an IterableDataset over {world} ranks by index: {fix}")
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        raise TypeError(
            f"loader_evaluator cannot split a DataLoader with its own batch_sampler "
            f"({type(loader.batch_sampler).__name__}) over {world} ranks: {fix}"
        )
    workers = loader.num_workers
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        # torch types the dataset a Dataset, which need not be Sized; a map-style one split by index has a len().
        sampler=list(range(rank, len(loader.dataset), world)),  # type: ignore[arg-type]
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        prefetch_factor=loader.prefetch_factor if workers else None,
    )


def missing_forwards(model, done: int, name: str) -> int:
    """How many forwards this rank owes so every rank ran as many: 0 unless the model is sharded over ranks."""
    if not dist.is_initialized() or dist.world_size() == 1 or not sharded.is_sharded(model):
        return 0
    most = torch.tensor([done], device=dist.collective_device())
    torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
    missing = int(most.item()) - done
    if missing and not done:
        raise ValueError(
            f"loader_evaluator {name!r}: rank {dist.rank()} holds no sample of the dataset (fewer "
            f"samples than ranks), but a sharded model's forward needs every rank: evaluate more samples"
        )
    return missing


def reduce_sums(sums: dict) -> dict:
    """``{name: total}`` over every rank: the names any rank saw (0 where a rank saw none), one all-reduce."""
    names = sorted(set().union(*dist.all_gather_object(sorted(sums)))) if dist.is_initialized() else sorted(sums)
    if not names:
        return {}
    device = dist.collective_device()
    totals = torch.stack([torch.as_tensor(sums.get(n, 0.0), dtype=torch.float64).to(device) for n in names])
    if dist.is_initialized():
        torch.distributed.all_reduce(totals)
    return dict(zip(names, totals.tolist()))


def default_forward(model, batch):
    """``model(inputs)`` for an ``(inputs, target)`` pair, else ``model(batch)``."""
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return model(batch[0])
    return model(batch)


def default_target(batch):
    """The target of an ``(inputs, target)`` pair, or a mapping's ``"target"``/``"label"``/``"y"``.

    The names are the supervised train step's (``pimm_fn.runtime.step.train_step.TARGET_KEYS``).
    """
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[1]
    if isinstance(batch, Mapping):
        for name in TARGET_KEYS:
            if name in batch:
                return batch[name]
    raise TypeError(
        f"loader_evaluator cannot tell the target in a batch of type {type(batch).__name__}: "
        f"pass target=lambda batch: batch[...] (the value torchmetrics' update(preds, target) receives)"
    )


def mean_over_count(totals: dict) -> dict:
    """Every total divided by ``totals["count"]`` when there is one; else the totals as they are.

    >>> mean_over_count({"correct": 3.0, "count": 4.0})
    {'correct': 0.75}
    >>> mean_over_count({"loss_sum": 2.0})
    {'loss_sum': 2.0}
    """
    if "count" not in totals:
        return dict(totals)
    count = totals["count"]
    if count <= 0:
        raise ValueError(f"loader_evaluator: the metric counted {count} samples in all: is the loader empty?")
    return {name: value / count for name, value in totals.items() if name != "count"}


def _device(model) -> torch.device:
    return next((p.device for p in unwrap(model).parameters()), torch.device("cpu"))


def _add(sums: dict, part, name: str) -> None:
    if not isinstance(part, Mapping):
        raise TypeError(
            f"loader_evaluator {name!r}: the metric must return {{name: per-batch sum}} "
            f"(got {type(part).__name__}: {part!r:.80})"
        )
    for key, value in part.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TypeError(
                    f"loader_evaluator {name!r}: metric {key!r} is a tensor of {value.numel()} "
                    f"elements; return one sum per batch (e.g. (pred == y).sum())"
                )
            value = value.detach().reshape(()).to(torch.float64)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"loader_evaluator {name!r}: metric {key!r} must be a number or a one-element "
                f"tensor (got {type(value).__name__}: {value!r:.80})"
            )
        sums[key] = sums[key] + value if key in sums else value


@attrs.frozen(eq=False, repr=False)
class LoaderEvaluator:
    """An evaluator over a DataLoader; build it with ``loader_evaluator``. Calling it evaluates ``model``."""

    factory_name: ClassVar[str] = "loader_evaluator"
    loader: Iterable[Any] = attrs.field(validator=check_loader)
    metric: Any = attrs.field(validator=check_metric)  # a per-batch-sums function, or torchmetrics metrics
    name: str = attrs.field(default="val", validator=v.non_empty_str)
    forward: Callable[[Any, Any], Any] | None = attrs.field(default=None, validator=v.optional(v.is_callable))
    target: Callable[[Any], Any] | None = attrs.field(default=None, validator=v.optional(v.is_callable))
    finish: Callable[[dict[str, float]], Mapping[str, float]] | None = attrs.field(
        default=None, validator=v.optional(v.is_callable)
    )
    shard: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    max_batches: int | None = attrs.field(default=None, validator=v.optional(v.int_at_least(1)))

    @property
    def evaluator_name(self) -> str:
        """The name ``evaluate_every`` gives this evaluator (and the prefix of its metrics)."""
        return self.name

    def named(self, name: str) -> "LoaderEvaluator":
        """This evaluator publishing under ``name`` (``"name/<metric>"``): what ``evaluate_every(name=)`` runs."""
        return self if name == self.name else attrs.evolve(self, name=name)

    def limited(self, batches: int) -> "LoaderEvaluator | None":
        """This evaluator over the first ``batches`` batches of each rank's shard (a sanity check).

        ``None`` for a one-shot iterable (an iterator): the batches it ran
        would be missing from the next evaluation.
        """
        if isinstance(self.loader, Iterator):  # asked of the type: iter() of a DataLoader draws from the RNG
            return None
        return attrs.evolve(self, max_batches=batches)

    def batches(self) -> Iterator[Any]:
        """This rank's batches: its shard with several ranks, at most ``max_batches``."""
        world = dist.world_size()
        loader = shard_of(self.loader, dist.rank(), world) if self.shard and world > 1 else self.loader
        return itertools.islice(loader, self.max_batches)

    def __call__(self, model) -> dict:
        if isinstance(model, DistributedDataParallel):
            model = model.module  # its forward may sync buffers, and the ranks run different numbers of batches
        rng = torch_rng()  # a DataLoader draws its seed from the torch RNG: give the training's stream back
        try:
            values = self._torchmetrics(model) if not _plain(self.metric) else self._sums(model)
        finally:
            set_torch_rng(rng)
        return {f"{self.name}/{key}": value for key, value in values.items()}

    def _outputs(self, model, batch):
        return (self.forward or default_forward)(model, batch)

    def _evaluated(self, model):
        """``(outputs, batch)`` of each of this rank's batches, on the model's device.

        A sharded (FSDP2) model's forward is collective: a rank with fewer
        batches then runs its last one again, uncounted, until every rank
        has run as many forwards.
        """
        device, last, done = _device(model), None, 0
        for batch in self.batches():
            last, done = to_device(batch, device), done + 1
            yield self._outputs(model, last), last
        for _ in range(missing_forwards(model, done, self.name)):
            self._outputs(model, last)

    def _sums(self, model) -> Mapping[str, float]:
        sums: dict[str, Any] = {}  # one-element tensors, or numbers
        for outputs, batch in self._evaluated(model):
            _add(sums, self.metric(outputs, batch), self.name)
        totals = reduce_sums(sums)
        if not totals:
            raise ValueError(
                f"loader_evaluator {self.name!r}: the metric returned no sum on any rank (an empty loader?)"
            )
        return (self.finish or mean_over_count)(totals)

    def _torchmetrics(self, model) -> dict:
        metrics = self.metric if isinstance(self.metric, Mapping) else {type(self.metric).__name__: self.metric}
        device = _device(model)
        for metric in metrics.values():
            metric.reset()
            if hasattr(metric, "to"):
                metric.to(device)
        target = self.target or default_target
        for outputs, batch in self._evaluated(model):
            for metric in metrics.values():
                metric.update(outputs, target(batch))
        values: dict[str, Any] = {}
        for key, metric in metrics.items():
            result = metric.compute()  # syncs the metric's state over the ranks
            values.update(result if isinstance(result, Mapping) else {key: result})
            metric.reset()
        return {key: float(value) for key, value in values.items()}

    def __repr__(self):
        metric = getattr(self.metric, "__qualname__", type(self.metric).__name__)
        return f"loader_evaluator(<{type(self.loader).__name__}>, {metric}, name={self.name!r})"


def _plain(metric) -> bool:
    """A per-batch-sums function (not torchmetrics)."""
    return not isinstance(metric, Mapping) and not is_torchmetric(metric)


def loader_evaluator(
    loader: Iterable[Any],
    metric: Callable[[Any, Any], Mapping[str, Any]] | Mapping[str, Any],
    *,
    name: str = "val",
    forward: Callable[[Any, Any], Any] | None = None,
    target: Callable[[Any], Any] | None = None,
    finish: Callable[[dict[str, float]], Mapping[str, float]] | None = None,
    shard: bool = True,
    max_batches: int | None = None,
) -> LoaderEvaluator:
    """An evaluator for ``evaluate_every`` that runs the model over ``loader`` (see the module docstring).

    Args:
        loader: a DataLoader over a map-style dataset (split by index over
            the ranks), or, with ``shard=False``, any iterable of batches.
        metric: ``fn(outputs, batch) -> {name: per-batch sum}``, or torchmetrics
            metrics (a ``Metric``, a ``MetricCollection`` or ``{name: Metric}``).
        name: the evaluator's name and its metrics' prefix (``"val/acc"``).
            Give each evaluator its own: ``evaluate_every`` names it so; an
            ``evaluate_every(..., name=)`` given another name renames it.
        forward: ``forward(model, batch) -> outputs`` (default: ``model(inputs)``
            for an ``(inputs, target)`` pair, else ``model(batch)``).
        target: ``target(batch)``, what torchmetrics' ``update(outputs, target)``
            receives (default: a pair's second item, or a mapping's ``"target"``).
        finish: ``finish(totals) -> metrics`` over the summed totals (default:
            every total divided by the ``"count"`` one, when there is one).
        shard: split the dataset over the ranks (default); ``False`` iterates
            ``loader`` as it is on every rank (each rank's own part: still summed).
        max_batches: evaluate at most this many batches per rank.

    Raises:
        TypeError: a metric or function of the wrong shape, said here.

    >>> def accuracy(outputs, batch): return {"correct": 1, "count": 1}
    >>> loader_evaluator([(torch.zeros(1), torch.zeros(1))], accuracy, name="val")
    loader_evaluator(<list>, accuracy, name='val')
    """
    return LoaderEvaluator(loader, metric, name, forward, target, finish, shard, max_batches)
