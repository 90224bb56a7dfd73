"""Which device a process of a launch trains on, and the model wrapped in ``DistributedDataParallel`` there.

Every process on a node sees every GPU, and CUDA's current device starts as
0 in each of them. Unless the loop makes ``LOCAL_RANK``'s device current,
the work that follows the current device lands on GPU 0 for every process:
NCCL's buffers and the tensors of the collectives that DDP, the agreement
guard and DCP run. :func:`use_local_cuda_device` does it before the loop
wraps or touches anything; :func:`local_cuda_index` is the decision alone.

``Parallel(ddp=True)``: the model wrapped in ``DistributedDataParallel`` on the device it is on.

Wrapped only in a process group and only once: a model the user wrapped
already is left as it is. A CUDA model gets its own device as DDP's
``device_ids`` (``pimm_fn.runtime.step.devices`` made ``LOCAL_RANK``'s current
before), a CPU model none.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch

from pimm_fn import dist
from pimm_fn.runtime.errors import ConfigurationWarning

__all__ = [
    "local_cuda_index",
    "misplaced_model",
    "use_local_cuda_device",
    "wrap_ddp",
]


def local_cuda_index(environ: Mapping[str, str], *, device_count: int, grouped: bool, model_device=None) -> int | None:
    """The CUDA device this process makes current, or ``None`` to leave CUDA alone.

    A model already on a CUDA device keeps that device (DDP wraps it there).
    Otherwise, in a process group, ``LOCAL_RANK`` (set by torchrun) names
    the device; a launcher that shows each process a single GPU
    (``CUDA_VISIBLE_DEVICES``) makes that GPU, index 0, the one. Without
    CUDA, a process group or ``LOCAL_RANK`` there is nothing to choose.

    Args:
        environ: the process environment (``os.environ``).
        device_count: how many CUDA devices this process sees (0 without CUDA).
        grouped: whether a ``torch.distributed`` process group is initialized.
        model_device: the device of the model's parameters, if it has any.

    Returns:
        The device index, or ``None``.

    Raises:
        ValueError: ``LOCAL_RANK`` is not an integer, or names a device
            this node does not have.

    Example:
        >>> local_cuda_index({"LOCAL_RANK": "1"}, device_count=4, grouped=True)
        1
        >>> local_cuda_index({"LOCAL_RANK": "1"}, device_count=0, grouped=True) is None
        True
    """
    if device_count == 0:
        return None
    if model_device is not None and model_device.type == "cuda" and model_device.index is not None:
        return model_device.index
    raw = environ.get("LOCAL_RANK")
    if not grouped or raw is None:
        return None
    try:
        local_rank = int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK must be an integer (got {raw!r}); it is set by torchrun") from None
    if device_count == 1:
        return 0
    if not 0 <= local_rank < device_count:
        raise ValueError(
            f"LOCAL_RANK={local_rank} names CUDA device {local_rank}, but this process sees {device_count} "
            f"(0..{device_count - 1}); launch at most {device_count} processes per node "
            f"(torchrun --nproc-per-node={device_count})"
        )
    return local_rank


def misplaced_model(environ: Mapping[str, str], *, device_count: int, grouped: bool, model_device=None) -> str | None:
    """Why a model on a GPU other than ``LOCAL_RANK``'s is probably a mistake, or ``None``.

    ``model.cuda()`` before ``torch.cuda.set_device`` puts every process's
    model on GPU 0: the processes of a node then share one GPU.

    Example:
        >>> import torch
        >>> misplaced_model({"LOCAL_RANK": "1"}, device_count=2, grouped=True, model_device=torch.device("cuda", 0))[:40]
        'the model is on cuda:0 but LOCAL_RANK=1 '
    """
    if not grouped or device_count < 2 or model_device is None or model_device.type != "cuda":
        return None
    raw = environ.get("LOCAL_RANK")
    if raw is None or raw == str(model_device.index):
        return None
    return (
        f"the model is on cuda:{model_device.index} but LOCAL_RANK={raw} names cuda:{raw}: processes of this node "
        f"may share a GPU; build it on torch.device('cuda', local_rank) (or call torch.cuda.set_device(local_rank) "
        "before model.cuda())"
    )


def use_local_cuda_device(model) -> int | None:
    """Make this process's CUDA device current (``torch.cuda.set_device``) before the loop allocates on it.

    Returns:
        The device index made current, or ``None`` when CUDA is not used.
    """
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    parameters = model.parameters() if hasattr(model, "parameters") else iter(())
    model_device = next((p.device for p in parameters), None)
    grouped = dist.is_initialized()
    problem = misplaced_model(os.environ, device_count=count, grouped=grouped, model_device=model_device)
    if problem is not None:
        warnings.warn(problem, ConfigurationWarning, stacklevel=3)
    index = local_cuda_index(os.environ, device_count=count, grouped=grouped, model_device=model_device)
    if index is not None:
        torch.cuda.set_device(index)
    return index


def wrap_ddp(model):
    """``model`` in DistributedDataParallel, when a process group exists and it is not wrapped yet."""
    if not dist.is_initialized() or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
