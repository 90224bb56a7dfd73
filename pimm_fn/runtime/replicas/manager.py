"""The torchft ``Manager`` of one replica group, built from ``FaultTolerance`` and the environment.

A replica group is one process, or one ``torchrun`` group. Its id is
``FaultTolerance(replica_group=)`` or ``REPLICA_GROUP_ID``, the lighthouse
``FaultTolerance(lighthouse=)`` or ``TORCHFT_LIGHTHOUSE``, as torchft reads
them. Each group gets a ``TCPStore`` of its own, on its rank 0 (on
``127.0.0.1`` when the lighthouse is on this host, else on this host's
name): the other groups reach it there, where ``torchrun``'s
``MASTER_ADDR`` may be a loopback address, and a group restarted under the
same ``torchrun`` agent finds no key of the one before. In a ``torchrun``
group every rank has a manager (its rank and size in the group); rank 0's
serves the others and talks to the lighthouse for the group. Each
manager's gloo group joins the same rank of every group in a quorum; its
step starts at the run's global step, so a replica behind the others
(restarted from an older checkpoint, or fresh) is healed from a live peer
at the first quorum.

torchft is imported here, and only when the option is used: ``require()``
refuses the option, naming the extra, where it is not installed.
"""

import os
import socket
import urllib.parse
from datetime import timedelta
from typing import Any

import torch

from pimm_fn import dist
from pimm_fn.runtime.errors import ReplicaError

__all__ = ["INSTALL", "require", "group_id", "lighthouse", "check_group", "build"]

INSTALL = "pip install 'pimm_fn[ft]'"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def require() -> None:
    """Refuse ``Parallel(fault_tolerant=...)`` where torchft is not installed, naming the extra."""
    try:
        import torchft  # noqa: F401 - only whether it imports
    except ImportError:
        raise ImportError(
            f"loop: Parallel(fault_tolerant=...) runs the replica groups through torchft, which is not installed: "
            f"{INSTALL}"
        ) from None


def group_id(option) -> str:
    """This replica group's id: ``option.replica_group``, else ``REPLICA_GROUP_ID``."""
    return _given(
        option.replica_group,
        "REPLICA_GROUP_ID",
        "this replica group's id: pass FaultTolerance(replica_group='0') or set REPLICA_GROUP_ID, a different one "
        "for each group",
    )


def lighthouse(option) -> str:
    """The lighthouse's address: ``option.lighthouse``, else ``TORCHFT_LIGHTHOUSE``."""
    return _given(
        option.lighthouse,
        "TORCHFT_LIGHTHOUSE",
        "the torchft lighthouse's address: pass FaultTolerance(lighthouse='http://host:29510') or set "
        "TORCHFT_LIGHTHOUSE (start one with torchft_lighthouse)",
    )


def check_group(model) -> None:
    """Refuse a ``torchrun`` group whose ``model`` is not in ``DistributedDataParallel``: its ranks would train apart.

    The groups average their gradients rank by rank (rank ``r`` of each),
    so a group's ranks must hold one model: DDP averages their gradients
    within the group first.
    """
    size = dist.world_size()
    found = model
    while size > 1 and isinstance(found, torch.nn.Module):
        if isinstance(found, torch.nn.parallel.DistributedDataParallel):
            return
        found = getattr(found, "module", None) or getattr(found, "_orig_mod", None)  # in a compiled one, say
    if size > 1:
        raise ValueError(
            f"loop: Parallel(fault_tolerant=...) in a torchrun group of {size} ranks needs the model in "
            f"DistributedDataParallel, which averages the gradients within the group (the replica groups average "
            f"theirs at optimizer.step()): pass Parallel(ddp=True, fault_tolerant=...)"
        )


def _given(value: str | None, variable: str, what: str) -> str:
    found = value if value is not None else os.environ.get(variable)
    if not found:
        raise ValueError(f"loop: FaultTolerance needs {what}")
    return found


def build(option, *, step: int) -> tuple[Any, Any, Any]:
    """``(manager, transport, store)``: the group's torchft ``Manager`` at ``step``, its heal transport, its store.

    The transport (``pimm_fn.runtime.replicas.transport``) heals over the
    manager's gloo group; ``store`` is the group's own ``TCPStore``, kept
    alive with the manager (on its rank 0; ``None`` on a ``torchrun``
    group's other ranks). Collective in a ``torchrun`` group.

    Raises:
        ReplicaError: the lighthouse cannot be reached within ``connect_timeout``.
    """
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    from pimm_fn.runtime.replicas.transport import Transport

    address = lighthouse(option)
    timeout = timedelta(seconds=option.timeout)
    there = urllib.parse.urlsplit(address if "//" in address else f"//{address}").hostname
    host = "127.0.0.1" if there in _LOOPBACK else socket.getfqdn()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False) if dist.rank() == 0 else None
    host, port = dist.broadcast_object((host, store.port if store is not None else 0))  # to a torchrun group's ranks
    group = ProcessGroupGloo(timeout=timeout)
    transport = Transport(group, ranks=dist.world_size())
    try:
        manager = Manager(
            pg=group,
            load_state_dict=transport.load,  # a heal's source, noted on this thread
            state_dict=lambda: None,  # the state goes by the transport, not through torchft's state dict
            min_replica_size=option.min_replicas,
            use_async_quorum=False,  # the quorum and any heal complete at the step's boundary
            # Its own calls (the vote above all) wait twice as long: in a torchrun group a rank reaches the vote
            # up to ``timeout`` after another, whose all-reduce with a lost peer was given up only then.
            timeout=2 * timeout,
            quorum_timeout=timedelta(seconds=option.quorum_timeout),
            connect_timeout=timedelta(seconds=option.connect_timeout),
            rank=dist.rank(),
            world_size=dist.world_size(),
            store_addr=host,
            store_port=port,
            lighthouse_addr=address,
            replica_id=group_id(option),
            checkpoint_transport=transport,
        )
    except RuntimeError as exc:
        raise ReplicaError(
            f"cannot reach the torchft lighthouse at {address} within connect_timeout={option.connect_timeout:g} s "
            f"({str(exc)[:200]}): start it (torchft_lighthouse), or pass its address as FaultTolerance(lighthouse=) "
            f"or TORCHFT_LIGHTHOUSE"
        ) from None
    manager.load_state_dict({"step": step, "batches_committed": 0})
    return manager, transport, store
