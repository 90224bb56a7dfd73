"""What refuses a resume, checked before the model, optimizer or RNG is touched: ``ResumeError`` and its checks.

A sound checkpoint that cannot be resumed as asked is a ``ResumeError``
(other optimizers, another class of optimizer or scheduler, a sharded model
from a replicated checkpoint); one whose contents contradict themselves (a
sharded claim its files do not hold, RNG states that do not restore) is a
``CheckpointError``. ``pimm_fn.runtime.resume.restore`` asks each before it
loads anything, so a refused resume changes nothing.
"""

from pimm_fn import dist
from pimm_fn.checkpoint import sharded
from pimm_fn.checkpoint.errors import CheckpointError
from pimm_fn.checkpoint.inspection import TRAINER
from pimm_fn.runtime import class_change
from pimm_fn.runtime.rng import rng_problem

__all__ = ["ResumeError", "check_sharding", "check_weights", "rng_error", "check_optimizers", "changed_classes"]


class ResumeError(RuntimeError):
    """A sound checkpoint cannot be resumed as asked (other hooks, optimizers, world size under ``strict``).

    A damaged one is a ``pimm_fn.CheckpointError`` instead: the fix there is another checkpoint, here another run setup.
    """


def check_sharding(replicated, ctx, info) -> None:
    """What the checkpoint says of its model is what it holds, and fits this run: checked before anything loads.

    A sharded model resumes from shards (written by a sharded model of any
    world size), never from a weights file; a sharded checkpoint resumes into
    a replicated model too (its shards read into it). The claim itself is
    checked against the DCP metadata: shards claimed are there, as tensors.
    """
    if info.format != "standard" and replicated.sharded:
        raise CheckpointError(info.path, info.path.name, "says its model was sharded, but a legacy file holds no "
                              "shards: its trainer part was altered")
    if info.format == "standard":
        sharded.check_claim(info.path, replicated.sharded)
    if ctx.sharded and not replicated.sharded:
        raise ResumeError(
            f"cannot resume this sharded model from {info.path}: that checkpoint was written by a replicated "
            f"(unsharded) model, whose optimizer state is keyed by parameter position. Resume it with the model "
            f"unsharded, or start the sharded run from its weights (load_weights({str(info.path)!r}))"
        )
    rest = replicated.optimizer
    if replicated.sharded and not (isinstance(rest, dict) and isinstance(rest.get("state"), dict)
                                   and isinstance(rest.get("param_groups"), (list, type(None)))):
        raise CheckpointError(info.path, TRAINER, "says its model was sharded, but its optimizer part is not "
                              "the state and param groups a sharded save writes: its trainer part was altered")


def check_weights(model, weights, info) -> None:
    """The checkpoint's weights are this model's names and shapes: else a ``ResumeError`` naming the difference.

    Asked before the optimizers load, so that a model built otherwise than
    the one that wrote the checkpoint (another layer, another width) leaves
    the run as it was built, and is said as the setup it is.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    shapes = [f"{k}: {list(weights[k].shape)} saved, {list(v.shape)} here" for k, v in own.items()
              if k in weights and hasattr(v, "shape") and hasattr(weights[k], "shape") and v.shape != weights[k].shape]
    if not (missing or unexpected or shapes):
        return
    parts = [f"{what} {', '.join(map(str, keys[:5]))}{' ...' if len(keys) > 5 else ''}"
             for what, keys in (("missing", missing), ("unexpected", unexpected), ("other shapes", shapes)) if keys]
    raise ResumeError(
        f"cannot resume from {info.path}: its weights do not fit this run's {type(model).__name__} "
        f"({'; '.join(parts)}). Build the model the checkpoint was written with, or start fresh from its weights "
        f"(load_weights({str(info.path)!r}, replacements=...) maps renamed keys)"
    )


def rng_error(local, info) -> CheckpointError | None:
    """This rank's saved RNG states do not restore (tried on scratch generators): the error, before anything loads."""
    problem = None if local is None else rng_problem(local.rng)
    if problem is None:
        return None
    return CheckpointError(info.path, TRAINER, f"holds RNG states of rank {dist.rank()} that do not restore "
                           f"({problem}): the checkpoint was not written by pimm_fn, or was altered")


def check_optimizers(replicated, ctx, info) -> None:
    """The checkpoint holds one optimizer for a run of one, the same names for a run of several named ones."""
    saved = None if replicated.optimizers is None else sorted(replicated.optimizers)
    wanted = None if ctx.optimizers is None else sorted(ctx.optimizers)
    if saved == wanted:
        return
    said = lambda names: "one optimizer (optimizer=)" if names is None else f"optimizers {names} (optimizer={{...}})"
    raise ResumeError(
        f"cannot resume from {info.path}: it holds the state of {said(saved)}, this run has {said(wanted)}. "
        f"Build the run with the optimizers the checkpoint was written with, or start fresh from its weights "
        f"(load_weights({str(info.path)!r}))"
    )


def changed_classes(replicated, ctx, info, winner) -> tuple:
    """The optimizers and scheduler of another class than the checkpoint's: fresh under ``"new"``, else refused."""
    changed = class_change.changes(replicated, ctx)
    if changed and winner != "new":
        raise ResumeError(class_change.refusal(changed, info.path))
    unfit = None if any(c.what == "scheduler" for c in changed) else class_change.unfit_scheduler_state(replicated, ctx)
    if unfit is not None:
        raise ResumeError(f"cannot resume from {info.path}: {unfit}")
    return changed
