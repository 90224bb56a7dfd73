"""``ls``, ``inspect`` and ``status``: what a save_dir holds, and how its run ended.

The entries of a model_dir, named by what they are: checkpoints, best-model files, unfinished saves.

``status``: how the run in a save_dir ended, read from its checkpoints, for a script that cannot trust an exit code.

A process's exit code can lie: a finished run may still abort while torch
tears its process groups down, and a launcher (torchrun) turns its workers'
75 into its own 1. The newest usable checkpoint (the one ``resume="auto"``
takes) says what happened:

- **finished** (exit 0): training ended (its budget spent, or stopped early):
  nothing is left to train;
- **to continue** (exit 75, ``EX_TEMPFAIL``): the run stopped for a
  preemption signal or ``max_time`` and saved that step (its marker's
  ``saved_for``): run it again with ``resume="auto"``;
- **stopped mid-run** (exit 4): neither: a crash, a kill, a Ctrl-C, or a run
  still going; ``resume="auto"`` goes on from that checkpoint, if the cause
  is gone.

No checkpoint is exit 3 (not found: the run never saved); checkpoints none
of which can be read, exit 1 (``verify`` says why).
"""

from __future__ import annotations

from typing import Any

import attrs
from torch.distributed.checkpoint.api import CheckpointException

import pimm_fn.compat  # noqa: F401 - the plug-in pimm_fn ships: a pimm run's slots (its savers') decode
from pimm_fn.checkpoint import best_record, find_checkpoint, inspection, record_problem, storage
from pimm_fn.checkpoint.contents import from_parts
from pimm_fn.checkpoint.errors import CheckpointError, cause
from pimm_fn.checkpoint.inspection import (
    TensorInfo,
    contents_of,
    is_best_file,
    is_checkpoint_dir,
    is_marked,
    is_removal,
    newest,
    size_of,
    trainer_without_tensors,
    weights_without_tensors,
)
from pimm_fn.checkpoint.inspection import marker as marker_of
from pimm_fn.cli import DAMAGED, FINISHED, MID_RUN, NOT_FOUND, OK, TO_CONTINUE, USAGE, Failure, emit, location
from pimm_fn.core import slots

__all__ = [
    "Entry",
    "entries",
    "entry_of",
    "model_dir_of",
    "is_checkpoint_dir",
    "is_best_file",
    "reason",
    "some_damaged",
    "ls",
    "inspect",
    "row",
    "size_text",
    "values_text",
    "status",
]


# The order ``ls`` lists kinds in.
KINDS = ("checkpoint", "best", "retired", "unfinished", "set aside")


@attrs.frozen
class Entry:
    """One entry of a model_dir.

    Attributes:
        path: where it is.
        kind: ``"checkpoint"`` (``last``, ``iter_<step>``, either format),
            ``"best"`` (``model_best*.pth``), ``"retired"`` (the previous
            ``last`` during a publish), ``"unfinished"`` (``.staging-*``:
            a save in progress or interrupted, or a snapshot being removed)
            or ``"set aside"`` (``damaged-*``: kept by a save that found it damaged).
        step: the step its name says, if any.
    """

    path: storage.Location
    kind: str
    step: int | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def format(self) -> str:
        if self.kind == "best":
            return "weights"
        return "legacy" if self.path.suffix == ".pth" else "standard"


def model_dir_of(path: storage.Location, command: str) -> storage.Location:
    """The model_dir that ``path`` names: itself, or ``path/model`` for a save_dir.

    Raises:
        Failure: (not found) ``path`` is not a directory.
    """
    if not path.exists():
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a save_dir, a model_dir or a checkpoint")
    if not path.is_dir():
        raise Failure(NOT_FOUND, f"{str(path)!r} is a file; {command} takes a save_dir or model_dir")
    return path / "model" if (path / "model").is_dir() else path


def reason(exc: BaseException) -> str:
    """Why reading a checkpoint failed, in one line (DCP's wrapped failure unwrapped)."""
    return exc.summary() if isinstance(exc, CheckpointError) else cause(exc)


def some_damaged(names: list[str], total: int) -> Failure:
    """A listing's failure (exit 1) when some of its ``total`` entries, ``names``, are damaged or incomplete."""
    return Failure(DAMAGED, f"{len(names)} of {total} damaged or incomplete: {', '.join(names)}")


def entry_of(path: storage.Location) -> Entry | None:
    """What ``path`` is by its name, or ``None`` for a name no checkpoint, best file or save in progress has."""
    found = inspection.kind_of(path)
    return Entry(path, *found) if found is not None else None


def entries(model_dir: storage.Location) -> list[Entry]:
    """The entries of ``model_dir`` by kind (checkpoints first), newest first within a kind."""
    found = [e for e in map(entry_of, model_dir.iterdir()) if e is not None]
    return sorted(found, key=lambda e: (KINDS.index(e.kind), e.step is not None, -(e.step or 0), e.name))


def size_text(n: float) -> str:
    """Bytes for people: ``11.6 KB``."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def values_text(values) -> str:
    """``{"acc": 0.5}`` as ``acc=0.5`` (what a damaged marker holds instead of a dict, as it is)."""
    if not isinstance(values, dict):
        return "" if values is None else f"{values!r:.200}"
    return " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _unreadable_record(path: storage.Location, exc: Exception) -> str:
    """Why the ``.json`` beside the best-model file ``path`` cannot be shown, naming it."""
    return f"{path.with_suffix('.json').name} {record_problem(exc)}"


def row(entry: Entry) -> dict:
    """One ``ls`` line as data: step, epoch, status, size, metrics and best values.

    ``status`` is ``complete``, ``incomplete`` (no marker: never finished), ``damaged`` (a file
    missing or changed since the save), ``unfinished`` (a ``.staging-*`` leftover) or ``best``.
    """
    out: dict[str, Any] = {
        "name": entry.name,
        "kind": entry.kind,
        "format": entry.format,
        "step": entry.step,
        "epoch": None,
        "status": "unfinished",
        "problem": None,
        "size": size_of(entry.path),
        "metrics": {},
        "best": {},
    }
    if entry.kind == "unfinished":
        removing = is_removal(entry.path)
        out["problem"] = (
            "a snapshot being removed by retention"
            if removing
            else "a save in progress or interrupted: never read, the next save removes it"
        )
        return out
    if entry.kind == "best":
        out["status"] = "best"
        try:
            record = best_record(entry.path)
            out.update(step=record["step"], best={record["metric"]: record["value"]})
        except (OSError, ValueError) as exc:
            out["problem"] = _unreadable_record(entry.path, exc)
        return out
    try:
        marker = marker_of(entry.path)
    except (OSError, ValueError) as exc:
        unmarked = not is_marked(entry.path)
        out.update(status="incomplete" if unmarked else "damaged", problem=reason(exc))
        return out
    metrics = marker.get("metrics") or {}
    if not isinstance(metrics, dict):  # the marker is untrusted: its metrics are shown only as the dict a save writes
        out["problem"] = f"its marker's metrics are a {type(metrics).__name__}, not a dict (damaged or crafted)"
        metrics = {}
    out.update(status="complete", step=marker["step"], metrics=metrics)
    try:
        saved = contents_of(entry.path).replicated.state
        assert saved is not None  # read from a checkpoint: only a template has none
        state = saved.state
        out.update(epoch=state.progress.epoch, best=dict(state.best))
        out["metrics"] = out["metrics"] or dict(state.metrics)
    except (Exception, CheckpointException):  # noqa: BLE001 - not a loop's trainer state: the marker's word stands
        pass
    return out


def _table(rows: list[dict]) -> str:
    lines = [("NAME", "STEP", "EPOCH", "STATUS", "SIZE", "METRICS")]
    for r in rows:
        detail = r["problem"] if r["problem"] else values_text(r["metrics"] if r["kind"] != "best" else r["best"])
        if r["best"] and r["kind"] != "best":
            detail += f"  best: {values_text(r['best'])}"
        status = r["status"] if r["status"] in ("complete", "best", "unfinished") else r["status"].upper()
        lines.append((r["name"], _dash(r["step"]), _dash(r["epoch"]), status, size_text(r["size"]), detail))
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    return "\n".join(
        "  ".join(
            [
                line[0].ljust(widths[0]),
                line[1].rjust(widths[1]),
                line[2].rjust(widths[2]),
                line[3].ljust(widths[3]),
                line[4].rjust(widths[4]),
                line[5],
            ]
        ).rstrip()
        for line in lines
    )


def _dash(value) -> str:
    return "-" if value is None else str(value)


def ls(args) -> int:
    """List every checkpoint, best-model file and unfinished save under a save_dir or model_dir; exit 1 when a
    checkpoint is damaged or incomplete (as ``verify``, from the markers alone)."""
    model_dir = model_dir_of(location(args.dir), "ls")
    rows = [row(e) for e in entries(model_dir)]
    if not rows:
        raise Failure(NOT_FOUND, f"no checkpoint under {str(model_dir)!r}; pass a save_dir or its model/ directory")
    emit({"model_dir": str(model_dir), "entries": rows}, _table(rows), args.json)
    damaged = [r["name"] for r in rows if r["status"] in ("damaged", "incomplete")]
    if damaged:
        raise some_damaged(damaged, len(rows))
    return OK


# -- inspect -------------------------------------------------------------------------------------
def _slot_lines(saved, prefix: str = "") -> dict[str, str]:
    """The saved slots by hook identity (a chain's children as ``chain / child``)."""
    if not isinstance(saved, slots.Keyed):  # a checkpoint that kept them by position
        return {f"{prefix}#{i}": repr(slot) for i, slot in enumerate(saved)}
    out = {}
    for key, slot in saved.entries:
        if isinstance(slot, slots.Keyed):
            out.update(_slot_lines(slot, f"{prefix}{key} / "))
        else:
            out[f"{prefix}{key}"] = repr(slot)
    return out


def _tensors(tree) -> list[TensorInfo]:
    if isinstance(tree, TensorInfo):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in _tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _tensors(v)]
    return []


def _tensor_summary(tree) -> dict:
    found = _tensors(tree)
    return {"tensors": len(found), "bytes": sum(t.nbytes for t in found)}


def _optimizer(state_dict: dict) -> dict:
    """Each param group's hyper-parameters and size, and how much state the optimizer keeps."""
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, "params": len(g.get("params", ()))}
        for g in state_dict.get("param_groups") or ()
    ]
    return {
        "param_groups": groups,
        "state_entries": len(state_dict.get("state") or {}),
        **_tensor_summary(state_dict.get("state")),
    }


def _plain(state_dict) -> dict | None:
    """A scheduler's or scaler's state dict with tensors shown by shape."""
    if state_dict is None:
        return None
    return {k: repr(v) if isinstance(v, TensorInfo) else v for k, v in state_dict.items()}


def _inspect_best(path: storage.Location) -> dict:
    try:
        weights = weights_without_tensors(path)
    except (OSError, ValueError) as exc:
        raise Failure(DAMAGED, str(exc)) from None
    try:
        record = best_record(path)
    except (OSError, ValueError) as exc:
        record = {"problem": _unreadable_record(path, exc)}
    return {
        "path": str(path),
        "format": "weights",
        "size": size_of(path),
        "best": record,
        "weights": {**_tensor_summary(weights), "parameters": _numel(weights)},
    }


def _numel(weights: dict) -> int:
    total = 0
    for info in weights.values():
        n = 1
        for d in info.shape:
            n *= d
        total += n
    return total


def describe(path: storage.Location) -> dict:
    """Everything ``inspect`` shows of the checkpoint at ``path``, as data."""
    try:
        info = find_checkpoint(path)
    except FileNotFoundError as exc:
        raise Failure(NOT_FOUND, str(exc)) from None
    except ValueError as exc:
        raise Failure(DAMAGED, str(exc)) from None
    try:
        marker, weights = marker_of(info.path), weights_without_tensors(info.path)
        trainer = trainer_without_tensors(info.path)
        contents = from_parts(trainer, None) if isinstance(trainer, dict) and "state" in trainer else None
    except (OSError, ValueError, KeyError, TypeError, CheckpointException) as exc:
        raise Failure(
            DAMAGED, f"{info.path} cannot be read ({reason(exc)}); run `python -m pimm_fn verify {info.path}`"
        ) from None
    found = {
        "path": str(info.path),
        "format": info.format,
        "step": info.step,
        "world_size": info.world_size,
        "size": size_of(info.path),
        "recorded_metrics": marker.get("metrics"),
        "weights": {**_tensor_summary(weights), "parameters": _numel(weights)},
    }
    if contents is None:  # written by save_checkpoint with a trainer dict of one's own, not by loop
        return {**found, "trainer": trainer}
    r, saved = contents.replicated, contents.replicated.state
    assert saved is not None  # read from a checkpoint: only a template has none
    return {
        **found,
        "progress": attrs.asdict(saved.state.progress),
        "position": saved.state.position,
        "stop": saved.state.stop,
        "metrics": dict(saved.state.metrics),
        "best": dict(saved.state.best),
        "slots": _slot_lines(saved.slots),
        "optimizer": _optimizer(r.optimizer) if r.optimizer is not None else None,
        "optimizers": {name: _optimizer(sd) for name, sd in (r.optimizers or {}).items()} or None,
        "scheduler": _plain(r.scheduler),
        "scaler": _plain(r.scaler),
        "extra": {name: _tensor_summary(sd) for name, sd in (r.extra or {}).items()},
        "sharded": r.sharded,
    }


def _weights_line(d: dict, label: str) -> str:
    w = d["weights"]
    return f"{label}{w['tensors']} tensors, {w['parameters']} parameters" + (
        " (in the shards)" if d.get("sharded") else ""
    )


def _progress_line(d: dict) -> str:
    p = d["progress"]
    budget = f"max_steps {p['step_limit']}" if p.get("step_limit") else f"max_epochs {p['max_epochs']}"
    stop = f", stopped: {d['stop']}" if d["stop"] else ""
    return (
        f"progress    step {p['global_step']}, epoch {p['epoch']} (iter {p['iter_in_epoch']} of "
        f"{p['iters_per_epoch']}), {budget}, samples_seen {p['samples_seen']}, at {d['position']}{stop}"
    )


def _optimizer_lines(d: dict) -> list[str]:
    optimizers = {"": d["optimizer"]} if d["optimizer"] else {f" {k}": v for k, v in (d["optimizers"] or {}).items()}
    lines = []
    for name, opt in optimizers.items():
        lines.append(
            f"optimizer{name}   {opt['state_entries']} state entries, {opt['tensors']} tensors "
            f"({size_text(opt['bytes'])}), {len(opt['param_groups'])} param group(s)"
        )
        lines += [f"  group {i}: {values_text(g)}" for i, g in enumerate(opt["param_groups"])]
    return lines


def _text(d: dict) -> str:
    """``inspect``'s data for people: one section a line."""
    if d.get("format") == "weights":
        return "\n".join(
            [
                f"best-model file  {d['path']}  ({size_text(d['size'])})",
                f"best             {d['best']}",
                _weights_line(d, "weights          "),
            ]
        )
    head = f"checkpoint  {d['path']}  ({d['format']}, {d['world_size']} rank(s), {size_text(d['size'])})"
    if "trainer" in d:  # not a loop's: its own trainer dict, tensors by shape
        return "\n".join(
            [head, f"step        {d['step']}", f"trainer     {d['trainer']!r:.400}", _weights_line(d, "weights     ")]
        )
    lines = [
        head,
        _progress_line(d),
        f"metrics     {values_text(d['metrics']) or '-'}",
        f"best        {values_text(d['best']) or '-'}",
        _weights_line(d, "weights     "),
        "slots       (by hook identity)" if d["slots"] else "slots       -",
        *(f"  {key}: {slot}" for key, slot in d["slots"].items()),
        *_optimizer_lines(d),
        f"scheduler   {values_text(d['scheduler']) if d['scheduler'] else '-'}",
        f"scaler      {values_text(d['scaler']) if d['scaler'] else '-'}",
    ]
    lines += [f"extra       {name}: {s['tensors']} tensors ({size_text(s['bytes'])})" for name, s in d["extra"].items()]
    return "\n".join(lines)


def inspect(args) -> int:
    """Show a checkpoint's progress, metrics, hook slots, optimizer and scheduler, without reading tensors."""
    path = location(args.path)
    if not path.exists():
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a checkpoint, a save_dir or a model_dir")
    data = _inspect_best(path) if is_best_file(path) else describe(path)
    emit(data, _text(data), args.json)
    return OK


WORDS = {FINISHED: "finished", TO_CONTINUE: "to continue", MID_RUN: "stopped mid-run"}


def _ended(state) -> bool:
    """Nothing is left to train: training ended, or only its closing events remain (an early stop, a spent budget)."""
    return state.finished or state.stop is not None or not state.progress.steps_left


def standing(model_dir) -> dict:
    """How the run in ``model_dir`` stands, as data (``code``: the exit code ``status`` gives)."""
    info, passed = newest(model_dir)
    skipped = [{"name": path.name, "problem": reason(error)} for path, error in passed]
    if info is None:
        if passed:
            raise Failure(
                DAMAGED,
                f"no checkpoint under {str(model_dir)!r} can be read ({skipped[0]['name']}: "
                f"{skipped[0]['problem']}); `python -m pimm_fn verify {model_dir}` says why",
            )
        raise Failure(
            NOT_FOUND,
            f"no checkpoint under {str(model_dir)!r}: the run never saved (it stopped before its "
            f"first save), or this is not its save_dir",
        )
    try:
        saved_for = marker_of(info.path).get("saved_for")
        saved = contents_of(info.path).replicated.state
        assert saved is not None  # read from a checkpoint: only a template has none
        state = saved.state
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - not a loop's trainer state
        raise Failure(
            USAGE,
            f"{info.path} holds no loop() progress ({reason(exc)}): status tells how a loop() run "
            f"ended; `python -m pimm_fn inspect {info.path}` shows what it holds",
        ) from None
    code = FINISHED if _ended(state) else TO_CONTINUE if saved_for is not None else MID_RUN
    p = state.progress
    return {
        "model_dir": str(model_dir),
        "status": WORDS[code],
        "code": code,
        "checkpoint": str(info.path),
        "step": info.step,
        "max_steps": p.max_steps,
        "saved_for": saved_for,
        "stop": state.stop,
        "passed_over": skipped,
    }


def _status_text(d: dict) -> str:
    where = f"step {d['step']} of {d['max_steps']} in {d['checkpoint']}"
    if d["code"] == FINISHED:
        line = f"finished: {where}" + (f" (stopped early: {d['stop']})" if d["stop"] else "")
    elif d["code"] == TO_CONTINUE:
        line = f'to continue: saved {where} for {d["saved_for"]}; run it again with resume="auto" to go on from it'
    else:
        line = (
            f"stopped mid-run: its newest checkpoint is {where}, saved on the way, neither at the end nor for a "
            f'stop (a crash, a kill, a Ctrl-C, or a run still going); resume="auto" goes on from it'
        )
    passed = [f"  passed over: {s['name']} ({s['problem']})" for s in d["passed_over"]]
    return "\n".join([line, *passed])


def status(args) -> int:
    """Say how the run in a save_dir ended; the exit code says it too: 0 finished, 75 to continue, 4 stopped mid-run."""
    found = standing(model_dir_of(location(args.dir), "status"))
    emit(found, _status_text(found), args.json)
    return found["code"]
