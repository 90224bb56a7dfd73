"""Saving and loading whole checkpoints: the collective entry points.

Standard format, in a process group (every rank calls, in this order)::

    rank 0: remove stale .staging-*, create .staging-last-<step>/   (shared)
    all   : agree on the packed trainer state                         (collective)
    all   : dcp.save(trainer + own local) into it                    (collective)
    rank 0: ... meanwhile model.pth on a second thread, fsynced
    rank 0: COMPLETE once both are durable, then publish, snapshot, prune  (shared)

A crash before ``COMPLETE`` leaves only an unfinished staging directory,
which discovery ignores and the next save deletes. Legacy format: locals are
gathered to rank 0, which writes ``last.pth`` atomically.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

import attrs
import torch

from . import _layout as L
from . import _legacy, _publish, _standard, dist
from ._layout import CheckpointInfo

__all__ = ["LoadedCheckpoint", "load_checkpoint", "save_checkpoint"]


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
) -> CheckpointInfo:
    """Write a checkpoint and publish it atomically as ``last``.

    Collective in a process group: every rank calls it with its own ``local``.

    Args:
        model_dir: the checkpoint root (``save_dir/"model"``).
        step: the global step, ``>= 0``.
        weights: the model state_dict (replicated; rank 0's is written), or
            ``None`` to write no weights file (a sharded model's weights are
            then only its shards; see :mod:`.sharded`).
        trainer: replicated nested state (optimizer, scheduler, scaler state
            dicts, plain values); must be identical on every rank.
        local: this rank's nested state (RNG states, data cursor, hook state).
        format: ``"standard"`` (``last/``) or ``"legacy"`` (``last.pth``).
        snapshot: also keep a copy as ``iter_<step>``.
        keep_snapshots: keep only the newest N ``iter_*`` snapshots.
        sharded: this rank's shards of a sharded model and optimizer
            (``sharded.state``), written by DCP beside ``trainer``; exempt
            from the agreement check. Standard format only.

    Returns:
        The published checkpoint (``last`` or ``last.pth``), on every rank.

    Raises:
        ValueError / TypeError: a bad argument, or state that cannot be saved.

    Example:
        >>> import tempfile, torch
        >>> d = tempfile.mkdtemp()
        >>> info = save_checkpoint(d, step=5, weights={"w": torch.ones(2)},
        ...                        trainer={"lr": 0.1}, local={"seed": 1})
        >>> info.path.name, info.step, load_checkpoint(info).trainer
        ('last', 5, {'lr': 0.1})
    """
    _check_args(step, format, keep_snapshots, weights=weights, trainer=trainer, local=local, sharded=sharded)
    root = pathlib.Path(model_dir)
    world = dist.world_size()
    if format == "standard":
        staging = dist.run_on_main(lambda: _publish.fresh_staging(root, step))
        state = _standard.packed_state(trainer, local)  # collective: fails on every rank before any write
        state.update(sharded or {})
        # The weights file is written (in place: the staging directory is
        # invisible until published) and fsynced while DCP writes the trainer.
        weights_file = L.weights_write(staging, weights) if dist.is_main() else None
        try:
            _standard.write_state(staging, state)
        except BaseException:
            if weights_file is not None:
                weights_file.join()
            raise

        def publish() -> pathlib.Path:
            weights_file.result()
            return _publish.publish_staged(root, staging, step, world)

    else:
        locals_by_rank = dist.gather_object(local)

        def publish() -> pathlib.Path:
            root.mkdir(parents=True, exist_ok=True)
            _publish.clean_staging(root)
            content = _legacy.payload(step, weights, trainer, locals_by_rank)
            return _legacy.write(root / L.LEGACY_LAST, content)

    def publish_and_retain() -> CheckpointInfo:
        published = publish()
        if snapshot:
            _publish.snapshot(root, published, step)
        if keep_snapshots is not None:
            _publish.prune_snapshots(root, keep_snapshots)
        return CheckpointInfo(published, step, format, world)

    return dist.run_on_main(publish_and_retain)


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
        ValueError: the checkpoint is incomplete or damaged.
    """
    if not isinstance(info, CheckpointInfo):
        raise TypeError(
            f"load_checkpoint: 'info' must be a CheckpointInfo (got {type(info).__name__}); "
            "use find_checkpoint(path) or latest_checkpoint(model_dir) to get one"
        )
    if info.format == "legacy":
        found, trainer, local = _legacy.read(info.path, dist.rank())
        return LoadedCheckpoint(info, found, trainer, local)
    L.check_standard_dir(info.path)
    weights_path = info.path / L.WEIGHTS
    read = weights and weights_path.is_file()
    found = torch.load(weights_path, map_location="cpu", weights_only=True) if read else None
    trainer, local = _standard.read_trainer(info.path, dist.rank())
    return LoadedCheckpoint(info, found, trainer, local)


def _check_args(step, format, keep_snapshots, *, sharded=None, **parts) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: 'step' must be an int >= 0 (got {step!r})")
    if format not in L.FORMATS:
        raise ValueError(f"save_checkpoint: 'format' must be one of {L.FORMATS} (got {format!r})")
    if keep_snapshots is not None and (isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int) or keep_snapshots < 0):
        raise ValueError(f"save_checkpoint: 'keep_snapshots' must be None or an int >= 0 (got {keep_snapshots!r})")
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
    for key, value in parts.get("weights", {}).items():
        if not isinstance(value, torch.Tensor) and value is not None and not isinstance(value, (bool, int, float, str)):
            raise TypeError(
                f"save_checkpoint: weights[{key!r}] is a {type(value).__name__}; weights must map names to tensors "
                "so that they load with weights_only=True; pass extra state in 'trainer' instead"
            )
