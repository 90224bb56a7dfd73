"""``status``: how the run in a save_dir ended, read from its checkpoints, for a script that cannot trust an exit code.

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

from torch.distributed.checkpoint.api import CheckpointException

from pimm_fn.checkpoint.inspection import contents_of, newest
from pimm_fn.checkpoint.inspection import marker as marker_of
from pimm_fn.cli import DAMAGED, FINISHED, MID_RUN, NOT_FOUND, TO_CONTINUE, USAGE, Failure, emit, location
from pimm_fn.cli._listing import model_dir_of, reason

__all__ = ["status"]

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
            raise Failure(DAMAGED, f"no checkpoint under {str(model_dir)!r} can be read ({skipped[0]['name']}: "
                                   f"{skipped[0]['problem']}); `python -m pimm_fn verify {model_dir}` says why")
        raise Failure(NOT_FOUND, f"no checkpoint under {str(model_dir)!r}: the run never saved (it stopped before its "
                                 f"first save), or this is not its save_dir")
    try:
        saved_for = marker_of(info.path).get("saved_for")
        state = contents_of(info.path).replicated.state.state
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - not a loop's trainer state
        raise Failure(USAGE, f"{info.path} holds no loop() progress ({reason(exc)}): status tells how a loop() run "
                             f"ended; `python -m pimm_fn inspect {info.path}` shows what it holds") from None
    code = FINISHED if _ended(state) else TO_CONTINUE if saved_for is not None else MID_RUN
    p = state.progress
    return {"model_dir": str(model_dir), "status": WORDS[code], "code": code, "checkpoint": str(info.path),
            "step": info.step, "max_steps": p.max_steps, "saved_for": saved_for, "stop": state.stop,
            "passed_over": skipped}


def _text(d: dict) -> str:
    where = f"step {d['step']} of {d['max_steps']} in {d['checkpoint']}"
    if d["code"] == FINISHED:
        line = f"finished: {where}" + (f" (stopped early: {d['stop']})" if d["stop"] else "")
    elif d["code"] == TO_CONTINUE:
        line = f"to continue: saved {where} for {d['saved_for']}; run it again with resume=\"auto\" to go on from it"
    else:
        line = (f"stopped mid-run: its newest checkpoint is {where}, saved on the way, neither at the end nor for a "
                f"stop (a crash, a kill, a Ctrl-C, or a run still going); resume=\"auto\" goes on from it")
    passed = [f"  passed over: {s['name']} ({s['problem']})" for s in d["passed_over"]]
    return "\n".join([line, *passed])


def status(args) -> int:
    """Say how the run in a save_dir ended; the exit code says it too: 0 finished, 75 to continue, 4 stopped mid-run."""
    found = standing(model_dir_of(location(args.dir), "status"))
    emit(found, _text(found), args.json)
    return found["code"]
