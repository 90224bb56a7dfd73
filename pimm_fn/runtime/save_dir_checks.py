"""Whether ``save_dir`` suits a run, checked before anything is written there.

A path, not a file; present when a hook writes checkpoints or best weights;
and for a fresh run, free of an earlier run's best weights, which its first
evaluation would replace (``resume='auto'`` starting fresh beside them is
said, not refused); on a store with buckets, in a bucket that exists
(created only when ``Saving(create_bucket=True)`` asks). The lock on it is
``pimm_fn.runtime.lock``'s; whether every rank that writes can write there,
``pimm_fn.checkpoint.writable``'s.
"""

import os

from pimm_fn import dist
from pimm_fn.checkpoint import CheckpointStorageError, storage
from pimm_fn.core import hook as protocol
from pimm_fn.core import validate as v
from pimm_fn.core.effects import SaveCheckpoint, WriteBest

__all__ = ["check_save_dir", "check_bucket", "check_fresh_save_dir", "replaced_best"]


def check_save_dir(hooks, save_dir) -> None:
    """``save_dir`` is a path that is not a file; a hook that writes checkpoints or best weights needs one.

    >>> check_save_dir([], 1)
    Traceback (most recent call last):
    TypeError: loop: 'save_dir' must be None or a directory path, a str or os.PathLike (got 1)
    """
    if save_dir is not None:
        if isinstance(save_dir, bool) or not isinstance(save_dir, (str, os.PathLike)) or not os.fspath(save_dir):
            raise v.invalid("loop", "save_dir", "None or a directory path, a str or os.PathLike", save_dir,
                            error=TypeError)
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
            raise CheckpointStorageError(f"loop: save_dir {str(save_dir)!r}: "
                                         f"{bucket.missing_bucket(save_dir, done='this run wrote nothing')}")
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
