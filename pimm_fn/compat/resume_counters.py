"""Where a pimm checkpoint resumes: its counters (epoch, iter, global step) read as pimm_fn's ``Progress``.

pimm's rules (``PIMM.md`` 3.11, see ``pimm_fn.compat.checkpoints``): at an
epoch boundary the next epoch runs as in pimm_fn; mid-epoch the epoch
restarts from its first batch; a legacy file's steps per epoch are the
resuming run's. Steps per epoch come from the counters, else the
scheduler's step count; what cannot be told is a ``PimmCheckpointError``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pimm_fn.compat.reading import PimmCheckpointError
from pimm_fn.core.state import Progress

__all__ = ["resume_progress", "is_legacy", "legacy_line", "item", "nested_state"]


def nested_state(entry):
    """A pimm state entry's ``state_dict`` when it wraps one, else the entry."""
    return entry.get("state_dict") if isinstance(entry, Mapping) and "state_dict" in entry else entry


def item(value):
    """A counter saved as a one-element tensor, as a number."""
    return value.item() if isinstance(value, torch.Tensor) else value


def _exact(numerator, denominator):
    return numerator // denominator if denominator > 0 and numerator % denominator == 0 and numerator > 0 else None


def is_legacy(payload: Mapping) -> bool:
    """Whether ``payload`` is a legacy (Pointcept-style) file: counters ``epoch``/``iter``, no trainer state."""
    return not isinstance(payload.get("train_state") or payload.get("trainer"), Mapping)


def _counters(payload: Mapping, where) -> tuple[int, int, int | None, int, bool]:
    """``(epoch, iter_in_epoch, global_step or None, samples_seen, legacy)`` pimm resumes from."""
    trainer = payload.get("train_state") or payload.get("trainer")
    if not is_legacy(payload):
        i = trainer.get("iter_in_epoch", trainer.get("iteration", trainer.get("iter", 0)))
        return (int(item(trainer.get("epoch", 0))), int(item(i or 0)), int(item(trainer.get("global_step", 0))),
                int(item(trainer.get("samples_seen", 0))), False)
    if "epoch" not in payload:
        raise PimmCheckpointError(
            f"{where} holds model weights only (no 'epoch' or trainer state): nothing to resume. Warm-start a fresh "
            f"run from it instead (CheckpointLoader with weight={str(where)!r}, or pf.load_weights)"
        )
    return int(item(payload["epoch"])), int(item(payload.get("iter") or 0)), None, 0, True


def _steps_per_epoch(epoch, i, step, payload, given, legacy, where) -> int:
    if given is not None:  # translate(iters_per_epoch=), or the loader's length for a legacy file (pimm's rule)
        return given
    if not legacy and epoch > 0:
        found = _exact(step - i, epoch)
        if found is not None and (i == 0 or i < found):
            return found
    scheduler = nested_state(payload.get("scheduler")) or {}
    count = scheduler.get("last_epoch") if isinstance(scheduler, Mapping) else None
    if legacy and isinstance(count, int) and epoch > 0:
        found = _exact(count, epoch) if i == 0 else _exact(count - i, epoch - 1) if epoch > 1 else None
        if found is not None:
            return found
    if not legacy and epoch == 0 and i > 0:
        return i + 1  # the first epoch restarts at step 0 (below): its length no longer matters
    raise PimmCheckpointError(
        f"{where} records epoch={epoch}, iter={i} but not its steps per epoch: translate it with "
        f"pimm_fn.compat.translate({str(where)!r}, out_dir, iters_per_epoch=len(train_loader)) and resume from that"
    )


def resume_progress(payload: Mapping, where, iters_per_epoch, max_epochs, run_steps=None) -> tuple[Progress, str, str | None]:
    """``(progress, position, note)``: where pimm would resume, as pimm_fn's state; ``note`` a warning to give.

    ``run_steps``: the resuming run's steps per epoch, which a legacy file is resumed with (pimm's rule).
    """
    epoch, i, step, samples, legacy = _counters(payload, where)
    given = run_steps if legacy and iters_per_epoch is None else iters_per_epoch
    ipe = _steps_per_epoch(epoch, i, step, payload, given, legacy, where)
    note = None
    if legacy:
        start = max(0, epoch - 1) if 0 < i < ipe else epoch
        if 0 < i < ipe:
            note = (f"{where}: legacy checkpoint is mid-epoch (epoch={epoch}, iter={i}) and has no dataloader state; "
                    f"epoch {start} restarts from its first batch")
        step = start * ipe
    elif 0 < i < ipe:
        start = epoch
        note = (f"{where}: checkpoint is mid-epoch (epoch {epoch}, step {i} of {ipe}) and its dataloader state is a "
                f"pickle pimm_fn does not load; resuming from the beginning of the saved epoch and replaying "
                f"already-completed batches (global_step {step} -> {epoch * ipe}), as pimm does without a cursor")
        step = epoch * ipe
    else:
        start = epoch + (1 if i >= ipe else 0)
    scheduler = payload.get("scheduler")
    horizon = scheduler.get("total_steps") if isinstance(scheduler, Mapping) else None
    horizon = horizon if horizon is not None else (nested_state(scheduler) or {}).get("total_steps")
    epochs = max_epochs if max_epochs is not None else _exact(item(horizon), ipe) if isinstance(item(horizon), int) else None
    epochs = max(epochs if epochs is not None else start, start)
    if start == 0:
        return Progress(ipe, epochs, 0, 0, 0, samples), "BeforeTrain", note
    return Progress(ipe, epochs, start - 1, ipe, step, samples), "AfterEpoch", note


def legacy_line(path, payload, progress: Progress, position: str) -> str:
    """The console line saying a legacy file resumes with this run's steps per epoch, and where."""
    epoch, i = item(payload["epoch"]), item(payload.get("iter") or 0)
    at = progress.epoch + 1 if position == "AfterEpoch" else 0
    return (f"{path} is pimm's legacy checkpoint (epoch={epoch}, iter={i}), which does not record its steps per "
            f"epoch: taking this run's steps per epoch, {progress.iters_per_epoch}, as pimm takes its loader's "
            f"length; resuming at epoch {at}, global_step {progress.global_step}")
