"""What an offline W&B run holds: the last step of each scalar in its ``offline-run-*`` files.

A W&B process killed outright (``SIGKILL``, a node lost) loses what its
``wandb-core`` had not yet written: an offline run's ``.wandb`` file holds
only what was flushed (often nothing of a short process). So a resumed
``WandbLogger`` in offline mode asks the files themselves, not only its own
note of what it handed over: what they hold is what ``wandb sync`` uploads.

The format is W&B's transaction log: a 7-byte header, then a LevelDB log
(32 KiB blocks of records, each a 7-byte header: CRC, length, type) of
``wandb_internal_pb2.Record`` protobufs; a ``history`` record carries the
step and the values. Reading runs no code from the file (protobuf parsing).
A file that does not parse (another W&B version's format) gives ``None``:
the caller keeps its note.
"""

import json
from pathlib import Path

__all__ = ["held_offline"]

_BLOCK, _HEADER, _FILE_HEADER = 32768, 7, 7
_FULL, _LAST = 1, 4  # a record in one piece, and the last piece of one


def _records(data: bytes):
    """The payloads of the log's whole records (a record cut short at the end, by a kill, is left out)."""
    pos, part = _FILE_HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if pos + _HEADER + length > len(data):
            return
        part, pos = part + data[pos + _HEADER:pos + _HEADER + length], pos + _HEADER + length
        if kind in (_FULL, _LAST):
            yield part
            part = b""


def _held_in(path: Path, held: dict) -> None:
    from wandb.proto import wandb_internal_pb2  # the logger's own package: present when it runs

    for payload in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        step = record.history.step.num
        for item in record.history.item:
            name = item.key or "/".join(item.nested_key)
            if not name.startswith("_") and json.loads(item.value_json) is not None:
                held[name] = max(held.get(name, -1), step)


def held_offline(wandb_dir, run_id: str) -> dict | None:
    """``{scalar name: last step}`` the offline runs of ``run_id`` under ``wandb_dir`` hold; ``None``: unreadable."""
    held: dict = {}
    try:
        for path in sorted(Path(wandb_dir).glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
            _held_in(path, held)
    except Exception:  # noqa: BLE001 - another W&B version's format: the caller keeps its note
        return None
    return held
