"""A log record's own fields, and the names its values may take.

A ``Log`` record is one line of ``save_dir/log.jsonl`` (and one row of
``log.csv``, one record of ``run.history``): its own fields first, then the
values it carries::

    {"step": 10, "kind": "train", "epoch": 0, "iter": 10, "of": 50, "over": "rank 0", "loss": 0.38}

``step`` and ``kind`` (``FIELDS``) say where the record belongs: a resume
keeps the lines up to its checkpoint's step. ``epoch``, ``of_epochs``,
``iter``, ``of`` and ``over`` (``POSITION``) say where a training record
was taken and whose outputs it holds. A measured value (a train step's
output, an evaluator's metric) under one of these names would overwrite
the field and lose the record, so :func:`named` refuses it where the values
come in, with the fix. So it does two names that read alike once written
(``1`` and ``"1"``: JSON's keys are strings), which would lose one value.
"""

from collections.abc import Mapping

__all__ = ["FIELDS", "POSITION", "RESERVED", "fits", "named", "row", "unrow"]

FIELDS = ("step", "kind")  # every record's own fields, in the order a line begins with them
POSITION = ("epoch", "of_epochs", "iter", "of", "over")  # where a training record was taken, whose outputs
RESERVED = FIELDS + POSITION  # what a measured value may not be named


def named(values: Mapping, who: str, prefix: str = "my", reserved=RESERVED) -> dict:
    """``values`` under ``str`` names; a ``ValueError`` naming ``who`` for a reserved name or two alike.

    ``who`` says whose values they are (``"evaluator 'val' returned metric"``);
    the error names the value and the fix: rename it (``'<prefix>_step'``).

    >>> named({"acc": 0.9, 1: 0.5}, "evaluator 'val' returned metric", "val")
    {'acc': 0.9, '1': 0.5}
    >>> named({"step": 3.0}, "evaluator 'val' returned metric", "val")
    Traceback (most recent call last):
    ...
    ValueError: evaluator 'val' returned metric 'step', but log records (log.jsonl, run.history) carry a field ...
    """
    if fits(values, reserved):  # the common case, every logged step: no message built
        return {key if key.__class__ is str else str(key): value for key, value in values.items()}
    found = {}
    for key in values:
        name = str(key)
        if name in reserved:
            raise ValueError(
                f"{who} {key!r}, but log records (log.jsonl, run.history) carry a field of that name "
                f"({', '.join(reserved)}), which it would overwrite: rename it (e.g. '{prefix}_{name}')"
            )
        if name in found:
            raise ValueError(
                f"{who} {found[name]!r} and {key!r}, which are one name once written (log.jsonl's names are "
                f"strings): one value would be lost; give each a distinct string name"
            )
        found[name] = key
    raise AssertionError("fits() and named() disagree")  # unreachable: fits() said a name was wrong


def fits(values: Mapping, reserved=RESERVED) -> bool:
    """No name of ``values`` is ``reserved`` and no two read alike once written: what :func:`named` checks.

    >>> fits({"acc": 0.9, 1: 0.5}), fits({"step": 1}), fits({1: 0.5, "1": 0.5}), fits({"step": 1}, reserved=())
    (True, False, False, True)
    """
    keys = values.keys()
    if all(key.__class__ is str for key in keys):  # the common case: names as they are written
        return keys.isdisjoint(reserved)
    names = set(map(str, keys))
    return len(names) == len(keys) and names.isdisjoint(reserved)


def row(step: int, kind: str, values: Mapping) -> dict:
    """The line a record is written as: ``FIELDS`` first, then its values.

    >>> row(4, "eval/val", {"acc": 0.9})
    {'step': 4, 'kind': 'eval/val', 'acc': 0.9}
    """
    return {"step": step, "kind": kind, **values}


def unrow(line: Mapping) -> tuple:
    """``(step, kind, values)`` of a line read back; a ``KeyError`` when it lacks a field.

    >>> unrow({"step": 4, "kind": "eval/val", "acc": 0.9})
    (4, 'eval/val', {'acc': 0.9})
    """
    values = dict(line)
    return values.pop("step"), values.pop("kind"), values
