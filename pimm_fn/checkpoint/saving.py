"""How a run saves: ``loop(saving=Saving(...))``, one frozen value the save handler reads.

*When* to save is the hooks' (``save_every``); *how* is this value's: the
checkpoint format, which ``iter_<step>`` snapshots to keep, whether a sharded
model's full weights are gathered into ``model.pth``, whether each file's
SHA-256 is recorded, and whether a store's missing bucket may be created. Each field keeps the name the keyword had when ``loop()``
took it directly, and is checked at construction with the same message.

>>> Saving(checkpoint_format="legacy")
Saving(checkpoint_format='legacy', keep=None, weights_file=True, digests=False, create_bucket=False)
>>> Saving(digests="yes")
Traceback (most recent call last):
TypeError: loop: 'digests' must be a bool (got 'yes'); pass True or False
"""

from typing import ClassVar

import attrs

from pimm_fn.core import retention
from pimm_fn.core import validate as v

__all__ = ["Saving"]

_BOOL = v.is_bool.with_hint("pass True or False")


def _policy(instance, attribute, value) -> None:
    """``keep`` is ``None`` (keep every snapshot) or a retention policy (``keep_last(3)``...)."""
    retention.resolve(value, None, caller="loop")


@attrs.frozen
class Saving:
    """How to save, separate from when (the hooks).

    Args:
        checkpoint_format: ``"standard"`` (weights + a ``torch.distributed.checkpoint``
            directory) or ``"legacy"`` (one file, written by the main rank).
        keep: which ``iter_<step>`` snapshots (``save_every(n, snapshots=True)``)
            to keep, as a retention policy (``pimm_fn.core.retention``):
            ``keep_last(n)``, ``keep_every(k)``, ``keep_best(k, "mIoU", mode="max")``,
            or several joined with ``any_of`` (or ``|``). Applied by the main
            rank after each save is published; ``last``, the ``model_best``
            files and the newest complete checkpoint are never deleted.
            ``keep_best`` ranks a snapshot by the metrics the run had
            published at that save (recorded in its marker). ``None`` keeps all.
        weights_file: with a sharded model, gather its full weights into each
            checkpoint's ``model.pth`` (collective). ``False`` skips the gather
            for a model too large for rank 0's memory: the checkpoint then holds
            the shards only (``pimm_fn.checkpoint.load_weights_file`` assembles
            them). Replicated models always write ``model.pth``.
        digests: record each checkpoint file's SHA-256 in its ``COMPLETE``
            marker (standard format), and the best model's in its ``.json``;
            ``resume``, a warm start (``load_weights``: the files it reads),
            ``run.test(weights="best")`` and ``python -m pimm_fn verify`` then check them. Off by default: it adds about a third to a
            synchronous save (``benchmarks/RESULTS.md``).
        create_bucket: with a ``save_dir`` on a store with buckets
            (``s3://bucket/exp``, ``gs://``), create its bucket when it does
            not exist. Off by default: a missing bucket is refused before
            anything is written, naming it, since a mistyped name would
            otherwise be created and trained into. A store without buckets
            (``memory://``) has nothing to create.
    """

    factory_name: ClassVar[str] = "loop"  # its errors read as loop()'s did: these were loop()'s keywords

    checkpoint_format: str = attrs.field(default="standard", validator=v.one_of("standard", "legacy"))
    keep: object = attrs.field(default=None, validator=_policy)
    weights_file: bool = attrs.field(default=True, validator=_BOOL)
    digests: bool = attrs.field(default=False, validator=_BOOL)
    create_bucket: bool = attrs.field(default=False, validator=_BOOL)
