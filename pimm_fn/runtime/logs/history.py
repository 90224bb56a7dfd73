"""What a run logged, as columns: ``run.history``, one packed array per logged name.

Every ``Log`` record the main rank wrote (``log_every``'s step outputs at
its cadence, epoch means, each evaluation) in order, kept beside the run,
never in its ``State``: a checkpoint does not grow with it, and a ``State``
repr does not print it. A resumed run rebuilds it from ``save_dir/log.jsonl``
up to the step it resumed at, so its history goes on from there with no
step twice; a damaged line of that file is left out (``pimm_fn.runtime.logs.loggers``). On the other ranks it is empty.

The records are stored as columns, one table per kind and one packed
array per logged name (``pimm_fn.runtime.logs.history``), with each record's
kind in order beside them: a step logged with ``log_every(1)`` holds under
30 bytes, not a dict. ``records()`` rebuilds the dicts when asked, each
value of the type it was logged as.

pandas and matplotlib are optional: ``to_pandas`` and ``plot`` import them
when called and say which extra to install when missing.

Columnar storage for ``run.history``: one packed array per logged name, so a step costs bytes, not a dict.

A run logging every step for a million steps must not hold a dict (some
hundreds of bytes) per step. A :class:`Table` holds the records of one kind as
columns: ``steps`` and one :class:`Column` per value name, all of one
length. A column packs ints in the narrowest ``array`` typecode that fits
(widened when a larger one comes) and floats in ``array('d')`` (a NaN
logged stays a NaN); strings are kept once each with an index per row;
anything else (a bool, ``None``, another object) turns the column into a
plain list. A row that lacks the name is marked in a byte mask made at the
first such row, so "missing" and a logged NaN stay distinct. Every value
reads back as the type it was logged as.
"""

import importlib
import os
from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pimm_fn.core.effects import POSITION, row  # POSITION: where a record was taken, which plot() leaves out
from pimm_fn.runtime.logs.loggers import read_records

if TYPE_CHECKING:  # matplotlib is the plot extra's
    from matplotlib.axes import Axes

__all__ = [
    "Column",
    "Table",
    "History",
    "read_jsonl",
]


_INTS = ("b", "h", "i", "q")  # the typecodes an int column widens through


_LIMITS = {code: 1 << (array(code).itemsize * 8 - 1) for code in _INTS}


_SAME = {"float": float, "int": int, "str": None, "object": None, None: None}  # values appended as they come


def _int_code(value: int) -> str | None:
    """The narrowest typecode holding ``value``; ``None`` when even ``'q'`` cannot."""
    for code in _INTS:
        if -_LIMITS[code] <= value < _LIMITS[code]:
            return code
    return None


class Column:
    """One value per row: packed while every value is an int, a float or a str; see the module docstring."""

    __slots__ = ("kind", "values", "strings", "index", "missing", "leading")

    def __init__(self, rows_before: int = 0):
        # "int", "float", "str" (indices into ``strings``) or "object": what ``values`` holds
        self.kind: str | None = None
        # Made at the first value: an array of ``kind`` ("d"; "b" widened up to "q" for "int" and "str"), a list for
        # "object". ``kind`` says which, where mypy cannot: the appends of every logged step read no type.
        self.values: Any = None
        self.strings: list[str] = []  # a "str" column: each string once,
        self.index: dict[str, int] = {}  # and its position
        self.missing: bytearray | None = None  # 1 where a row lacks the value; made at the first such row
        self.leading = 0  # rows before the first value (all missing)
        for _ in range(rows_before):
            self.skip()

    def __len__(self) -> int:
        return self.leading if self.values is None else len(self.values)

    def append(self, value) -> None:
        if value.__class__ is _SAME[self.kind]:  # the common case, every logged step: a number like the last
            try:
                self.values.append(value)
            except OverflowError:  # an int past the array's typecode: widened below
                pass
            else:
                if self.missing is not None:
                    self.missing.append(0)
                return
        kind = _kind_of(value)
        if self.kind is None:
            self._begin(kind)
        elif kind != self.kind and self.kind != "object":
            self._to_objects()
        if self.kind == "str":
            value = self._code(value)
            self._fits(value)
        elif self.kind == "int" and not self._fits(value):
            self._to_objects()
        self.values.append(value)
        if self.missing is not None:
            self.missing.append(0)

    def skip(self) -> None:
        """A row without this value."""
        if self.missing is None:
            self.missing = bytearray(len(self))
        self.missing.append(1)
        if self.values is None:
            self.leading += 1
        else:
            self.values.append(None if self.kind == "object" else 0)

    def _begin(self, kind: str) -> None:
        self.kind = kind
        self.values = [] if kind == "object" else array("d" if kind == "float" else "b")
        self.values.extend([None if kind == "object" else 0] * self.leading)

    def _code(self, text: str) -> int:
        code = self.index.get(text)
        if code is None:
            code = self.index[text] = len(self.strings)
            self.strings.append(text)
        return code

    def _fits(self, value: int) -> bool:
        """Widen the int array to hold ``value``; ``False`` when no typecode can."""
        code = _int_code(value)
        if code is None:
            return False
        if _INTS.index(code) > _INTS.index(self.values.typecode):
            self.values = array(code, self.values)
        return True

    def _to_objects(self) -> None:
        """Values of mixed types: keep each as logged, in a list."""
        self.values = [self.get(i) for i in range(len(self))]
        self.kind, self.strings, self.index = "object", [], {}

    def _read(self, i: int):
        value = self.values[i]
        return self.strings[value] if self.kind == "str" else value

    def get(self, i: int, default=None):
        """The value of row ``i``, ``default`` where the row lacks it."""
        if self.missing is not None and self.missing[i]:
            return default
        return self._read(i)

    def has(self, i: int) -> bool:
        return self.missing is None or not self.missing[i]

    def to_list(self, default=None) -> list:
        """Every row's value, ``default`` where a row lacks it."""
        if self.values is None:
            return [default] * self.leading
        if self.missing is None and self.kind != "str":
            return list(self.values) if self.kind == "object" else self.values.tolist()
        return [self.get(i, default) for i in range(len(self))]


def _kind_of(value) -> str:
    cls = value.__class__
    if cls is float or isinstance(value, float):
        return "float"
    if cls is int:
        return "int"
    if cls is str:
        return "str"
    return "object"


class Table:
    """The records of one kind as columns: ``steps`` and ``columns[name]``, all ``rows`` long."""

    __slots__ = ("steps", "columns", "rows")

    def __init__(self):
        self.steps, self.columns, self.rows = Column(), {}, 0

    def append(self, step: int, values) -> None:
        self.steps.append(step)
        columns = self.columns
        for name, value in values.items():
            column = columns.get(name)
            if column is None:
                column = columns[name] = Column(self.rows)
            column.append(value)
        self.rows += 1
        if len(values) < len(columns):  # a name this record lacks: a missing row in its column
            for column in columns.values():
                if len(column) < self.rows:
                    column.skip()

    def row(self, i: int) -> dict:
        """Row ``i``'s values by name, the names it lacks left out."""
        return {name: column._read(i) for name, column in self.columns.items() if column.has(i)}


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

    def __init__(self, records: Iterable[tuple[int, str, Mapping[str, Any]]] = ()) -> None:
        self._tables: dict[str, Table] = {}  # kind -> Table, in the order the kinds first came
        self._codes: dict[str, int] = {}  # kind -> its position in _tables
        self._order = Column()  # each record's kind, as its position in _tables: the records' order
        for step, kind, values in records:
            self.append(int(step), str(kind), values)

    def append(self, step: int, kind: str, values: Mapping[str, Any]) -> None:
        table = self._tables.get(kind)
        if table is None:
            self._codes[kind] = len(self._tables)
            table = self._tables[kind] = Table()
        table.append(step, values)
        self._order.append(self._codes[kind])

    def __len__(self) -> int:
        return len(self._order)

    @property
    def kinds(self) -> tuple:
        """The kinds of record, in the order they first came (``train``, ``epoch``, ``eval/<name>``)."""
        return tuple(self._tables)

    def _chosen(self, kind: str | None) -> list:
        return [k for k in self._tables if kind is None or _matches(k, kind)]

    def _rows(self, kinds) -> list:
        """``(kind, table, row)`` of each record of ``kinds``, in the order they were logged."""
        if len(kinds) == 1:
            table = self._tables[kinds[0]]
            return [(kinds[0], table, i) for i in range(table.rows)]
        names, tables = list(self._tables), list(self._tables.values())
        chosen, seen, rows = {names.index(k) for k in kinds}, [0] * len(names), []
        for code in self._order.to_list():
            if code in chosen:
                rows.append((names[code], tables[code], seen[code]))
            seen[code] += 1
        return rows

    def records(self, kind: str | None = None) -> list:
        """Each record as a dict ``{"step", "kind", **values}``: all, or those of ``kind`` (or its family)."""
        return [row(table.steps.get(i), k, table.row(i)) for k, table, i in self._rows(self._chosen(kind))]

    def columns(self, kind: str = "train") -> dict:
        """``{"step": [...], name: [...]}`` over the records of ``kind``; ``None`` where a record lacks a name.

        ``kind`` also names a family: ``"eval"`` takes every ``eval/<name>``
        record, with a ``"kind"`` column when more than one kind came.
        """
        kinds = self._chosen(kind)
        if len(kinds) == 1:  # one table: its columns as they are
            table = self._tables[kinds[0]]
            return {"step": table.steps.to_list(), **{n: c.to_list() for n, c in table.columns.items()}}
        rows = self._rows(kinds)
        columns = {"step": [table.steps.get(i) for _, table, i in rows]}
        if len(kinds) > 1:
            columns["kind"] = [k for k, _, _ in rows]
        for name in dict.fromkeys(n for k in kinds for n in self._tables[k].columns):
            if name not in columns:
                columns[name] = [_value(table, name, i) for _, table, i in rows]
        return columns

    def to_pandas(self, kind: str = "train") -> Any:  # a pandas.DataFrame: pandas ships no types
        """The records of ``kind`` as a ``pandas.DataFrame``, one row per record (needs the ``pandas`` extra)."""
        pandas = _require("pandas", "pandas", "to_pandas")
        return pandas.DataFrame(self.columns(kind))

    def plot(self, *keys: str, kind: str | None = None, ax: "Axes | None" = None) -> "Axes":
        """Plot ``keys`` against the step, one line per kind that logged each; returns the matplotlib ``Axes``.

        With no ``keys``: ``"loss"`` when logged (the step losses and the
        epoch means), else every value of the ``train`` records. The first
        key is drawn on ``ax`` with its name as the y-label; the other keys
        on a second y-axis at the right (a twin of ``ax``, the last of
        ``ax.figure.axes``), so ``plot("loss", "lr")`` shows the lr on its
        own scale. ``kind`` keeps one kind (or
        family); ``ax`` draws into existing axes. Needs the ``plot`` extra
        (matplotlib).

        Raises:
            KeyError: no record of that kind holds any of ``keys``, naming what was logged.
        """
        kinds = self._chosen(kind)
        keys = keys or self._default_keys(kinds)
        series = [(k, key, self._series(k, key)) for k in kinds for key in keys]
        series = [(k, key, xy) for k, key, xy in series if xy[0]]
        if not series:
            logged = {k: sorted(table.columns) for k, table in self._tables.items()}
            where = "any kind" if kind is None else repr(kind)
            raise KeyError(f"history has no {list(keys)} in {where} (logged: {logged})")
        if ax is None:
            ax = _require("matplotlib.pyplot", "plot", "plot").subplots()[1]
        drawn = [key for key in keys if any(key == s for _, s, _ in series)]
        right = ax.twinx() if len(drawn) > 1 else None
        colors = iter(f"C{i}" for i in range(len(series)))  # one cycle over both axes: no two lines alike
        for k, key, (xs, ys) in series:
            on = ax if key == drawn[0] or right is None else right  # right: None only when drawn is one key
            on.plot(xs, ys, label=f"{key} ({k})", color=next(colors), marker="o" if len(xs) <= 30 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(drawn[0])
        lines = ax.get_lines()
        if right is not None:
            right.set_ylabel(", ".join(drawn[1:]))
            lines = [*lines, *right.get_lines()]
        ax.legend(lines, [str(line.get_label()) for line in lines])  # each the str label= gave it
        return ax

    def _default_keys(self, kinds) -> tuple:
        if any("loss" in self._tables[k].columns for k in kinds):
            return ("loss",)
        return tuple(n for n in self.columns(kinds[0] if kinds else "train") if n not in ("step", "kind", *POSITION))

    def _series(self, kind: str, key: str) -> tuple[list, list]:
        """``(steps, values)`` of ``key`` in the records of exactly ``kind``, numbers only."""
        table = self._tables[kind]
        column = table.columns.get(key)
        if column is None:
            return [], []
        if column.missing is None and column.kind in ("int", "float"):
            return table.steps.to_list(), column.to_list()
        pairs = [(table.steps.get(i), column.get(i)) for i in range(table.rows) if _number(column.get(i))]
        return [s for s, _ in pairs], [y for _, y in pairs]

    def __repr__(self):
        if not self._order:
            return "History(0 records)"
        parts = []
        for kind, table in self._tables.items():
            names = [n for n in table.columns if n not in POSITION]
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            parts.append(f"{kind} x{table.rows} ({shown})")
        steps = [s for table in self._tables.values() for s in (min(table.steps.values), max(table.steps.values))]
        return f"History({len(self)} records, steps {min(steps)}-{max(steps)}: {', '.join(parts)})"

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, upto: int | None = None) -> "History":
        """The history a ``log.jsonl`` holds, up to step ``upto`` (all when ``None``); empty when there is none."""
        return cls((r["step"], r["kind"], r["values"]) for r in read_jsonl(path) if upto is None or r["step"] <= upto)


def _value(table, name: str, i: int):
    column = table.columns.get(name)
    return None if column is None else column.get(i)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_jsonl(path) -> list:
    """The records of a ``log.jsonl`` as ``{"step", "kind", "values"}``, non-finite floats restored.

    A damaged line (not UTF-8, not JSON, or the last one, cut by a kill mid-write) is left out
    (``pimm_fn.runtime.logs.loggers``); nothing is written.
    """
    return [{"step": step, "kind": kind, "values": values} for step, kind, values in read_records(path)]
