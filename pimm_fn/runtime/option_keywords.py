"""``loop()``'s option keywords: each given as its value, and the keywords that moved into one or went.

A keyword ``loop()`` took before its options were values (``MOVED``) is
refused with a ``TypeError`` naming the value it moved to; one that went
without a value of its own (``GONE``: ``keep_snapshots=``, ``optimizers=``)
with what to pass instead. An option given as something other than its
value (``saving={...}``) is refused the same way.
"""

from collections.abc import Mapping

from pimm_fn.core import validate as v
from pimm_fn.runtime.options import Parallel, Preemption, Resuming, Saving, Training, Watching

__all__ = ["MOVED", "GONE", "refuse_moved", "check_options"]


# The keywords loop() took before its options became values: where each went (keep_snapshots went away).
MOVED = {
    **{name: ("saving", "Saving") for name in ("checkpoint_format", "keep", "weights_file", "digests")},
    **{name: ("resuming", "Resuming") for name in ("strict_resume", "resume_hyperparameters")},
    **{name: ("watching", "Watching") for name in ("console", "progress", "log_reduce", "keep_trace")},
    **{name: ("parallel", "Parallel") for name in ("ddp", "check_agreement")},
    **{name: ("training", "Training") for name in ("on_nonfinite", "scaler", "extra_state", "config",
                                                   "iters_per_epoch")},
}

# The keywords that went without a value of their own: what to pass instead.
GONE = {
    "keep_snapshots": "saving=pimm_fn.Saving(keep=pimm_fn.keep_last(n)), the same policy",
    "optimizers": "optimizer={name: optimizer, ...}, which a custom step_fn receives as its 'optimizer'",
}


def refuse_moved(given: Mapping) -> None:
    """Raise the ``TypeError`` for the first keyword ``loop()`` does not take, saying where a moved one went.

    >>> refuse_moved({"checkpoint_format": "legacy"})
    Traceback (most recent call last):
    TypeError: loop() no longer takes checkpoint_format=: pass saving=pimm_fn.Saving(checkpoint_format=...)
    >>> refuse_moved({"keep_snapshots": 3})
    Traceback (most recent call last):
    TypeError: loop() no longer takes keep_snapshots=: pass saving=pimm_fn.Saving(keep=pimm_fn.keep_last(n)), the same policy
    >>> refuse_moved({"optimizers": {}})
    Traceback (most recent call last):
    TypeError: loop() no longer takes optimizers=: pass optimizer={name: optimizer, ...}, which a custom step_fn receives as its 'optimizer'
    """
    for name in given:
        if name in GONE:
            raise TypeError(f"loop() no longer takes {name}=: pass {GONE[name]}")
        if name in MOVED:
            keyword, value = MOVED[name]
            raise TypeError(f"loop() no longer takes {name}=: pass {keyword}=pimm_fn.{value}({name}=...)")
        raise TypeError(f"loop() got an unexpected keyword argument {name!r}")


def check_options(**values) -> None:
    """Each of loop()'s option values is of its type (``saving=`` a ``Saving``...), refused with the fix otherwise.

    >>> check_options(watching={"console": False})
    Traceback (most recent call last):
    TypeError: loop: 'watching' must be a pimm_fn.Watching (got {'console': False}); pass watching=pimm_fn.Watching(...)
    """
    for name, value in values.items():
        kind = _KINDS[name]
        v.instance_of(kind, expected=f"a pimm_fn.{kind.__name__}").with_hint(
            f"pass {name}=pimm_fn.{kind.__name__}(...)").check(value, name, owner="loop")


_KINDS = {"saving": Saving, "resuming": Resuming, "watching": Watching, "parallel": Parallel, "training": Training,
          "preemption": Preemption}
