"""``loop()``'s arguments, ``save_dir`` among them, checked before anything is built, loaded or written.

Each check fails with what was wrong and how to fix it, at construction
rather than at the first save (which may be hours in). The checks of type
and range are the validators of ``pimm_fn.core.validate`` (``ARGUMENTS``
lists loop()'s); what needs torch or the file system (a save_dir that is a
file, a model_best a fresh run would replace) is checked in
``pimm_fn.runtime.engine.arguments``, the rest here.

Whether ``save_dir`` suits a run, checked before anything is written there.

A path, not a file; present when a hook writes checkpoints or best weights;
and for a fresh run, free of an earlier run's best weights, which its first
evaluation would replace (``resume='auto'`` starting fresh beside them is
said, not refused); on a store with buckets, in a bucket that exists
(created only when ``Saving(create_bucket=True)`` asks). The lock on it is
``pimm_fn.checkpoint.lock``'s; whether every rank that writes can write there,
``pimm_fn.checkpoint.files``'s.
"""

import os
from collections.abc import Mapping

import torch

from pimm_fn import dist
from pimm_fn.checkpoint import CheckpointStorageError, storage
from pimm_fn.core import budget
from pimm_fn.core import hook as protocol
from pimm_fn.core import validate as v
from pimm_fn.core.effects import Effect, SaveCheckpoint, WriteBest

__all__ = [
    "ARGUMENTS",
    "check_arguments",
    "check_model",
    "check_optimizer",
    "check_scheduler",
    "check_train_data",
    "check_resume",
    "check_max_epochs",
    "check_budget",
    "check_on_nonfinite",
    "check_resume_hyperparameters",
    "check_sharding",
    "check_best_trackers",
    "check_trains_model",
    "check_save_dir",
    "check_bucket",
    "check_fresh_save_dir",
    "replaced_best",
]


# loop()'s plain arguments and what each must be, and the fields of its options that share a check
# (pimm_fn.runtime.engine.options); the others are checked by the functions below.
ARGUMENTS = {
    "step_fn": v.optional(
        v.is_callable.with_hint(
            "pass step_fn(model, optimizer, batch, *, scheduler=None, scaler=None) -> outputs, or pimm_fn.TrainStep(...)"
        )
    ),
    "scheduler": v.optional(
        v.has_methods(
            "step",
            "state_dict",
            "load_state_dict",
            expected="a learning-rate scheduler",
        ).with_hint("pass a torch.optim.lr_scheduler instance built on the optimizer")
    ),
    "scaler": v.optional(
        v.has_methods(
            "scale",
            "step",
            "update",
            "state_dict",
            "load_state_dict",
            expected="a GradScaler",
        ).with_hint("pass torch.amp.GradScaler(...), or TrainStep(precision='fp16') to have one made")
    ),
    "iters_per_epoch": v.optional(v.int_at_least(1).with_hint("leave it None for len(train_data)")),
    "check_agreement": v.optional(v.is_bool.with_hint("pass None (on with a process group), True or False")),
    "handlers": v.optional(
        v.mapping_of(
            v.subclass_of(Effect),
            v.is_callable,
            expected="a dict of effect types to handlers",
        ).with_hint("e.g. {SaveCheckpoint: handler(effect, state, ctx)}")
    ),
    "config": v.optional(v.instance_of(Mapping, expected="a mapping of settings")),
    "keep_trace": v.optional(v.int_at_least(0).with_hint("None keeps every executed effect in run.trace")),
}


def check_arguments(**arguments) -> None:
    """Check each of loop()'s ``arguments`` named in ``ARGUMENTS`` (others are left to their own checks).

    >>> check_arguments(iters_per_epoch=0)
    Traceback (most recent call last):
    ValueError: loop: 'iters_per_epoch' must be None or an int >= 1 (got 0); leave it None for len(train_data)
    >>> check_arguments(step_fn="train_step")
    Traceback (most recent call last):
    TypeError: loop: 'step_fn' must be None or callable (got 'train_step'); pass step_fn(model, optimizer, batch, *, scheduler=None, scaler=None) -> outputs, or pimm_fn.TrainStep(...)
    """
    for name, value in arguments.items():
        validator = ARGUMENTS.get(name)
        if name == "scheduler":
            check_scheduler(value)
        elif validator is not None:
            validator.check(value, name, owner="loop")


def check_model(model) -> None:
    """``model`` is a ``torch.nn.Module`` (wrapped in DDP or sharded by FSDP2 alike)."""
    if not isinstance(model, torch.nn.Module):
        raise v.invalid(
            "loop",
            "model",
            "a torch.nn.Module",
            model,
            error=TypeError,
            hint="loop(model, optimizer, train_data, ...) takes the model first",
        )


def check_optimizer(optimizer) -> None:
    """``optimizer``, when given alone, is an optimizer: a ``torch.optim.Optimizer`` or one that steps and checkpoints alike.

    A dict of named optimizers is checked by ``pimm_fn.runtime.step.stateful_objects``.
    """
    if optimizer is None or isinstance(optimizer, (torch.optim.Optimizer, Mapping)):
        return
    v.has_methods("step", "zero_grad", "state_dict", "load_state_dict", expected="a torch.optim.Optimizer").with_hint(
        "build one on the model's parameters, e.g. torch.optim.SGD(model.parameters(), lr=0.1)",
    ).check(optimizer, "optimizer", owner="loop")


def check_scheduler(scheduler) -> None:
    """``scheduler`` is ``None`` or a learning-rate scheduler (an optimizer has ``step()`` too: refused by name)."""
    if isinstance(scheduler, torch.optim.Optimizer):
        raise v.invalid(
            "loop",
            "scheduler",
            "None or a learning-rate scheduler",
            scheduler,
            error=TypeError,
            hint="that is an optimizer: build a scheduler on it, e.g. "
            "torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)",
        )
    ARGUMENTS["scheduler"].check(scheduler, "scheduler", owner="loop")


def check_train_data(train_data) -> None:
    """``train_data`` is given and can be iterated."""
    if train_data is None:
        raise TypeError("loop: 'train_data' is missing: loop(model, optimizer, train_data, ...)")
    if isinstance(train_data, (str, bytes, Mapping)) or not (
        hasattr(train_data, "__iter__") or hasattr(train_data, "__getitem__")
    ):
        raise v.invalid(
            "loop", "train_data", "an iterable of batches (a DataLoader, a list...)", train_data, error=TypeError
        )


def check_resume(resume) -> None:
    """``resume`` must be ``None``, ``"auto"`` or a checkpoint path.

    >>> check_resume(True)
    Traceback (most recent call last):
    TypeError: loop: 'resume' must be None (a fresh run), 'auto' (the latest checkpoint in save_dir, else fresh) or a checkpoint path (got True)
    """
    if resume is None or resume == "auto":
        return
    if isinstance(resume, (str, os.PathLike)) and not isinstance(resume, bool):
        if not str(os.fspath(resume)):
            raise ValueError("loop: 'resume' is an empty path: pass None, 'auto' or a checkpoint path")
        return
    raise TypeError(
        f"loop: 'resume' must be None (a fresh run), 'auto' (the latest checkpoint in save_dir, else fresh) "
        f"or a checkpoint path (got {resume!r:.80})"
    )


def check_max_epochs(max_epochs, *, fresh: bool) -> None:
    """``max_epochs`` is an int; a fresh run trains at least one epoch."""
    if not isinstance(max_epochs, int) or isinstance(max_epochs, bool):
        raise TypeError(f"loop: 'max_epochs' must be an int (got {max_epochs!r:.80})")
    if fresh and max_epochs < 1:
        raise ValueError(f"loop: 'max_epochs' must be >= 1 for a fresh run (got {max_epochs}): it would train nothing")


def check_budget(max_epochs, max_steps, *, fresh: bool) -> None:
    """Exactly one budget, an int: ``max_epochs`` (>= 1 for a fresh run) or ``max_steps`` (>= 1)."""
    if max_steps is None and max_epochs is not None:
        check_max_epochs(max_epochs, fresh=fresh)
        return
    if max_steps is not None and (not isinstance(max_steps, int) or isinstance(max_steps, bool)):
        raise TypeError(f"loop: 'max_steps' must be an int (got {max_steps!r:.80})")
    budget.check_budget(max_epochs, max_steps, caller="loop")


def check_on_nonfinite(on_nonfinite, *, custom_step: bool) -> None:
    """``on_nonfinite`` is ``"raise"``, ``"skip"`` or ``"warn"``; ``"skip"`` needs a built-in step.

    The default step and a ``TrainStep`` read the loss before the update; a
    custom ``step_fn`` reports it after its optimizer step ran, too late to
    leave the batch out of the update.

    >>> check_on_nonfinite("ignore", custom_step=False)
    Traceback (most recent call last):
    ValueError: loop: 'on_nonfinite' must be 'raise', 'skip' or 'warn' (got 'ignore')
    """
    if not isinstance(on_nonfinite, str) or on_nonfinite not in ("raise", "skip", "warn"):
        raise ValueError(f"loop: 'on_nonfinite' must be 'raise', 'skip' or 'warn' (got {on_nonfinite!r:.80})")
    if on_nonfinite == "skip" and custom_step:
        raise ValueError(
            "loop: on_nonfinite='skip' needs a built-in step (the default one, or pimm_fn.TrainStep(...)): a custom "
            "step_fn has already applied its optimizer step when the loop sees its 'loss'. Skip inside your step_fn "
            "(check the loss before optimizer.step()), or pass Training(on_nonfinite='raise') or 'warn'"
        )


def check_resume_hyperparameters(value) -> None:
    """``resume_hyperparameters`` is ``"checkpoint"`` or ``"new"``.

    >>> check_resume_hyperparameters("user")
    Traceback (most recent call last):
    ValueError: loop: 'resume_hyperparameters' must be 'checkpoint' (the checkpoint's optimizer hyper-parameters win) or 'new' (this run's optimizer's win) (got 'user')
    """
    if not isinstance(value, str) or value not in ("checkpoint", "new"):
        raise ValueError(
            f"loop: 'resume_hyperparameters' must be 'checkpoint' (the checkpoint's optimizer hyper-parameters "
            f"win) or 'new' (this run's optimizer's win) (got {value!r:.80})"
        )


def check_sharding(shards: bool, *, ddp: bool, checkpoint_format: str, weights_file) -> None:
    """A sharded (FSDP2) model needs no DDP wrapper and the standard (DCP) checkpoint format."""
    if not isinstance(weights_file, bool):
        raise TypeError(f"loop: 'weights_file' must be True or False (got {weights_file!r:.80})")
    if not shards:
        return
    if ddp:
        raise ValueError(
            "loop: the model is sharded (its parameters are DTensors, as fully_shard makes them) and Parallel(ddp=True) asks to "
            "wrap it in DistributedDataParallel as well: drop ddp=True, FSDP2 already synchronizes the gradients"
        )
    if checkpoint_format != "standard":
        raise ValueError(
            "loop: a sharded model is checkpointed shard by shard through DCP, in the standard format; "
            f"Saving(checkpoint_format={checkpoint_format!r}) writes one gathered file: use checkpoint_format='standard' "
            f"(Saving's default)"
        )


def check_best_trackers(hooks) -> None:
    """One hook writes the best weights of a metric: two would write one file twice and share one ``State.best``.

    Two ``best_on`` of a metric (``mode="max"`` and ``"min"``), or a pimm
    ``CheckpointSaver`` beside ``pf.best_on`` of its metric, are refused.

    >>> from pimm_fn.hooks import best_on
    >>> check_best_trackers([best_on("acc"), best_on("acc", mode="min")])
    Traceback (most recent call last):
    ValueError: loop: best_on('acc') and best_on('acc', mode='min') both track the best 'acc' and write its best weights, which one metric has once (one model_best file, one State.best value): keep one of them
    """
    writers: dict = {}
    for d in map(protocol.declared, protocol.leaves(hooks)):
        if d.may_emit(WriteBest):
            for metric in d.reads_metrics:
                writers.setdefault(metric, []).append(d.key)
    for metric, keys in writers.items():
        if len(keys) > 1:
            raise ValueError(
                f"loop: {' and '.join(keys)} both track the best {metric!r} and write its best weights, which one "
                f"metric has once (one model_best file, one State.best value): keep one of them"
            )


def _parameters(optimizer) -> list:
    groups = getattr(optimizer, "param_groups", None) or ()
    return [p for group in groups for p in group.get("params", ())]


def check_trains_model(model, optimizers) -> None:
    """Some optimizer holds some of the model's parameters: else training would leave the model as it is.

    ``optimizers`` is ``{name: optimizer}``. An optimizer over a part of the
    model (a fine-tuned head) passes; only one holding none of them, as one
    built on another model's parameters (or before ``model`` was rebuilt), is
    refused. A model wrapped in DDP, sharded by FSDP or compiled exposes the
    same parameter objects its optimizer was built on.
    """
    own = {id(p) for p in model.parameters()}
    held = [p for optimizer in optimizers.values() for p in _parameters(optimizer)]
    if not own or not held or any(id(p) in own for p in held):
        return
    names = ", ".join(optimizers) if len(optimizers) > 1 else "the optimizer"
    raise ValueError(
        f"loop: {names} holds {len(held)} parameter tensor(s), none of them the model's ({len(own)}): training would "
        f"never change the model. Build the optimizer on this model's parameters, e.g. "
        f"torch.optim.SGD(model.parameters(), lr=0.1), after the model is built (and before loop())"
    )


def check_save_dir(hooks, save_dir) -> None:
    """``save_dir`` is a path that is not a file; a hook that writes checkpoints or best weights needs one.

    >>> check_save_dir([], 1)
    Traceback (most recent call last):
    TypeError: loop: 'save_dir' must be None or a directory path, a str or os.PathLike (got 1)
    """
    if save_dir is not None:
        if isinstance(save_dir, bool) or not isinstance(save_dir, (str, os.PathLike)) or not os.fspath(save_dir):
            raise v.invalid(
                "loop", "save_dir", "None or a directory path, a str or os.PathLike", save_dir, error=TypeError
            )
        if storage.is_url(save_dir):
            storage.location(save_dir)  # an unknown scheme or a missing package: refused before anything is written
            return
        path = os.fspath(save_dir)
        for place in (path, os.path.join(path, "model")):
            if os.path.exists(place) and not os.path.isdir(place):
                raise NotADirectoryError(
                    f"loop: save_dir {path!r} {'is' if place == path else 'holds model, which is'} a file, not a "
                    f"directory: pass a directory (it will hold model/ and log.jsonl)"
                )
        return
    writers = [d.key for d in map(protocol.declared, protocol.leaves(hooks)) if d.may_emit((SaveCheckpoint, WriteBest))]
    if writers:
        raise ValueError(
            f"loop: hook(s) {', '.join(writers)} write checkpoints or best weights, but save_dir is None: "
            f"pass save_dir='runs/my_run' (or drop those hooks)"
        )


def check_bucket(save_dir, *, create: bool, say) -> None:
    """A ``save_dir`` on a store with buckets is in one that exists, or one created because ``create`` asks.

    Rank 0 looks (and creates); every rank gets its answer. A store without
    buckets (``memory://``) and a local path have nothing to check.

    Raises:
        CheckpointStorageError: (on every rank) the bucket does not exist, naming it; nothing was written.
    """
    bucket = save_dir.bucket if storage.is_store(save_dir) else None
    if bucket is None:
        return

    def look() -> bool:
        if bucket.bucket_exists():
            return False
        if not create:
            raise CheckpointStorageError(
                f"loop: save_dir {str(save_dir)!r}: {bucket.missing_bucket(save_dir, done='this run wrote nothing')}"
            )
        bucket.make_bucket()
        return True

    if dist.run_on_main(look, shared=(CheckpointStorageError,)):
        say(f"created the bucket {bucket} for save_dir {save_dir}, as Saving(create_bucket=True) asks")


def _best_files(save_dir) -> list[str]:
    """The best-weights files (``model_best*.pth``/``.json``) under ``save_dir/model``, sorted."""
    if storage.is_url(save_dir) or storage.is_store(save_dir):
        names = [p.name for p in (storage.location(save_dir) / "model").iterdir()]
    else:
        try:
            names = os.listdir(os.path.join(os.fspath(save_dir), "model"))
        except OSError:  # no such directory (yet): nothing to keep
            return []
    return sorted(n for n in names if n.startswith("model_best") and n.endswith((".pth", ".json")))


def check_fresh_save_dir(resume, save_dir) -> None:
    """A fresh run (``resume=None``) into a ``save_dir`` holding best weights is refused, as one holding checkpoints.

    Its first evaluation would replace ``model_best`` (kept, perhaps, after
    the checkpoints were deleted to save space) with a worse model.

    Raises:
        FileExistsError: naming the files and the fix.
    """
    if resume is not None or save_dir is None:
        return
    found = _best_files(save_dir)
    if found:
        raise FileExistsError(
            f"save_dir {os.fspath(save_dir)!r} already holds best weights ({', '.join(found)} in model/); a fresh run "
            f"would replace them with its first evaluation's. Pass resume='auto' to continue that run, move those "
            f"files away, or choose another save_dir"
        )


def replaced_best(save_dir) -> str | None:
    """What to say when ``resume='auto'`` starts fresh beside best weights it will replace (``None``: nothing there)."""
    found = _best_files(save_dir) if save_dir is not None else []
    if not found:
        return None
    return (
        f"resume='auto' found no checkpoint to resume in {os.fspath(save_dir)!r} and starts fresh, but model/ holds "
        f"{', '.join(found)} from an earlier run: this run's first best replaces them. Move them away to keep them"
    )
