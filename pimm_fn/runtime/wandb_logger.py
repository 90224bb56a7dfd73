"""The Weights & Biases logger (the ``wandb`` extra): a resumed run logs on into the same W&B run, no step twice.

What the W&B run already holds is read from its offline files
(``pimm_fn.runtime.wandb_offline``) or from the note this logger rewrites
after every record (``save_dir/wandb-run-steps.json``). The tracker
conventions it shares with the others (scalar names, the remembered run
id, what is left unsent) are ``pimm_fn.runtime.trackers``'.
"""

import json
import os
import types
from pathlib import Path

from pimm_fn.runtime.loggers import Opening
from pimm_fn.runtime.trackers import remember, remembered, require, unsent
from pimm_fn.runtime.wandb_offline import held_offline

__all__ = ["WandbLogger"]


def _held_steps(save_dir, name: str, run_id: str) -> dict:
    """``{scalar name: last step}`` a previous process sent to the tracker run ``run_id`` (``save_dir/<name>``).

    The note is its first line (``_Note`` rewrites it in place: a longer older note may trail it).
    """
    path = Path(save_dir) / name if save_dir is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text().split("\n", 1)[0])
        return {k: int(v) for k, v in saved.get("steps", {}).items()} if saved.get("id") == run_id else {}
    except (ValueError, AttributeError, TypeError, OverflowError):  # OverflowError: int() of a step like 1e400 (inf)
        return {}  # a damaged note: the tracker gets the repeated steps, nothing else is lost


class _Note:
    """``save_dir/<name>``: the tracker run's id and last step per name, rewritten in place after every record.

    One ``pwrite`` at offset 0 and a truncate, no open or rename per record
    (a few microseconds): a process killed at any instant leaves the note
    of the last record sent, its first line whole (``_held_steps``).
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, run_id: str, held: dict) -> None:
        data = (json.dumps({"id": run_id, "steps": held}, sort_keys=True) + "\n").encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def close(self) -> None:
        os.close(self._fd)


class WandbLogger:
    """Weights & Biases (the ``wandb`` extra); ``mode="offline"`` writes local files only.

    The W&B run id is kept in ``save_dir/wandb-run-id``, so a resumed run
    logs on into the same W&B run (offline, a second ``offline-run-*``
    directory of the same id, which ``wandb sync`` joins). W&B cannot take
    a step back (offline, a rewind is not available), so a resumed run
    sends each name only the values past the last step the W&B run holds,
    and, first, the records up to the resumed step it lacks (from
    ``run.history``): W&B ends with every step once. What it holds: in
    offline mode, what its ``offline-run-*`` files hold (a ``wandb-core``
    killed outright, with its process, loses what it had not written:
    ``pimm_fn.runtime.wandb_offline``); online, or where those files do not
    parse, ``save_dir/wandb-run-steps.json``, the last step handed to W&B
    for each name, rewritten after every record (one ``pwrite``), so a
    ``SIGKILL`` leaves it exact but for a kill in the microseconds between
    W&B taking a record and that rewrite (that record is sent again).

    ``mode="offline"`` (or ``WANDB_MODE=offline``) needs no network and no
    account: the files go to ``save_dir/wandb``; ``WANDB_SILENT=true``
    quiets wandb's console.

    Args:
        project, name, mode: as ``wandb.init`` takes them.
        init: more ``wandb.init`` arguments (``config``, ``tags``, ``entity``...).
    """

    ID_FILE = "wandb-run-id"
    STEPS_FILE = "wandb-run-steps.json"

    def __init__(self, project: str | None = None, *, name: str | None = None, mode: str | None = None, **init):
        self.project, self.name, self.mode, self.init = project, name, mode, init
        self._run = None
        self._id = None
        self._held = {}  # scalar name -> the last step the W&B run holds for it
        self._note = None  # save_dir/wandb-run-steps.json, while open

    def open(self, opening: Opening) -> None:
        wandb = require("wandb", "wandb", "WandbLogger")
        run_id = self._id or remembered(opening.save_dir, self.ID_FILE, opening.resumed)
        where = {"dir": str(opening.save_dir)} if opening.save_dir is not None else {}
        if where:
            Path(opening.save_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=self.project, name=self.name, mode=self.mode, id=run_id,
                               resume="allow" if run_id else None, **where, **self.init)
        if self._id is None and run_id is not None:  # a resumed process: what the run holds already
            self._held = self._holding(opening.save_dir, run_id)
        self._id = self._run.id
        remember(opening.save_dir, self.ID_FILE, self._id)
        if opening.save_dir is not None:
            self._note = _Note(Path(opening.save_dir) / self.STEPS_FILE)
            self._note.write(self._id, self._held)  # a fresh run's empty note: no earlier run's steps held
        if opening.history is not None and not opening.continued:
            self._send_missing(opening.history)

    def _holding(self, save_dir, run_id: str) -> dict:
        """What the W&B run ``run_id`` holds: offline, what its files hold (a killed W&B loses what it had not
        written: ``pimm_fn.runtime.wandb_offline``); else, or unreadable, the note of what was handed over."""
        if self._run.offline and save_dir is not None:
            found = held_offline(Path(save_dir) / "wandb", run_id)
            if found is not None:
                return found
        return _held_steps(save_dir, self.STEPS_FILE, run_id)

    def _send_missing(self, history) -> None:
        """The resumed run's records (up to its step) that W&B lacks, sent again from ``run.history``, in order."""
        for row in history.records():
            values = {k: v for k, v in row.items() if k not in ("step", "kind")}
            self.write(types.SimpleNamespace(step=row["step"], kind=row["kind"], values=values))

    def write(self, record) -> None:
        points = unsent(record, self._held)
        if points:
            self._run.log(points, step=record.step)
            if self._note is not None:
                self._note.write(self._id, self._held)  # what W&B holds now, kept through a kill

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
        if self._note is not None:
            self._note.close()
            self._note = None

    def __repr__(self):
        return f"WandbLogger(project={self.project!r})"
