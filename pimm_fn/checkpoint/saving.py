"""Saving and loading whole checkpoints: the collective entry points, and ``Saving``, the options they read.

Standard format, in a process group (every rank calls, in this order)::

    rank 0: remove stale .staging-*, create .staging-last-<step>/   (shared)
    all   : agree on the packed trainer state                         (collective)
    all   : dcp.save(trainer + own local) into it                    (collective)
    rank 0: ... meanwhile model.pth on a second thread, fsynced
    rank 0: COMPLETE once both are durable, then publish, snapshot, prune  (shared)

A crash before ``COMPLETE`` leaves only an unfinished staging directory,
which discovery ignores and the next save deletes. Legacy format: locals are
gathered to rank 0, which writes ``last.pth`` atomically.

How a run saves: ``loop(saving=Saving(...))``, one frozen value the save handler reads.

*When* to save is the hooks' (``save_every``); *how* is this value's: the
checkpoint format, which ``iter_<step>`` snapshots to keep, whether a sharded
model's full weights are gathered into ``model.pth``, whether each file's
SHA-256 is recorded, and whether a store's missing bucket may be created. Each field keeps the name the keyword had when ``loop()``
took it directly, and is checked at construction with the same message.

>>> Saving(checkpoint_format="legacy")
Saving(checkpoint_format='legacy', keep=None, weights_file=True, digests=False, create_bucket=False)
>>> Saving(digests="yes")
Traceback (most recent call last):
TypeError: loop: 'digests' must be a bool (got 'yes'); pass True or False
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn import dist
from pimm_fn.checkpoint import files, storage, validation
from pimm_fn.checkpoint import publish as _publish
from pimm_fn.checkpoint import retention as _retain
from pimm_fn.checkpoint.contents import TrainerContents, to_parts
from pimm_fn.checkpoint.errors import SHARED
from pimm_fn.checkpoint.files import FORMATS, SAVED_FOR, CheckpointInfo
from pimm_fn.checkpoint.formats import one_file, standard
from pimm_fn.core import retention, validate

__all__ = [
    "LoadedCheckpoint",
    "load_checkpoint",
    "save_run",
    "save_checkpoint",
    "Saving",
]


@attrs.frozen(eq=False)
class LoadedCheckpoint:
    """What :func:`load_checkpoint` read on this rank.

    Attributes:
        info: the checkpoint that was read.
        weights: the model state_dict (CPU tensors); ``None`` when the
            checkpoint has no weights file (a sharded model's, saved with
            ``weights=None``: ``sharded.read_full_weights`` assembles them).
        trainer: the replicated trainer state, as saved.
        local: this rank's local state, or ``None`` when the checkpoint was
            written by fewer ranks and has no entry for this one.
    """

    info: CheckpointInfo
    weights: dict | None
    trainer: dict
    local: dict | None


def save_run(
    model_dir,
    step: int,
    contents: TrainerContents,
    weights: dict | None,
    *,
    background=None,
    format: str = "standard",
    snapshot: bool = False,
    keep=None,
    metrics: Mapping | None = None,
    digests: bool = False,
    saved_for: str | None = None,
) -> CheckpointInfo | None:
    """A run's save in one call: its ``TrainerContents`` split into parts and written, now or in the background.

    Collective, as :func:`save_checkpoint` is. With ``background`` (the run's
    :class:`~pimm_fn.checkpoint.background.BackgroundSaver`) the write goes on
    while training does and ``None`` is returned; otherwise the checkpoint is
    published before this returns, and its :class:`CheckpointInfo` is.
    """
    trainer, local = to_parts(contents)
    save = dict(
        step=step,
        weights=weights,
        trainer=trainer,
        local=local,
        snapshot=snapshot,
        sharded=contents.sharded,
        keep=keep,
        metrics=metrics,
        digests=digests,
    )  # what both ways of writing take alike
    if background is not None:
        background.save(model_dir, **save)
        return None
    return save_checkpoint(model_dir, **save, format=format, saved_for=saved_for)


def save_checkpoint(
    model_dir: str | os.PathLike,
    *,
    step: int,
    weights: dict,
    trainer: dict,
    local: dict,
    format: str = "standard",
    snapshot: bool = False,
    keep_snapshots: int | None = None,
    sharded: dict | None = None,
    keep: retention.Policy | None = None,
    metrics: Mapping | None = None,
    digests: bool = False,
    saved_for: str | None = None,
) -> CheckpointInfo:
    """Write a checkpoint and publish it atomically as ``last``.

    Collective in a process group: every rank calls it with its own ``local``.

    Args:
        model_dir: the checkpoint root (``save_dir/"model"``).
        step: the global step, ``>= 0``.
        weights: the model state_dict (replicated; rank 0's is written), or
            ``None`` to write no weights file (a sharded model's weights are
            then only its shards; see :mod:`pimm_fn.checkpoint.formats.sharded`).
        trainer: replicated nested state (optimizer, scheduler, scaler state
            dicts, plain values); must be identical on every rank.
        local: this rank's nested state (RNG states, data cursor, hook state).
        format: ``"standard"`` (``last/``) or ``"legacy"`` (``last.pth``).
        snapshot: also keep a copy as ``iter_<step>``.
        keep_snapshots: keep only the newest N ``iter_*`` snapshots (``keep=keep_last(N)``).
        sharded: this rank's shards of a sharded model and optimizer
            (``sharded.state``), written by DCP beside ``trainer``; exempt
            from the agreement check. Standard format only.
        keep: a retention policy (``pimm_fn.core.retention``: ``keep_last``,
            ``keep_every``, ``keep_best``, ``any_of``) applied to the complete
            ``iter_*`` snapshots after the publish; ``None`` keeps them all.
        metrics: the run's metrics at this save (main rank's), recorded in
            the marker for ``keep_best`` and ``python -m pimm_fn ls``; only
            finite numbers are kept.
        digests: also record each file's SHA-256 in the marker (standard
            format; the weights file is hashed as it is written, the others
            read once: ``benchmarks/RESULTS.md`` has the cost), checked by
            ``validation.validate(path, digests=True)``, which a resume and
            ``python -m pimm_fn verify`` use; sizes are always recorded.
        saved_for: why a save no hook asked for was made (``"SIGTERM"``,
            ``"max_time"``: ``pimm_fn.runtime.engine.preemption``), recorded in the
            marker as ``saved_for``.

    Returns:
        The published checkpoint (``last`` or ``last.pth``), on every rank.

    Raises:
        ValueError / TypeError: a bad argument, or state that cannot be saved.
        DiskFullError: (on every rank) the disk filled up; nothing was
            published and no staging directory is left.

    Example:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp()
        >>> info = save_checkpoint(d, step=5, weights={"w": torch.ones(2)},
        ...                        trainer={"lr": 0.1}, local={"seed": 1})
        >>> info.path.name, info.step, load_checkpoint(info).trainer
        ('last', 5, {'lr': 0.1})
    """
    _check_args(step, format, keep_snapshots, weights=weights, trainer=trainer, local=local, sharded=sharded)
    policy = retention.resolve(keep, keep_snapshots, caller="save_checkpoint")
    recorded: dict[str, object] | None = dict(retention.recordable(metrics)) if metrics is not None else None
    if saved_for is not None:  # why the runtime saved (a preemption): the marker's saved_for field
        recorded = {**(recorded or {}), SAVED_FOR: saved_for}
    root = storage.location(model_dir)
    if format == "legacy" and storage.is_store(root):
        raise ValueError(
            f"save_checkpoint: checkpoint_format='legacy' publishes by a rename, which {root} (an fsspec "
            "store) does not have; use checkpoint_format='standard' there"
        )
    world = dist.world_size()
    if format == "standard":
        staging = dist.run_on_main(lambda: _publish.fresh_staging(root, step), shared=SHARED)
        state = standard.packed_state(trainer, local)  # collective: fails on every rank before any write
        state.update(sharded or {})
        # The weights file is written (in place: the staging directory is
        # invisible until published) and fsynced while DCP writes the trainer.
        weights_file = files.weights_write(staging, weights, digest=digests) if dist.is_main() else None
        try:
            standard.write_state(staging, state)  # a full disk: DiskFullError on every rank
        except BaseException:
            _publish.discard(staging, weights_file)  # the space comes back; the previous checkpoint stays the latest
            raise

        def publish() -> storage.Location:
            return _publish.publish_staged(
                root, staging, step, world, recorded, weights_file=weights_file, digests=digests
            )

    else:
        locals_by_rank = dist.gather_object(local)
        assert not storage.is_store(root)  # refused above: a legacy checkpoint is a local file

        def publish() -> storage.Location:
            assert locals_by_rank is not None  # gathered on rank 0, where this runs
            content = one_file.payload(step, weights, trainer, locals_by_rank, recorded)
            return _publish.publish_file(root, content)

    def publish_and_retain() -> CheckpointInfo:
        published = publish()
        if snapshot:
            _publish.snapshot(root, published, step)
        _retain.retain(root, policy, step)
        return CheckpointInfo(published, step, format, world)

    return dist.run_on_main(
        publish_and_retain, shared=SHARED
    )  # rank 0's DiskFullError is raised as itself on every rank


def load_checkpoint(info: CheckpointInfo, *, weights: bool = True) -> LoadedCheckpoint:
    """Read a checkpoint found by ``latest_checkpoint`` or ``find_checkpoint``.

    Collective in a process group for the standard format (``dcp.load``).
    Nothing is unpickled beyond tensors and plain containers.

    Args:
        info: which checkpoint to read.
        weights: read the weights file (``False``: leave ``weights`` ``None``,
            for a sharded model, which loads its shards instead).

    Returns:
        Weights, replicated trainer state and this rank's local state.

    Raises:
        TypeError: ``info`` is not a :class:`CheckpointInfo`.
        CheckpointError: (a ``ValueError``) the checkpoint is incomplete or
            damaged: naming it, the file and what is wrong; its weights are
            not a state_dict (names to tensors: ``one_file.weights_problem``).
    """
    if not isinstance(info, CheckpointInfo):
        raise TypeError(
            f"load_checkpoint: 'info' must be a CheckpointInfo (got {type(info).__name__}); "
            "use find_checkpoint(path) or latest_checkpoint(model_dir) to get one"
        )
    found: dict | None
    if info.format == "legacy":
        found, trainer, local = one_file.read(info.path, dist.rank())
        return LoadedCheckpoint(info, found, trainer, local)
    validation.validate(info.path)
    weights_path = info.path / files.WEIGHTS
    read = weights and weights_path.is_file()
    found = one_file._load(weights_path, mmap=True, checkpoint=info.path) if read else None  # mapped: read when used
    if read:  # what the run loads into its model: a state_dict, or the checkpoint is damaged
        found = one_file.checked_weights(found, info.path, files.WEIGHTS)
    trainer, local = standard.read_trainer(info.path, dist.rank())
    return LoadedCheckpoint(info, found, trainer, local)


def _check_args(step, format, keep_snapshots, *, sharded=None, **parts) -> None:
    validate.int_at_least(0).check(step, "step", owner="save_checkpoint")
    validate.one_of(*FORMATS).check(format, "format", owner="save_checkpoint")
    validate.optional(validate.int_at_least(0)).check(keep_snapshots, "keep_snapshots", owner="save_checkpoint")
    if sharded is not None and format != "standard":
        raise ValueError(
            "save_checkpoint: a sharded model's state is written by DCP, in the standard format only; "
            "use checkpoint_format='standard'"
        )
    if parts["weights"] is None:
        if sharded is None:
            raise TypeError("save_checkpoint: 'weights' may be None only beside 'sharded' state (the shards hold them)")
        parts = {k: v for k, v in parts.items() if k != "weights"}
    for name, value in parts.items():
        if not isinstance(value, Mapping):
            raise TypeError(f"save_checkpoint: {name!r} must be a dict (got {type(value).__name__})")
    for key, value in parts.get("weights", {}).items():  # what a load refuses as no state_dict is never written
        if one_file.weights_problem({key: value}) is not None:
            found = f" has the key {key!r}" if not isinstance(key, str) else f"[{key!r}] is a {type(value).__name__}"
            raise TypeError(
                f"save_checkpoint: weights{found}; weights must map names to tensors (a module's "
                f"'*{one_file.EXTRA_STATE}' entry may also be None, a bool, a number or a string) so that they load "
                "with weights_only=True and into a model; pass extra state in 'trainer' instead"
            )


_BOOL = validate.is_bool.with_hint("pass True or False")


def _policy(instance, attribute, value) -> None:
    """``keep`` is ``None`` (keep every snapshot) or a retention policy (``keep_last(3)``...)."""
    retention.resolve(value, None, caller="loop")


@attrs.frozen
class Saving:
    """How to save, separate from when (the hooks).

    Attributes:
        checkpoint_format: ``"standard"`` (weights + a ``torch.distributed.checkpoint``
            directory) or ``"legacy"`` (one file, written by the main rank).
        keep: which ``iter_<step>`` snapshots (``save_every(n, snapshots=True)``)
            to keep, as a retention policy (``pimm_fn.core.retention``):
            ``keep_last(n)``, ``keep_every(k)``, ``keep_best(k, "mIoU", mode="max")``,
            or several joined with ``any_of`` (or ``|``). Applied by the main
            rank after each save is published; ``last``, the ``model_best``
            files and the newest complete checkpoint are never deleted.
            ``keep_best`` ranks a snapshot by the metrics the run had
            published at that save (recorded in its marker). ``None`` keeps all.
        weights_file: with a sharded model, gather its full weights into each
            checkpoint's ``model.pth`` (collective). ``False`` skips the gather
            for a model too large for rank 0's memory: the checkpoint then holds
            the shards only (``pimm_fn.checkpoint.load_weights_file`` assembles
            them). Replicated models always write ``model.pth``.
        digests: record each checkpoint file's SHA-256 in its ``COMPLETE``
            marker (standard format), and the best model's in its ``.json``;
            ``resume``, a warm start (``load_weights``: the files it reads),
            ``run.test(weights="best")`` and ``python -m pimm_fn verify`` then check them. Off by default: it adds about a third to a
            synchronous save (``benchmarks/RESULTS.md``).
        create_bucket: with a ``save_dir`` on a store with buckets
            (``s3://bucket/exp``, ``gs://``), create its bucket when it does
            not exist. Off by default: a missing bucket is refused before
            anything is written, naming it, since a mistyped name would
            otherwise be created and trained into. A store without buckets
            (``memory://``) has nothing to create.
    """

    factory_name: ClassVar[str] = "loop"  # its errors read as loop()'s did: these were loop()'s keywords

    checkpoint_format: str = attrs.field(default="standard", validator=validate.one_of("standard", "legacy"))
    keep: object = attrs.field(default=None, validator=_policy)
    weights_file: bool = attrs.field(default=True, validator=_BOOL)
    digests: bool = attrs.field(default=False, validator=_BOOL)
    create_bucket: bool = attrs.field(default=False, validator=_BOOL)
