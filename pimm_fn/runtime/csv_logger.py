"""``CSVLogger``: a run's records as comma-separated values, a column per name, following the logger lifecycle.

The lifecycle (open, write, close; a resume drops the rows past its step,
a fresh run sets an earlier file aside) is ``pimm_fn.runtime.loggers``'.
"""

import csv
import math
import os
from pathlib import Path

from pimm_fn.core import records
from pimm_fn.core.effects import Log
from pimm_fn.runtime.loggers import LogFile, Opening, keep_lines, local_path, resolve_path, set_aside

__all__ = ["CSVLogger"]


class CSVLogger:
    """Comma-separated values, one row per record: ``step,kind,`` then every name logged.

    A name first logged mid-run adds a column: the file is rewritten with
    it (a few times a run at most). Empty cells where a record lacks a name.

    Args:
        path: the file; default ``save_dir/log.csv``.
    """

    def __init__(self, path=None):
        self.path = local_path(self, path)
        self._file = None
        self._columns: list = []
        self._where = None

    def open(self, opening: Opening) -> None:
        path = self._where = resolve_path(self, self.path, opening.save_dir, "log.csv", store=opening.store)
        if opening.resumed and not opening.continued:
            header = _header(path)
            keep_lines(path, lambda line: line == header or _step_of_csv(line) <= opening.step, opening.say,
                       f"row(s) after step {opening.step}, where the run resumed")
        elif not opening.continued:
            set_aside(path, opening.say)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = _header(path)  # a resumed or continued file keeps its columns
        self._columns = next(csv.reader([header])) if header else []
        self._file = LogFile(path, newline="")

    def write(self, record: Log) -> None:
        row = records.row(record.step, record.kind, record.values)
        new = [name for name in row if name not in self._columns]
        if new:
            self._widen(self._columns + new)
        csv.DictWriter(self._file, self._columns).writerow(row)
        self._file.flush()

    def _widen(self, columns: list) -> None:
        """Rewrite the file under the header ``columns`` (a new name came)."""
        self._file.close()
        with open(self._where, newline="") as file:
            rows = list(csv.DictReader(file))
        temp = self._where.with_name(self._where.name + ".tmp")
        with open(temp, "w", newline="") as file:
            writer = csv.DictWriter(file, columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temp, self._where)
        self._columns = columns
        self._file = LogFile(self._where, newline="")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __repr__(self):
        return f"CSVLogger({str(self.path)!r})" if self.path is not None else "CSVLogger()"


def _header(path: Path) -> str:
    if not path.is_file():
        return ""
    with open(path, newline="") as file:
        return file.readline()


def _step_of_csv(line: str) -> float:
    try:
        return int(line.split(",", 1)[0])
    except ValueError:
        return math.inf
