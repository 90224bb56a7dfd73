"""A toy checkpoint layout and its reader (``pimm_fn.checkpoint.discovery``), as a plug-in of another library would ship.

The layout is a directory whose ``pointer.txt`` names a pimm_fn checkpoint; the reader, also the handler of the
plug-in's one effect (``Note``), records every path the resume asks it about.
"""

import pathlib

import attrs

from pimm_fn import checkpoint
from pimm_fn.core.effects import Effect


@attrs.frozen
class Note(Effect):
    """The toy plug-in's one effect: its handler is also its reader."""


class PointerReader:
    """Reads the toy layout: ``recognise`` a directory with ``pointer.txt``, ``resume_from`` the checkpoint named."""

    name = "toy"

    def __init__(self):
        self.looks = []

    def __call__(self, effect, state, ctx):
        return ()

    def recognise(self, path):
        self.looks.append(pathlib.Path(path).name)
        p = pathlib.Path(path)
        return p if (p / "pointer.txt").is_file() else None

    def resume_from(self, found, model_dir, *, iters_per_epoch, say):
        say(f"toy layout at {found}")
        return checkpoint.find_checkpoint((found / "pointer.txt").read_text())
