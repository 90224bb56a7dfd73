"""What the feed reads off the training data: its sampler, its steps per epoch, and what a saved cursor depends on.

``describe`` records the loader's batch size, ``num_workers`` and dataset
length in the cursor; ``changes`` names what differs on resume, when the
loader's saved state no longer fits it.
"""

import torch

__all__ = ["epoch_sampler", "sampler_generators", "steps_per_epoch", "describe", "changes"]


def epoch_sampler(data):
    """The sampler of ``data`` told each epoch (one with ``set_epoch``), or ``None``."""
    for candidate in (getattr(data, "sampler", None), getattr(getattr(data, "batch_sampler", None), "sampler", None)):
        if hasattr(candidate, "set_epoch"):
            return candidate
    return None


def sampler_generators(data, own) -> tuple:
    """Generators the loader's samplers keep across epochs (torchdata's RandomSampler), besides ``own``."""
    found = []
    for holder in (getattr(data, "sampler", None), getattr(data, "batch_sampler", None),
                   getattr(getattr(data, "batch_sampler", None), "sampler", None)):
        generator = getattr(holder, "generator", None)
        if isinstance(generator, torch.Generator) and generator is not own and all(generator is not g for g in found):
            found.append(generator)
    return tuple(found)


def describe(data) -> dict:
    """What of ``data`` a loader's saved state depends on: batch size, ``num_workers``, dataset length."""
    try:
        samples = len(data.dataset)
    except (AttributeError, TypeError):
        samples = None
    return {"batch_size": getattr(data, "batch_size", None), "num_workers": getattr(data, "num_workers", 0),
            "samples": samples}


def changes(saved: dict | None, now: dict) -> str:
    """The differences between two ``describe`` records, as ``"num_workers 0 -> 2"``; ``""`` when none (or unknown)."""
    if not saved:
        return ""
    names = {"batch_size": "batch size", "num_workers": "num_workers", "samples": "dataset length"}
    return ", ".join(f"{label} {saved.get(key)} -> {now.get(key)}" for key, label in names.items()
                     if saved.get(key) != now.get(key))


def _length(data) -> int:
    try:
        length = len(data)
    except TypeError:
        raise TypeError(f"the training data ({type(data).__name__}) has no len(): pass "
                        "loop(training=pimm_fn.Training(iters_per_epoch=N))") from None
    if length < 1:
        raise ValueError(f"the training data is empty (len {length}): give the loop at least one batch")
    return length


def steps_per_epoch(data, group: int) -> int:
    """Steps per epoch of ``group`` batches each: ``len(data) // group``."""
    length = _length(data)
    if length < group:
        raise ValueError(
            f"the training data has {length} batches, fewer than the {group} micro-batches of one step "
            f"(accumulate={group}): use more data, smaller batches or a smaller accumulate"
        )
    return length // group
