"""Sharded model and optimizer state (FSDP2): written through DCP, read back on any world size.

A model whose parameters are ``DTensor``s (``torch.distributed.fsdp.fully_shard``)
has no full copy on any rank. Its state and its optimizer's are taken with
``torch.distributed.checkpoint.state_dict.get_state_dict`` (keyed by
parameter name, each rank holding its shards) and written by DCP beside the
trainer state, as ``sharded/model/<name>`` and ``sharded/optim/<name>/<key>``.
DCP stores each shard once with its place in the full tensor, so a resume
on another world size, another sharding or none reads its own part of every
tensor (:func:`load_into`). What is not a tensor in the optimizer state
(param groups, hyper-parameters) stays in the replicated trainer part, where
every rank must agree on it; the shards are exempt from that check.

Every read goes through :mod:`pimm_fn.checkpoint.formats.dcp_reading` (no pickled entry is ever
unpickled), and a resume checks first that a checkpoint saying its model is
sharded holds ``sharded/model/...`` tensors, and one saying it is not holds
no shards (:func:`check_claim`).

The weights file ``model.pth`` holds :func:`full_weights`: the full state
dict, gathered collectively to rank 0, loadable by anyone with
``torch.load(weights_only=True)``. A run may skip it (``loop(saving=Saving(weights_file=False))``)
for a model too large to gather; :func:`read_full_weights` then assembles
the full weights from the shards, in one process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from pimm_fn.checkpoint import storage
from pimm_fn.checkpoint.errors import CheckpointError, cause
from pimm_fn.checkpoint.formats import dcp_reading, standard

__all__ = [
    "MODEL",
    "OPTIM",
    "is_sharded",
    "state",
    "full_weights",
    "load_full_weights",
    "load_into",
    "read_full_weights",
    "has_shards",
    "check_claim",
    "shards_error",
]

MODEL = "sharded/model/"
OPTIM = "sharded/optim/"


def is_sharded(model) -> bool:
    """Whether ``model`` keeps DTensor parameters (FSDP2): no rank holds it whole."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def state(model, optimizer) -> tuple[dict, dict]:
    """``(shards, optimizer_rest)``: the tensors DCP writes, and the optimizer state without them.

    ``shards`` maps ``sharded/...`` keys to this rank's DTensors (and any
    plain tensors, which DCP writes once); ``optimizer_rest`` is the
    optimizer state dict by parameter name with its tensors left out.
    """
    if not optimizer.state:  # nothing to save yet; get_state_dict would create it with a step (Adam counts it)
        return {MODEL + name: value for name, value in get_model_state_dict(model).items()}, {
            "state": {},
            "param_groups": None,
        }
    optimizer_state: (
        Any  # torch types its entries alike, where "state" maps names to dicts and "param_groups" is a list
    )
    model_state, optimizer_state = get_state_dict(model, optimizer)
    shards = {MODEL + name: value for name, value in model_state.items()}
    rest = {}
    for name, entries in optimizer_state["state"].items():
        rest[name] = {key: value for key, value in entries.items() if not isinstance(value, torch.Tensor)}
        shards.update({_optim_key(name, key): v for key, v in entries.items() if isinstance(v, torch.Tensor)})
    return shards, {"state": rest, "param_groups": optimizer_state["param_groups"]}


def _optim_key(name: str, key) -> str:
    return f"{OPTIM}{name}/{key}"


def full_weights(model) -> dict:
    """The full model state dict on rank 0 (CPU tensors), ``{}`` elsewhere; collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_weights(model, weights: dict, *, strict: bool = False) -> None:
    """Load a full state dict (every rank holds it) into a sharded ``model``: each rank keeps its shards."""
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=strict))


def load_into(directory: storage.Location, model, optimizer, optimizer_rest: dict) -> None:
    """Load a checkpoint's shards into ``model`` and ``optimizer`` as they are sharded now; collective.

    The optimizer's state is created first (a step with zero learning rate
    and zero gradients, as ``set_state_dict`` does), so every state tensor
    exists, sharded like its parameter, for DCP to read its part into.

    Raises:
        ValueError: the checkpoint lacks a tensor this model or optimizer has
            (another model, another optimizer type).
    """
    if optimizer_rest["param_groups"] is None:  # saved before the optimizer's first step: it stays fresh
        _load(directory, template := {MODEL + name: value for name, value in get_model_state_dict(model).items()})
        set_model_state_dict(model, {name[len(MODEL) :]: value for name, value in template.items()})
        return
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(optimizer)
    optimizer_state: (
        Any  # torch types its entries alike, where "state" maps names to dicts and "param_groups" is a list
    )
    model_state, optimizer_state = get_state_dict(model, optimizer)
    template = {MODEL + name: value for name, value in model_state.items()}
    for name, entries in optimizer_state["state"].items():
        template.update({_optim_key(name, key): v for key, v in entries.items() if isinstance(v, torch.Tensor)})
    _load(directory, template)
    loaded: dict[str, Any] = {
        name: {
            **optimizer_rest["state"].get(name, {}),
            **{key: template[_optim_key(name, key)] for key, v in entries.items() if isinstance(v, torch.Tensor)},
        }
        for name, entries in optimizer_state["state"].items()
    }
    set_state_dict(
        model,
        optimizer,
        model_state_dict={name: template[MODEL + name] for name in model_state},
        optim_state_dict={"state": loaded, "param_groups": optimizer_rest["param_groups"]},
    )


def _load(directory: storage.Location, template: dict) -> None:
    """Read the checkpoint's part of every tensor of ``template`` into it, in place; collective."""
    meta = dcp_reading.metadata(directory)  # read once, for the check and the load
    _check_keys(directory, template, meta.state_dict_metadata)
    dcp_reading.load(template, directory, meta=meta, collective=True)


def _check_keys(directory: storage.Location, template: dict, saved: dict) -> None:
    missing = [key for key in template if key not in saved]
    if missing:
        found = sorted(k for k in saved if k.startswith("sharded/"))[:4]
        raise ValueError(
            f"{directory} holds no {missing[0]!r} ({len(missing)} tensor(s) of this model and optimizer are "
            f"missing; the checkpoint has e.g. {found}): it was written by another model or optimizer type"
        )


def _metadata(directory: storage.Location) -> dict:
    return dcp_reading.metadata(directory).state_dict_metadata


def has_shards(directory: storage.Location) -> bool:
    """Whether a standard checkpoint directory keeps its model as shards (written from a sharded model)."""
    return any(key.startswith(MODEL) for key in _metadata(directory))


def check_claim(directory: storage.Location, claimed: bool) -> None:
    """What the trainer part says (``Replicated.sharded``) is what the DCP metadata holds, before anything loads.

    A checkpoint saying its model is sharded holds ``sharded/model/...`` tensors
    and only tensors under ``sharded/``; one saying it is not holds none.

    Raises:
        CheckpointError: the claim and the entries disagree (naming both).
    """
    entries = {k: e for k, e in _metadata(directory).items() if k.startswith("sharded/")}
    odd = [k for k, e in entries.items() if not isinstance(e, TensorStorageMetadata)]
    if odd:
        raise CheckpointError(
            directory,
            "trainer/.metadata",
            f"lists {odd[0]!r} as a pickled object where a shard "
            "tensor is expected: pimm_fn never unpickles objects from a checkpoint, so nothing "
            "of it was run (the checkpoint was not written by pimm_fn, or was altered)",
        )
    model = [k for k in entries if k.startswith(MODEL)]
    if claimed and not model:
        raise CheckpointError(
            directory,
            "trainer/",
            "says its model was sharded (written by FSDP2), but its "
            "metadata lists no 'sharded/model/...' tensor: the trainer part was altered",
        )
    if not claimed and entries:
        raise CheckpointError(
            directory,
            "trainer/",
            f"says its model was replicated, but its metadata lists "
            f"{len(entries)} shard(s) (e.g. {sorted(entries)[0]!r}): the trainer part was altered",
        )


def read_full_weights(directory: storage.Location) -> dict:
    """The full model state dict assembled from a checkpoint's shards, in this process alone (CPU).

    Raises:
        CheckpointError: a shard entry is not a tensor, or does not read safely.
    """
    meta = dcp_reading.metadata(directory)
    template = {}
    for key, entry in meta.state_dict_metadata.items():
        if key.startswith(MODEL):
            if not isinstance(entry, TensorStorageMetadata):
                raise CheckpointError(
                    directory,
                    "trainer/.metadata",
                    f"lists {key!r} as a pickled object where a shard tensor is expected; refusing to load it",
                )
            template[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    dcp_reading.load(template, directory, meta=meta)
    return {key[len(MODEL) :]: value for key, value in template.items()}


def shards_error(directory: storage.Location, exc: BaseException) -> CheckpointError:
    """A failed read of a sharded model's shards (DCP's ``CheckpointException``), as the damaged file it comes from."""
    meta = standard.metadata(directory)
    shards = [key for key in meta.state_dict_metadata if key.startswith("sharded/")]
    return CheckpointError(
        directory, standard.damaged_file(directory, meta, shards), f"does not read back ({cause(exc)})"
    )
