"""A script's Ctrl-C: the line its exit prints in place of the loop's traceback, and who drives the process.

A Ctrl-C in a script that escapes ``run()`` prints one line: the step it
stopped, where the last checkpoint is and how to continue (``advise``); a notebook's or the REPL's
Ctrl-C keeps its behaviour (``run()`` continues exactly), told by
``interactive``. How a Ctrl-C is taken during ``run()``:
``pimm_fn.runtime.ctrl_c``; a preemption save on Ctrl-C:
``pimm_fn.runtime.preemption``.
"""

import sys

from pimm_fn import checkpoint

__all__ = ["advise", "interactive", "newest_checkpoint"]


def interactive() -> bool:
    """Whether a person drives this process: a notebook or IPython shell, or the Python REPL (``-i``)."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _advice(error: KeyboardInterrupt) -> str:
    return getattr(error, "pimm_fn_advice", None)


def _advising(previous):
    """``sys.excepthook`` printing a script's Ctrl-C advice instead of the loop's traceback; the rest as before."""
    def hook(kind, error, traceback):
        advice = _advice(error) if isinstance(error, KeyboardInterrupt) else None
        if advice is None:
            return previous(kind, error, traceback)
        print(f"KeyboardInterrupt\n{advice}", file=sys.stderr, flush=True)
    hook.pimm_fn_advising = True
    return hook


def newest_checkpoint(model_dir) -> tuple | None:
    """``(step, path)`` of the newest usable checkpoint in ``model_dir``, the one ``resume="auto"`` takes (``None``:
    none, or no ``model_dir``). Read where it lives, no collective: a Ctrl-C may stop each rank elsewhere."""
    if model_dir is None:
        return None
    try:
        info = checkpoint.find_checkpoint(model_dir)
    except (OSError, ValueError):  # none there, or none intact: running again starts over, or says why not
        return None
    return info.step, info.path


def advise(error: KeyboardInterrupt, stopped: str, *, newest: tuple | None, model_dir, auto: bool,
           saves_on_interrupt: bool) -> None:
    """Attach to a Ctrl-C escaping ``run()`` in a script the line its exit prints in place of the traceback.

    The one line a script's Ctrl-C says (the loop's "run() continues exactly"
    is not said there: a script cannot). ``stopped``: where, as ``"during
    step 24 (the train step)"`` or ``"after step 23"``; ``newest``: ``(step,
    path)`` of the newest checkpoint in ``model_dir`` (``None``: none, or no
    ``save_dir``), the one ``resume="auto"`` takes; ``auto``: the loop was
    built with ``resume="auto"``, so running the script again resumes by
    itself. A notebook or the REPL is left alone: there ``run()`` continues
    exactly, and the traceback is the interpreter's to show.

    >>> error = KeyboardInterrupt()
    >>> advise(error, "during step 24 (the train step)", newest=(20, "runs/a/model/last"), model_dir="runs/a/model",
    ...        auto=True, saves_on_interrupt=False)
    >>> print(error.pimm_fn_advice)
    [pimm_fn] stopped by Ctrl-C during step 24 (the train step); the last checkpoint is step 20 in runs/a/model/last. Run the script again: it resumes from step 20 (resume="auto"); to save on Ctrl-C first, pass preemption=pimm_fn.Preemption(save_on_interrupt=True)
    """
    if interactive():
        return
    if model_dir is None:
        where, how = "this run has no save_dir: nothing was saved", "Running the script again starts over"
    elif newest is None:
        where, how = f"no checkpoint is in {model_dir}", "Running the script again starts over"
    else:
        where = f"the last checkpoint is step {newest[0]} in {newest[1]}"
        how = (f'Run the script again: it resumes from step {newest[0]} (resume="auto")' if auto else
               f'To continue from it, run the script again with loop(..., resume="auto")')
    first = ("" if saves_on_interrupt or model_dir is None else
             "; to save on Ctrl-C first, pass preemption=pimm_fn.Preemption(save_on_interrupt=True)")
    error.pimm_fn_advice = f"[pimm_fn] stopped by Ctrl-C {stopped}; {where}. {how}{first}"
    if not getattr(sys.excepthook, "pimm_fn_advising", False):
        sys.excepthook = _advising(sys.excepthook)
