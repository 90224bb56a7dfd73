"""``loop()``'s arguments, checked before anything is built, loaded or written.

Each check fails with what was wrong and how to fix it, at construction
rather than at the first save (which may be hours in).
"""

import os

from pimm_fn.core import budget
from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import SaveCheckpoint, WriteBest

__all__ = [
    "check_resume", "check_max_epochs", "check_budget", "check_save_dir", "check_on_nonfinite",
    "check_resume_hyperparameters",
    "best_metrics", "check_sharding",
]


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


def check_save_dir(hooks, save_dir) -> None:
    """A hook that writes checkpoints or best weights needs ``save_dir``."""
    if save_dir is not None:
        return
    writers = [d.key for d in map(protocol.declared, protocol.leaves(hooks)) if d.may_emit((SaveCheckpoint, WriteBest))]
    if writers:
        raise ValueError(
            f"loop: hook(s) {', '.join(writers)} write checkpoints or best weights, but save_dir is None: "
            f"pass save_dir='runs/my_run' (or drop those hooks)"
        )


def check_on_nonfinite(on_nonfinite, *, custom_step: bool) -> None:
    """``on_nonfinite`` is ``"raise"``, ``"skip"`` or ``"warn"``; ``"skip"`` needs the default step.

    A custom ``step_fn`` reports its loss after its optimizer step ran, too
    late to leave the batch out of the update.

    >>> check_on_nonfinite("ignore", custom_step=False)
    Traceback (most recent call last):
    ValueError: loop: 'on_nonfinite' must be 'raise', 'skip' or 'warn' (got 'ignore')
    """
    if not isinstance(on_nonfinite, str) or on_nonfinite not in ("raise", "skip", "warn"):
        raise ValueError(f"loop: 'on_nonfinite' must be 'raise', 'skip' or 'warn' (got {on_nonfinite!r:.80})")
    if on_nonfinite == "skip" and custom_step:
        raise ValueError(
            "loop: on_nonfinite='skip' needs the default step: a custom step_fn has already applied its "
            "optimizer step when the loop sees its 'loss'. Skip inside your step_fn (check the loss before "
            "optimizer.step()), or pass on_nonfinite='raise' or 'warn'"
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


def best_metrics(hooks) -> tuple:
    """The metrics whose best weights the hooks write, in hook order (``best_on``'s metrics)."""
    found = []
    for declared in map(protocol.declared, protocol.leaves(hooks)):
        if declared.may_emit(WriteBest):
            found.extend(m for m in declared.reads_metrics if m not in found)
    return tuple(found)


def check_sharding(shards: bool, *, ddp: bool, checkpoint_format: str, weights_file) -> None:
    """A sharded (FSDP2) model needs no DDP wrapper and the standard (DCP) checkpoint format."""
    if not isinstance(weights_file, bool):
        raise TypeError(f"loop: 'weights_file' must be True or False (got {weights_file!r:.80})")
    if not shards:
        return
    if ddp:
        raise ValueError(
            "loop: the model is sharded (its parameters are DTensors, as fully_shard makes them) and ddp=True asks to "
            "wrap it in DistributedDataParallel as well: drop ddp=True, FSDP2 already synchronizes the gradients"
        )
    if checkpoint_format != "standard":
        raise ValueError(
            "loop: a sharded model is checkpointed shard by shard through DCP, in the standard format; "
            f"checkpoint_format={checkpoint_format!r} writes one gathered file: use checkpoint_format='standard'"
        )
