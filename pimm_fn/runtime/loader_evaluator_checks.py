"""What ``loader_evaluator``'s arguments must be, each refused at construction with what came and the fix.

A metric is a function ``fn(outputs, batch)`` (its signature checked), a
torchmetrics ``Metric`` or ``MetricCollection`` (anything with ``update``,
``compute`` and ``reset``), or a dict of them; the loader an iterable of
batches. The other arguments take ``pimm_fn.core.validate``'s validators.
"""

from collections.abc import Mapping

from pimm_fn.core.validate import refused_call

__all__ = ["is_torchmetric", "check_metric", "check_arity", "check_loader"]


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
        raise TypeError(f"loader_evaluator: 'loader' must be a DataLoader (or an iterable of batches) "
                        f"(got {type(value).__name__}: {value!r:.80})")
