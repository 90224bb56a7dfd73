"""``Parallel(ddp=True)``: the model wrapped in ``DistributedDataParallel`` on the device it is on.

Wrapped only in a process group and only once: a model the user wrapped
already is left as it is. A CUDA model gets its own device as DDP's
``device_ids`` (``pimm_fn.runtime.device`` made ``LOCAL_RANK``'s current
before), a CPU model none.
"""

import torch

from pimm_fn import dist

__all__ = ["wrap_ddp"]


def wrap_ddp(model):
    """``model`` in DistributedDataParallel, when a process group exists and it is not wrapped yet."""
    if not dist.is_initialized() or isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    device_ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
