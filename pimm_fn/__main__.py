"""``python -m pimm_fn``: the checkpoint and plan commands of :mod:`pimm_fn.cli`.

A reader that stops early (``python -m pimm_fn ls run | head -1``) closes
the pipe: what is left of the output has no one to read it, so the command
ends quietly with the shell's exit status for a closed pipe (141), not a
``BrokenPipeError`` traceback.
"""

import os
import pathlib
import signal
import sys


def _shadowing() -> str | None:
    """What hides the installed ``pimm_fn`` from this command, or ``None``.

    Python looks in the current directory first: a folder named ``pimm_fn``
    there without an ``__init__.py`` (the clone's root, seen from its parent)
    becomes the package, and an editable install answers only for its
    submodules, so ``pimm_fn``'s own names are missing (an ``AttributeError``
    deep in a command).
    """
    package = sys.modules.get("pimm_fn")
    if getattr(package, "__file__", None) is not None:
        return None
    found = ", ".join(map(str, getattr(package, "__path__", ()))) or "?"
    return (
        f"python -m pimm_fn: the folder {found} is taken for the package pimm_fn, hiding the installed one "
        f"({pathlib.Path(__file__).resolve().parent}): Python looks in the current directory first. Run the "
        f"command from another directory (or rename that folder)"
    )


if (_shadowed := _shadowing()) is not None:
    print(_shadowed, file=sys.stderr)
    sys.exit(2)  # a usage error (pimm_fn.cli.USAGE), said before anything is imported from the hidden package

from pimm_fn.cli import main  # noqa: E402 - after the check above

_CLOSED_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a writer whose reader went away


def _run() -> int:
    try:
        code = main()
        sys.stdout.flush()  # the buffered rest: a closed pipe raises here, not at exit
        return code
    except BrokenPipeError:
        # Python would flush stdout again at exit and print the error: point it at devnull.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(_run())
