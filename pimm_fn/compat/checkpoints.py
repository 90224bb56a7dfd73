"""Resuming pimm's checkpoints in pimm_fn: the translation of their counters, RNG and optimizer state.

pimm's split ``last/`` (``weights.pth`` + ``trainer.dcp/``) and one-file
``model_last.pth`` are read by ``pimm_fn.compat.reading``, safely (``weights_only``).
``PIMM_CHECKPOINTS`` (``HANDLERS``' ``LoadWeights`` handler) is the reader a
resume asks (``pimm_fn.checkpoint.discovery``) and carries out pimm's warm starts.

A resume translates the checkpoint into a pimm_fn checkpoint (legacy
format, under ``model/.staging-pimm-import/``, which the run's first save
removes) and resumes from that, with pimm's translation of its counters
(``pimm_fn.compat.checkpoints``):

* at an epoch boundary (pimm's ``iter_in_epoch == 0``, as every deferred
  epoch-end save is): after epoch ``epoch - 1``, at ``global_step``, the RNG
  restored; the next epoch runs exactly as in pimm_fn;
* mid-epoch: the cursor cannot be read, so, as pimm does without one, the
  epoch restarts from its first batch with ``global_step = epoch *
  iters_per_epoch`` (a ``ResumeNotExactWarning`` says so);
* legacy (Pointcept-style) files (``PIMM.md`` 3.11): ``epoch`` ``E`` and
  ``iter`` ``i``; the run resumes at epoch ``E`` (``E - 1`` when ``0 < i <
  iters_per_epoch``), step ``epoch * iters_per_epoch``, no RNG restored.
  Such a file records no steps per epoch, and pimm takes its loader's
  length: so does ``loop(resume=...)``, with this run's steps per epoch
  (``len(train_data)``), saying so in one console line.

Otherwise steps per epoch come from the counters (``global_step / epoch``);
``translate`` alone takes a legacy file's from the scheduler's step count,
or from its ``iters_per_epoch=``. The epochs to train come from the
scheduler's ``total_steps`` or ``max_epochs=``, and ``loop(max_epochs=)``
always sets the budget. What cannot be translated is refused with a
``PimmCheckpointError`` saying why: a weights-only file, an incomplete
directory, another world size, an unreadable payload.

Where a pimm checkpoint resumes: its counters (epoch, iter, global step) read as pimm_fn's ``Progress``.

pimm's rules (``PIMM.md`` 3.11, see ``pimm_fn.compat.checkpoints``): at an
epoch boundary the next epoch runs as in pimm_fn; mid-epoch the epoch
restarts from its first batch; a legacy file's steps per epoch are the
resuming run's. Steps per epoch come from the counters, else the
scheduler's step count; what cannot be told is a ``PimmCheckpointError``.
"""

from __future__ import annotations

import math
import os
import pathlib
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from pimm_fn import checkpoint, dist
from pimm_fn.checkpoint.contents import PerRank, Replicated, SavedState, TrainerContents, to_parts
from pimm_fn.compat.effects import PIMM
from pimm_fn.compat.reading import PimmCheckpointError, pimm_source, read_pimm_checkpoint
from pimm_fn.compat.saving import PIMM_BEST
from pimm_fn.compat.warm_start import load_pimm_weights, remap_pimm_weights
from pimm_fn.core.effects import LoadWeights
from pimm_fn.core.slots import Keyed
from pimm_fn.core.state import Progress, State
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.errors import ResumeNotExactWarning
from pimm_fn.runtime.handlers import dispatch as runtime_handlers
from pimm_fn.runtime.step.rng import capture_rng

__all__ = [
    "resume_progress",
    "is_legacy",
    "legacy_line",
    "item",
    "nested_state",
    "translate",
    "PimmCheckpoints",
    "PIMM_CHECKPOINTS",
]


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
    if isinstance(trainer, Mapping):  # not is_legacy(payload)
        i = trainer.get("iter_in_epoch", trainer.get("iteration", trainer.get("iter", 0)))
        return (
            int(item(trainer.get("epoch", 0))),
            int(item(i or 0)),
            int(item(trainer.get("global_step", 0))),
            int(item(trainer.get("samples_seen", 0))),
            False,
        )
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


def resume_progress(
    payload: Mapping, where, iters_per_epoch, max_epochs, run_steps=None
) -> tuple[Progress, str, str | None]:
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
            note = (
                f"{where}: legacy checkpoint is mid-epoch (epoch={epoch}, iter={i}) and has no dataloader state; "
                f"epoch {start} restarts from its first batch"
            )
        step = start * ipe
    elif 0 < i < ipe:
        start = epoch
        note = (
            f"{where}: checkpoint is mid-epoch (epoch {epoch}, step {i} of {ipe}) and its dataloader state is a "
            f"pickle pimm_fn does not load; resuming from the beginning of the saved epoch and replaying "
            f"already-completed batches (global_step {step} -> {epoch * ipe}), as pimm does without a cursor"
        )
        step = epoch * ipe
    else:
        start = epoch + (1 if i >= ipe else 0)
    scheduler = payload.get("scheduler")
    horizon = scheduler.get("total_steps") if isinstance(scheduler, Mapping) else None
    horizon = horizon if horizon is not None else (nested_state(scheduler) or {}).get("total_steps")
    epochs = (
        max_epochs if max_epochs is not None else _exact(item(horizon), ipe) if isinstance(item(horizon), int) else None
    )
    epochs = max(epochs if epochs is not None else start, start)
    if start == 0:
        return Progress(ipe, epochs, 0, 0, 0, samples), "BeforeTrain", note
    assert step is not None  # None only from a legacy file's counters, and set above for one
    return Progress(ipe, epochs, start - 1, ipe, step, samples), "AfterEpoch", note


def legacy_line(path, payload, progress: Progress, position: str) -> str:
    """The console line saying a legacy file resumes with this run's steps per epoch, and where."""
    epoch, i = item(payload["epoch"]), item(payload.get("iter") or 0)
    at = progress.epoch + 1 if position == "AfterEpoch" else 0
    return (
        f"{path} is pimm's legacy checkpoint (epoch={epoch}, iter={i}), which does not record its steps per "
        f"epoch: taking this run's steps per epoch, {progress.iters_per_epoch}, as pimm takes its loader's "
        f"length; resuming at epoch {at}, global_step {progress.global_step}"
    )


IMPORT = ".staging-pimm-import"  # where a resume's translation goes, in the run's model/; the first save removes it


# -- translation ----------------------------------------------------------------------------------------------------
def _positional_optimizer(saved):
    """pimm's optimizer entry as ``optimizer.state_dict()`` takes it: FQN keys numbered in param-group order."""
    if saved is None:
        return None
    sd = saved.get("state_dict", saved) if isinstance(saved, Mapping) and "param_groups" not in saved else saved
    if sd is None:
        return None
    if not isinstance(sd, Mapping) or "param_groups" not in sd:
        raise PimmCheckpointError(f"the checkpoint's optimizer state has no param_groups (got {sorted(sd)[:6]})")
    ids: dict = {}
    groups = []
    for group in sd["param_groups"]:
        params = []
        for p in group["params"]:
            ids.setdefault(p, p if isinstance(p, int) else len(ids))
            params.append(ids[p])
        groups.append({**group, "params": params})
    return {"state": {ids.get(k, k): dict(v) for k, v in (sd.get("state") or {}).items()}, "param_groups": groups}


def _rng(entry, world: int, rank: int, where) -> dict:
    """This rank's pimm RNG state as pimm_fn's ``capture_rng`` keeps it; the process's own when the checkpoint has none."""
    state = (entry or {}).get("state") if isinstance(entry, Mapping) and "state" in (entry or {}) else entry
    if not state:
        return capture_rng()  # pimm restores none here either (legacy files)
    states = state["states"] if isinstance(state, Mapping) and "states" in state else [state]
    saved_world = state.get("world_size", len(states)) if isinstance(state, Mapping) else len(states)
    if saved_world != world or rank >= len(states):
        raise PimmCheckpointError(
            f"{where}: RNG state was saved with world_size={saved_world}, but current world_size={world}. Resume "
            f"it with {saved_world} rank(s), or warm-start from its weights (CheckpointLoader / checkpoint_loader)"
        )
    own = states[rank]
    version, internal, gauss = own["python"]
    kind, keys, pos, has_gauss, cached = own["numpy"]
    found = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": own["torch"],
    }
    if own.get("torch_cuda"):
        found["cuda"] = list(own["torch_cuda"])
    return found


def translate(
    path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    iters_per_epoch: int | None = None,
    max_epochs: int | None = None,
    run_steps: int | None = None,
    say: Callable[[str], None] | None = None,
) -> checkpoint.CheckpointInfo:
    """Write the pimm checkpoint at ``path`` as a pimm_fn checkpoint in ``out_dir``; returns its ``CheckpointInfo``.

    Collective in a process group (every rank calls it; each translates its
    own RNG state, rank 0 writes ``out_dir/last.pth``). Resume from it with
    ``loop(resume=info.path)``; ``loop(resume=path, handlers=HANDLERS)`` on the
    pimm checkpoint itself does this for you (``PimmCheckpoints.resume_from``).

    Args:
        path: a pimm checkpoint (``last/``, ``model_last.pth``, ...).
        out_dir: the directory to write into (its ``last.pth``).
        iters_per_epoch: steps per epoch, when the checkpoint cannot tell them.
        max_epochs: pimm's ``cfg.epoch`` (default: from the scheduler's ``total_steps``).
        run_steps: the resuming run's steps per epoch (``len(train_data)``):
            a legacy file's, which records none, as pimm takes its loader's
            length; said through ``say`` (a console line).

    Warns:
        ResumeNotExactWarning: a mid-epoch checkpoint restarts its epoch.

    Raises:
        PimmCheckpointError: what cannot be translated, and why.
    """
    path = pathlib.Path(path)
    ckpt = read_pimm_checkpoint(path)
    payload = ckpt.payload
    progress, position, note = resume_progress(payload, path, iters_per_epoch, max_epochs, run_steps)
    if run_steps is not None and iters_per_epoch is None and is_legacy(payload) and say is not None:
        say(legacy_line(path, payload, progress, position))
    if note is not None:
        warnings.warn(note, ResumeNotExactWarning, stacklevel=2)
    trainer = payload.get("trainer")
    trainer = trainer if isinstance(trainer, Mapping) else {}
    best = item(trainer["best_metric_value"] if "best_metric_value" in trainer else payload.get("best_metric_value"))
    finite = isinstance(best, (int, float)) and not isinstance(best, bool) and math.isfinite(best)
    state = State(
        progress,
        rank=dist.rank(),
        world_size=dist.world_size(),
        position=position,
        best={PIMM_BEST: float(best)} if finite else {},
    )
    saved = SavedState(state, Keyed(()))
    scaler = payload.get("scaler")
    scaler = nested_state(scaler) if not isinstance(scaler, Mapping) or scaler.get("enabled", True) else None
    cursor: dict[str, Any] = {"epoch_start": None, "generator": None, "samplers": [], "rest": None, "data": None}
    rng = _rng(payload.get("rng"), dist.world_size(), dist.rank(), path)
    optimizer = _positional_optimizer(payload.get("optimizer"))
    if optimizer is None:
        raise PimmCheckpointError(
            f"{path} holds no optimizer state: a resume would restart the optimizer's moments. Warm-start a fresh "
            f"run from its weights instead (CheckpointLoader with weight={str(path)!r}, or pf.load_weights)"
        )
    replicated = Replicated(optimizer, nested_state(payload.get("scheduler")), scaler, saved)
    trainer_part, local = to_parts(TrainerContents(replicated, PerRank(saved, rng, cursor)))
    return checkpoint.save_checkpoint(
        out_dir, step=progress.global_step, weights=ckpt.weights, trainer=trainer_part, local=local, format="legacy"
    )


class PimmCheckpoints:
    """pimm's checkpoints in a run: warm starts in pimm's dialect, and resumes from pimm's layouts.

    ``HANDLERS`` holds one as its ``LoadWeights`` handler, so a run given
    ``handlers=compat.HANDLERS`` can do both:

    * as a handler (``__call__``) it carries out a ``LoadWeights`` in pimm's
      dialect (``CheckpointLoader``: the weights found and renamed as pimm
      does, through pimm_fn's one engine, ``remap_state_dict``) and hands
      pimm_fn's own warm starts to pimm_fn's handler;
    * as a reader (``pimm_fn.checkpoint.discovery``) it lets
      ``loop(resume=<path or "auto">)`` resume pimm's ``last/`` and
      ``model_last.pth``: the resume asks ``recognise`` on rank 0 only where
      pimm_fn's own discovery found nothing, and ``resume_from`` translates.
      A fresh start into a ``save_dir`` holding pimm's checkpoints is refused,
      as over pimm_fn's own.
    """

    name = "pimm"

    def __call__(self, effect: LoadWeights, state, ctx) -> tuple:
        if effect.dialect != PIMM:
            return runtime_handlers.load_weights(effect, state, ctx)
        module = unwrap(ctx.model)
        source = load_pimm_weights(effect.path)
        target = module.state_dict()
        remapped, skipped = remap_pimm_weights(source, effect.replacements, target, strict=effect.strict)
        result = module.load_state_dict(remapped, strict=effect.strict)
        missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
        ctx.say(
            f"Loaded {len(target) - len(missing)}/{len(target)} model params from {effect.path} "
            f"(missing: {len(missing)}, unexpected: {len(unexpected)})"
        )
        if skipped:
            ctx.say(f"Skipped {len(skipped)} shape-mismatched key(s), kept at init: {', '.join(skipped[:8])}")
        if missing:
            ctx.say(f"missing keys: {', '.join(missing[:12])}{' ...' if len(missing) > 12 else ''}")
        return ()

    def recognise(self, path) -> pathlib.Path | None:
        """The pimm checkpoint ``path`` names (``pimm_source``), local and without a collective."""
        return pimm_source(path)

    def resume_from(self, found, model_dir, *, iters_per_epoch: int | None = None, say=None):
        """``found`` translated under ``model_dir`` (which the run's first save clears), for the resume to read.

        ``iters_per_epoch``: the run's steps per epoch, which a legacy file is
        resumed with (pimm's rule), saying so through ``say``. Collective.

        Raises:
            PimmCheckpointError: a pimm checkpoint that cannot be translated.
        """
        out = model_dir / IMPORT if model_dir is not None else pathlib.Path(dist.run_on_main(tempfile.mkdtemp)) / IMPORT
        return translate(found, out, run_steps=iters_per_epoch, say=say)

    def __repr__(self):
        return "PimmCheckpoints()"


PIMM_CHECKPOINTS = PimmCheckpoints()
