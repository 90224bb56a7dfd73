"""``export``: a checkpoint's weights as a plain state dict, for anyone with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import pathlib

import torch

from pimm_fn.checkpoint import load_weights_file
from pimm_fn.checkpoint.inspection import write_plain_weights
from pimm_fn.cli import _URL, DAMAGED, NOT_FOUND, OK, USAGE, Failure, location

__all__ = ["export"]


def export(args) -> int:
    """Write the weights of ``args.path`` (a sharded checkpoint's assembled) to ``args.out``, atomically."""
    if _URL.match(args.out):  # never a local folder named after a URL
        raise Failure(USAGE, f"OUT.pth {args.out!r} is a URL; export writes a local file (copy it to the store after)")
    source, out = location(args.path), pathlib.Path(args.out)
    if out.exists() and not args.force:
        raise Failure(USAGE, f"{str(out)!r} exists; pass --force to overwrite it, or another OUT.pth")
    if out.is_dir():
        raise Failure(USAGE, f"{str(out)!r} is a directory; OUT.pth names the file to write")
    try:
        weights = load_weights_file(source)
    except FileNotFoundError as exc:
        raise Failure(NOT_FOUND, str(exc)) from None
    except (OSError, ValueError) as exc:
        raise Failure(DAMAGED, f"{exc}; run `python -m pimm_fn verify {source}`") from None
    plain = write_plain_weights(out, weights)  # contiguous CPU copies, written atomically
    tensors = [v for v in plain.values() if isinstance(v, torch.Tensor)]
    print(f"wrote {out}: {len(tensors)} tensors, {sum(t.numel() for t in tensors)} parameters, from {source}")
    return OK
