"""Columnar storage for ``run.history``: one packed array per logged name, so a step costs bytes, not a dict.

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

from array import array

__all__ = ["Column", "Table"]

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
        self.kind = None  # "int", "float", "str" (indices into ``strings``) or "object": what ``values`` holds
        self.values = None  # made at the first value
        self.strings, self.index = [], {}  # a "str" column: each string once, and its position
        self.missing = None  # bytearray: 1 where a row lacks the value; made at the first such row
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
