"""Process-group helpers that degrade to no-ops in a single process.

Every function here asks ``torch.distributed`` whether a default process group
is initialized; when it is not (a plain script, a notebook, a unit test), the
rank is 0, the world size is 1 and every collective returns at once. This is
the library's process-group layer: the only module that talks to
``torch.distributed``'s collectives directly, so the rest reads the same in both worlds.

Example:
    >>> from pimm_fn import dist
    >>> dist.rank(), dist.world_size(), dist.is_main()
    (0, 1, True)
    >>> dist.broadcast_object({"step": 3})
    {'step': 3}
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
import torch.distributed as _td

__all__ = [
    "all_gather_object",
    "barrier",
    "broadcast_object",
    "collective_device",
    "destroy_group",
    "gather_object",
    "is_initialized",
    "is_main",
    "new_gloo_group",
    "rank",
    "run_on_main",
    "world_size",
]

T = TypeVar("T")


def is_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists."""
    return _td.is_available() and _td.is_initialized()


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return _td.get_rank() if is_initialized() else 0


def world_size() -> int:
    """Number of ranks in the default group (1 without one)."""
    return _td.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """Whether this process is rank 0, the one that writes shared files."""
    return rank() == 0


def collective_device():
    """Where a tensor a collective on the default group reduces must live: this rank's CUDA device under NCCL, else the CPU."""
    if is_initialized() and "nccl" in str(_td.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def new_gloo_group():
    """A new group of every rank on gloo, for collectives run beside the training's (``None`` without a group).

    Collective: every rank of the default group calls it, in the same order.
    """
    return _td.new_group(backend="gloo") if is_initialized() else None


def destroy_group(group) -> None:
    """Destroy a group ``new_gloo_group`` made, nothing of it in flight: torch forgets it, and once the caller drops
    its last reference its worker threads are joined, so none is left to free a finished collective's tensors (which
    takes Python's lock) while Python exits. Not collective. ``None``, or a group that went with the default one
    (``destroy_process_group()``), is left as it is.
    """
    if group is None or not is_initialized():
        return
    try:
        _td.destroy_process_group(group)
    except ValueError:  # "Invalid process group": not torch's any more (the default group it belonged to was remade)
        pass


def barrier() -> None:
    """Wait until every rank reaches this point (no-op without a group)."""
    if is_initialized():
        _td.barrier()


def broadcast_object(obj: T, src: int = 0, group=None) -> T:
    """Return rank ``src``'s ``obj`` on every rank (pickled in memory).

    Args:
        obj: the value to send; ignored on ranks other than ``src``.
        src: the sending rank.
        group: the process group (default: the default group).

    Returns:
        ``src``'s value, identical on every rank.
    """
    if not is_initialized():
        return obj
    box: list[Any] = [obj if rank() == src else None]  # src's obj on every rank once broadcast
    _td.broadcast_object_list(box, src=src, group=group)
    return box[0]


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Collect every rank's ``obj`` on rank ``dst``, in rank order.

    Returns:
        The list of all ranks' values on ``dst``; ``None`` on other ranks.
    """
    if not is_initialized():
        return [obj]
    out = [None] * world_size() if rank() == dst else None
    _td.gather_object(obj, out, dst=dst)
    return out


def all_gather_object(obj: Any) -> list[Any]:
    """Collect every rank's ``obj`` on every rank, in rank order."""
    if not is_initialized():
        return [obj]
    out: list[Any] = [None] * world_size()
    _td.all_gather_object(out, obj)
    return out


def run_on_main(fn: Callable[[], T], group=None, *, shared: tuple[type[BaseException], ...] = ()) -> T:
    """Run ``fn`` on rank 0 only and share its outcome with every rank.

    A failure on rank 0 is re-raised there; on the other ranks it is raised
    as itself when it is one of ``shared`` (it must pickle: pimm_fn's own
    checkpoint errors), else reported as a ``RuntimeError`` naming it, so no
    rank is left waiting in a later collective. This also acts as a barrier:
    no rank returns before rank 0 finished.

    Args:
        fn: a zero-argument callable doing main-rank-only work (file writes).
        group: the process group to share the outcome over (default group).
        shared: the error types other ranks raise as themselves.

    Returns:
        ``fn()``'s result on every rank (it must be picklable in a group).
    """
    result: Any = None
    error: BaseException | None = None
    if is_main():
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, on every rank
            error = exc
    told = error if isinstance(error, shared) else None if error is None else f"{type(error).__name__}: {error}"
    outcome: tuple[bool, Any] = (error is None, result if error is None else told)  # fn's result, or what failed
    ok, payload = broadcast_object(outcome, group=group)
    if error is not None:
        raise error
    if ok:
        return payload
    if isinstance(payload, BaseException):
        raise payload
    raise RuntimeError(f"rank 0 failed while this rank waited for it: {payload}")
