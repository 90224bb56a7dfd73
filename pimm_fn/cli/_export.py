"""``export``: a checkpoint's weights as a plain state dict, for ``torch.load(weights_only=True)`` or as safetensors."""

from __future__ import annotations

import pathlib

import torch

from pimm_fn.checkpoint import load_weights_file
from pimm_fn.checkpoint.inspection import provenance, write_plain_weights
from pimm_fn.cli import _URL, DAMAGED, NOT_FOUND, OK, USAGE, Failure, location

__all__ = ["export"]

_SUFFIX = ".safetensors"  # how every reader, pimm_fn's too, tells a safetensors file


def _format(args, out: pathlib.Path) -> str:
    """The format to write: ``--format``, else what ``OUT``'s name says; a name that says the other is refused."""
    named = "safetensors" if out.name.endswith(_SUFFIX) else "pth"
    if args.format is not None and args.format != named:
        fix = f"name it {out.stem}{_SUFFIX}" if args.format == "safetensors" else "give it another suffix (.pth)"
        raise Failure(
            USAGE,
            f"--format {args.format} writing {str(out)!r}: readers tell a safetensors file by its "
            f"{_SUFFIX} suffix; {fix}",
        )
    return named


def export(args) -> int:
    """Write the weights of ``args.path`` (a sharded checkpoint's assembled) to ``args.out``, atomically."""
    if _URL.match(args.out):  # never a local folder named after a URL
        raise Failure(USAGE, f"OUT {args.out!r} is a URL; export writes a local file (copy it to the store after)")
    source, out = location(args.path), pathlib.Path(args.out)
    if out.exists() and not args.force:
        raise Failure(USAGE, f"{str(out)!r} exists; pass --force to overwrite it, or another OUT")
    if out.is_dir():
        raise Failure(USAGE, f"{str(out)!r} is a directory; OUT names the file to write")
    fmt = _format(args, out)
    try:
        weights = load_weights_file(source)
    except FileNotFoundError as exc:
        raise Failure(NOT_FOUND, str(exc)) from None
    except (OSError, ValueError) as exc:
        raise Failure(DAMAGED, f"{exc}; run `python -m pimm_fn verify {source}`") from None
    metadata = provenance(source) if fmt == "safetensors" else None
    try:
        plain = write_plain_weights(out, weights, format=fmt, metadata=metadata)  # contiguous CPU copies, atomically
    except (ImportError, ValueError) as exc:  # no safetensors package; a value safetensors cannot hold
        raise Failure(USAGE, str(exc)) from None
    tensors = [v for v in plain.values() if isinstance(v, torch.Tensor)]
    recorded = ", ".join(f"{key.removeprefix('pimm_fn.')}={value}" for key, value in (metadata or {}).items())
    recorded = f" (recorded: {recorded})" if recorded else ""
    print(f"wrote {out}: {len(tensors)} tensors, {sum(t.numel() for t in tensors)} parameters, from {source}{recorded}")
    return OK
