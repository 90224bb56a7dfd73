"""A script's Ctrl-C: the line its exit prints in place of the loop's traceback, and who drives the process.

A Ctrl-C in a script that escapes ``run()`` prints where the last
checkpoint is and how to continue (``advise``); a notebook's or the REPL's
Ctrl-C keeps its behaviour (``run()`` continues exactly), told by
``interactive``. How a Ctrl-C is taken during ``run()``:
``pimm_fn.runtime.ctrl_c``; a preemption save on Ctrl-C:
``pimm_fn.runtime.preemption``.
"""

import sys

__all__ = ["advise", "interactive"]


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


def advise(error: KeyboardInterrupt, step: int, last_save: tuple | None, model_dir) -> None:
    """Attach to a Ctrl-C escaping ``run()`` in a script the line its exit prints in place of the traceback.

    ``last_save``: ``(step, path)`` of the last checkpoint this run saved,
    or ``None``. A notebook or the REPL is left alone: there ``run()``
    continues exactly, and the traceback is the interpreter's to show.
    """
    if interactive():
        return
    if last_save is not None:
        where = f"the last checkpoint is step {last_save[0]} in {last_save[1]}"
    elif model_dir is not None:
        where = f"this run saved no checkpoint yet (it resumed from the newest one in {model_dir}, if any)"
    else:
        where = "this run has no save_dir: nothing was saved"
    error.pimm_fn_advice = (
        f"[pimm_fn] stopped by Ctrl-C at step {step}; {where}. To continue from it, run the script again with "
        f'loop(..., resume="auto"); to save on Ctrl-C first, pass preemption=pimm_fn.Preemption(save_on_interrupt=True)'
    )
    if not getattr(sys.excepthook, "pimm_fn_advising", False):
        sys.excepthook = _advising(sys.excepthook)
