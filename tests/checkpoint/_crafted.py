"""Checkpoints an attacker could hand over: genuine ones republished by pimm_fn's own writer, then altered.

``republish`` reads a genuine checkpoint and writes it again with
``save_checkpoint`` (so ``COMPLETE`` and its sizes are right), with trainer or
per-rank fields replaced and any DCP entry swapped for a pickled object.
:class:`Payload` is that object: unpickling it creates a marker file, standing
for any code a pickle can run. A test passes only if the marker never appears.
"""

from __future__ import annotations

import json
import pathlib

from pimm_fn.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint


class Payload:
    """A pickled object whose unpickling creates ``marker`` (as ``os.system`` would run a command)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def parts(path) -> tuple[dict, dict, dict | None, object]:
    """``(trainer, local, weights, info)`` of the checkpoint at ``path``, read by pimm_fn (this rank's local)."""
    info = find_checkpoint(path)
    loaded = load_checkpoint(info)
    return dict(loaded.trainer), dict(loaded.local or {}), loaded.weights, info


def republish(source, model_dir, *, trainer=None, local=None, entries=None, weights=None) -> pathlib.Path:
    """Write the checkpoint at ``source`` again under ``model_dir`` with pimm_fn's writer, altered.

    Args:
        trainer, local: fields replacing the genuine ones (``{}``: none).
        entries: DCP keys written as given in place of (or beside) what pimm_fn packs, e.g.
            ``{"trainer/t/0": Payload(marker)}``; an object is pickled by DCP into the entry.
        weights: the weights file's content instead of the genuine one.
    """
    genuine_trainer, genuine_local, genuine_weights, info = parts(source)
    written = save_checkpoint(
        model_dir,
        step=info.step,
        weights=dict(genuine_weights if weights is None else weights),
        trainer={**genuine_trainer, **(trainer or {})},
        local={**genuine_local, **(local or {})},
        sharded=entries or None,
    )
    return written.path


def marker_fields(path) -> dict:
    """The ``COMPLETE`` marker of a standard checkpoint, parsed."""
    return json.loads((pathlib.Path(path) / "COMPLETE").read_text())
