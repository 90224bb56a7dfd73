"""Capturing and restoring every random number generator training draws from.

A resumed run must continue with the same random stream (dropout masks,
augmentations, shuffles) to end bit-identical to an uninterrupted one.
"""

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng", "rng_kept", "rng_problem", "torch_rng", "set_torch_rng"]

_get_cpu = torch.default_generator.get_state  # what torch.get_rng_state returns, at half its cost
_cuda_ready = torch.cuda.is_initialized


def capture_rng() -> dict:
    """This process's Python, NumPy, torch (and CUDA) RNG states, checkpointable."""
    version, internal, gauss = random.getstate()
    # numpy's stub types get_state() as its dict form; called without legacy=False it returns the legacy tuple.
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),  # type: ignore[attr-defined]  # see get_state above
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = list(torch.cuda.get_rng_state_all())
    return states


def restore_rng(states: dict) -> None:
    """Put back the states ``capture_rng`` returned."""
    random.setstate(_python(states["python"]))
    np.random.set_state(_numpy(states["numpy"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Every RNG as it was on entry, put back on exit, even when the body raised: what it draws is undone."""
    states = capture_rng()
    try:
        yield
    finally:
        restore_rng(states)


def rng_problem(states) -> str | None:
    """Why ``states`` (read from a checkpoint: untrusted) would not restore, or ``None``; restores nothing.

    Each state is set on a scratch generator of its kind, so anything the
    real restore would refuse is found before a resume touches the model.
    """
    try:
        random.Random().setstate(_python(states["python"]))
        np.random.RandomState().set_state(_numpy(states["numpy"]))
        torch.Generator().set_state(states["torch"])
    except Exception as exc:  # noqa: BLE001 - altered states fail in many ways
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return None


def _python(py: dict) -> tuple:
    return py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]


def _numpy(npy: dict) -> tuple:
    return npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached"]


def torch_rng() -> tuple:
    """The torch RNG states a step draws from (CPU, and CUDA once initialized): cheap, not checkpointable.

    About 1.5 us on CPU (``torch.get_rng_state`` itself costs twice that):
    the loop takes it before each fetch, forward and effect, so a retry after
    an interruption draws the same numbers.
    """
    return _get_cpu(), (torch.cuda.get_rng_state_all() if _cuda_ready() else None)


def set_torch_rng(states: tuple) -> None:
    """Put back what ``torch_rng`` returned."""
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
