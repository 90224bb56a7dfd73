"""What a run logged, as columns: ``run.history``, ready for pandas and matplotlib.

Every ``Log`` record the main rank wrote (``log_every``'s step outputs at
its cadence, epoch means, each evaluation) in order, kept beside the run,
never in its ``State``: a checkpoint does not grow with it, and a ``State``
repr does not print it. A resumed run rebuilds it from ``save_dir/log.jsonl``
up to the step it resumed at, so its history goes on from there with no
step twice; a damaged line of that file is left out (``pimm_fn.runtime.jsonl``). On the other ranks it is empty.

pandas and matplotlib are optional: ``to_pandas`` and ``plot`` import them
when called and say which extra to install when missing.
"""

import importlib

from pimm_fn.core.records import POSITION, row  # POSITION: where a record was taken, which plot() leaves out
from pimm_fn.runtime.jsonl import read_records

__all__ = ["History", "read_jsonl"]


def _matches(kind: str, wanted: str) -> bool:
    """``wanted`` names ``kind`` itself or its family (``"eval"`` names ``"eval/val"``)."""
    return kind == wanted or kind.startswith(wanted + "/")


def _require(module: str, extra: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"History.{what} needs {module.split('.')[0]}: pip install 'pimm_fn[{extra}]' "
            f"(or pip install {module.split('.')[0]})"
        ) from error


class History:
    """The records a run logged, in order: ``(step, kind, values)``; see the module docstring.

    >>> h = History([(2, "train", {"loss": 0.5}), (4, "train", {"loss": 0.25}), (4, "eval/val", {"acc": 0.9})])
    >>> h.columns("train")
    {'step': [2, 4], 'loss': [0.5, 0.25]}
    >>> len(h), h.kinds
    (3, ('train', 'eval/val'))
    >>> h
    History(3 records, steps 2-4: train x2 (loss), eval/val x1 (acc))
    """

    def __init__(self, records=()):
        self._records = [(int(step), str(kind), dict(values)) for step, kind, values in records]

    def append(self, step: int, kind: str, values) -> None:
        self._records.append((step, kind, dict(values)))

    def __len__(self) -> int:
        return len(self._records)

    @property
    def kinds(self) -> tuple:
        """The kinds of record, in the order they first came (``train``, ``epoch``, ``eval/<name>``)."""
        return tuple(dict.fromkeys(kind for _, kind, _ in self._records))

    def records(self, kind: str | None = None) -> list:
        """Each record as a dict ``{"step", "kind", **values}``: all, or those of ``kind`` (or its family)."""
        return [row(s, k, v) for s, k, v in self._records if kind is None or _matches(k, kind)]

    def columns(self, kind: str = "train") -> dict:
        """``{"step": [...], name: [...]}`` over the records of ``kind``; ``None`` where a record lacks a name.

        ``kind`` also names a family: ``"eval"`` takes every ``eval/<name>``
        record, with a ``"kind"`` column when more than one kind came.
        """
        chosen = [(s, k, v) for s, k, v in self._records if _matches(k, kind)]
        names = dict.fromkeys(name for _, _, v in chosen for name in v)
        columns = {"step": [s for s, _, _ in chosen]}
        if len({k for _, k, _ in chosen}) > 1:
            columns["kind"] = [k for _, k, _ in chosen]
        for name in names:
            if name not in columns:
                columns[name] = [v.get(name) for _, _, v in chosen]
        return columns

    def to_pandas(self, kind: str = "train"):
        """The records of ``kind`` as a ``pandas.DataFrame``, one row per record (needs the ``pandas`` extra)."""
        pandas = _require("pandas", "pandas", "to_pandas")
        return pandas.DataFrame(self.columns(kind))

    def plot(self, *keys: str, kind: str | None = None, ax=None):
        """Plot ``keys`` against the step, one line per kind that logged each; returns the matplotlib ``Axes``.

        With no ``keys``: ``"loss"`` when logged (the step losses and the
        epoch means), else every value of the ``train`` records. ``kind``
        keeps one kind (or family); ``ax`` draws into existing axes. Needs
        the ``plot`` extra (matplotlib).

        Raises:
            KeyError: no record of that kind holds any of ``keys``, naming what was logged.
        """
        kinds = [k for k in self.kinds if kind is None or _matches(k, kind)]
        keys = keys or self._default_keys(kinds)
        series = [(k, key, self._series(k, key)) for k in kinds for key in keys]
        series = [(k, key, xy) for k, key, xy in series if xy[0]]
        if not series:
            logged = {k: sorted({n for _, kk, v in self._records if kk == k for n in v}) for k in self.kinds}
            where = "any kind" if kind is None else repr(kind)
            raise KeyError(f"history has no {list(keys)} in {where} (logged: {logged})")
        if ax is None:
            ax = _require("matplotlib.pyplot", "plot", "plot").subplots()[1]
        for k, key, (xs, ys) in series:
            ax.plot(xs, ys, label=f"{key} ({k})", marker="o" if len(xs) <= 30 else None)
        ax.set_xlabel("step")
        ax.legend()
        return ax

    def _default_keys(self, kinds) -> tuple:
        if any("loss" in v for _, k, v in self._records if k in kinds):
            return ("loss",)
        return tuple(n for n in self.columns(kinds[0] if kinds else "train") if n not in ("step", "kind", *POSITION))

    def _series(self, kind: str, key: str) -> tuple[list, list]:
        """``(steps, values)`` of ``key`` in the records of exactly ``kind``, numbers only."""
        pairs = [(s, v[key]) for s, k, v in self._records if k == kind and _number(v.get(key))]
        return [s for s, _ in pairs], [y for _, y in pairs]

    def __repr__(self):
        if not self._records:
            return "History(0 records)"
        parts = []
        for kind in self.kinds:
            chosen = [v for _, k, v in self._records if k == kind]
            names = [n for n in dict.fromkeys(n for v in chosen for n in v) if n not in POSITION]
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            parts.append(f"{kind} x{len(chosen)} ({shown})")
        steps = [s for s, _, _ in self._records]
        return f"History({len(self)} records, steps {min(steps)}-{max(steps)}: {', '.join(parts)})"

    @classmethod
    def from_jsonl(cls, path, upto: int | None = None) -> "History":
        """The history a ``log.jsonl`` holds, up to step ``upto`` (all when ``None``); empty when there is none."""
        return cls((r["step"], r["kind"], r["values"]) for r in read_jsonl(path) if upto is None or r["step"] <= upto)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_jsonl(path) -> list:
    """The records of a ``log.jsonl`` as ``{"step", "kind", "values"}``, non-finite floats restored.

    A damaged line (not UTF-8, not JSON, or the last one, cut by a kill mid-write) is left out
    (``pimm_fn.runtime.jsonl``); nothing is written.
    """
    return [{"step": step, "kind": kind, "values": values} for step, kind, values in read_records(path)]
