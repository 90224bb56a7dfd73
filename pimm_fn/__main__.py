"""``python -m pimm_fn``: the checkpoint and plan commands of :mod:`pimm_fn.cli`.

A reader that stops early (``python -m pimm_fn ls run | head -1``) closes
the pipe: what is left of the output has no one to read it, so the command
ends quietly with the shell's exit status for a closed pipe (141), not a
``BrokenPipeError`` traceback.
"""

import os
import signal
import sys

from pimm_fn.cli import main

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
