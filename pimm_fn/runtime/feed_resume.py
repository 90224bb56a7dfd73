"""A feed put back at a saved cursor: the loader's own state loaded, or the epoch replayed to the same batch.

Called with the process RNG already restored to the checkpoint's (see
``pimm_fn.runtime.feed`` for what resumes exactly, by the kind of data).
The cursor records the loader's batch size, ``num_workers`` and dataset
length. When one of them changed, the loader's own state (which describes
the old ones) is not loaded: one ``ResumeNotExactWarning`` line names the
change and the epoch is replayed from its start to the same batch (the same
samples in the same order when only ``num_workers`` changed; see
``pimm_fn.runtime.positioning`` for another batch size).
"""

import warnings

import torch

from pimm_fn.runtime import remainder
from pimm_fn.runtime.resume_warning import ResumeNotExactWarning
from pimm_fn.runtime.rng import capture_rng, restore_rng
from pimm_fn.runtime.training_data import changes, describe, epoch_sampler

__all__ = ["resume_feed"]


def resume_feed(feed, cursor: dict, epoch: int, iter_in_epoch: int) -> None:
    """Continue ``epoch`` after ``iter_in_epoch`` consumed batches.

    Call with the process RNG already restored to the checkpoint's.
    """
    if cursor.get("generator") is not None or cursor.get("samplers"):
        feed._set_rng({**cursor, "torch": torch.get_rng_state()})
    boundary = iter_in_epoch == 0 or iter_in_epoch >= feed.iters_per_epoch
    fresh = _without_stale_loader(feed, cursor, epoch, iter_in_epoch, boundary)
    if boundary:
        if fresh is not cursor:
            return  # the next epoch opens afresh: the warning said so
        if feed.stateful and cursor.get("epoch_done"):
            _load_finished(feed, cursor["loader"])  # its sampler's state for the next epoch
        elif feed.stateful and iter_in_epoch:
            warnings.warn(
                f"epoch {epoch} ended after {feed.iters_per_epoch} of the loader's {len(feed.data)} batches, so "
                f"its state does not mark a finished pass and is not restored: later epochs may shuffle "
                f"differently from the original run. Leave iters_per_epoch at len(loader) for an exact resume",
                ResumeNotExactWarning,
                stacklevel=3,
            )
        return
    sampler = epoch_sampler(feed.data)
    if sampler is not None:
        sampler.set_epoch(epoch)
    cursor, skip = fresh, iter_in_epoch * feed.group  # batches, not steps
    if cursor.get("rest") is not None:  # the epoch was continued at a position: continue it there again
        offset, first = cursor["rest"]
        remainder.lend(feed.data, epoch, offset)
        feed._rest, skip = (offset, first), (iter_in_epoch - first) * feed.group
    if feed.stateful and "loader" in cursor:
        feed.data.load_state_dict(cursor["loader"])
        feed._iterator = feed._iter_without_draws()
        feed._source, feed._drawn = ("loader", cursor["loader"]), 0
    elif not feed.one_shot and cursor.get("epoch_start") is not None:
        _replay(feed, cursor["epoch_start"], skip)
    else:
        warnings.warn(
            f"cannot restore the data position of epoch {epoch} (step {iter_in_epoch} of it): the epoch "
            f"continues from a fresh iterator, so the batches differ from the original run. Use a DataLoader "
            f"or torchdata's StatefulDataLoader",
            ResumeNotExactWarning,
            stacklevel=3,
        )
        feed._source, feed._drawn = ("rng", feed._rng()), 0
        feed._iterator = iter(feed.data)

def _without_stale_loader(feed, cursor: dict, epoch: int, iter_in_epoch: int, boundary: bool) -> dict:
    """``cursor`` without the loader's state when the loader changed since (named in one warning line).

    That state describes the old batch size, workers and dataset: loading
    it fails inside the loader, or continues at a wrong sample.
    """
    changed = changes(cursor.get("data"), describe(feed.data))
    if not changed or (boundary and "loader" not in cursor):
        return cursor  # nothing of the old loader is loaded, or positioned by
    then = (f"epoch {epoch + (iter_in_epoch > 0)} opens afresh" if boundary
            else f"epoch {epoch} is replayed from its start to step {iter_in_epoch}")
    warnings.warn(
        f"the training data changed since the checkpoint ({changed}): the loader's saved state (if any) is "
        f"not loaded; {then}",
        ResumeNotExactWarning,
        stacklevel=4,
    )
    return {k: v for k, v in cursor.items() if k not in ("loader", "epoch_done")}

def _load_finished(feed, loader_state) -> None:
    """Load the state a finished epoch left in the loader, drawing no random numbers.

    A StatefulDataLoader rebuilds the finished iterator from a loaded state
    on its next ``iter()`` (drawing a seed for it) before it opens a fresh
    one: a draw the uninterrupted run never made. Rebuilding it here, with
    the RNG put back, leaves the next epoch's ``iter()`` drawing exactly
    what the uninterrupted run's did.
    """
    resumed = capture_rng()
    feed.data.load_state_dict(loader_state)
    feed.data.state_dict()
    restore_rng(resumed)

def _replay(feed, epoch_start: dict, skip: int) -> None:
    resumed = capture_rng()
    feed._epoch_start = epoch_start
    feed._open(("rng", epoch_start), skip)
    restore_rng(resumed)
