"""``python -m pimm_fn``: checkpoints from the shell (list, inspect, verify, export) and dry runs of hook lists.

Commands::

    python -m pimm_fn status DIR [--json]           how the run in a save_dir ended: finished, to continue, stopped mid-run
    python -m pimm_fn ls DIR [--json]               every checkpoint under a save_dir or model_dir
    python -m pimm_fn inspect PATH [--json]         progress, metrics, hook slots, optimizer: no tensor read
    python -m pimm_fn verify PATH [--json]          complete, every shard read back, sizes and checksums
    python -m pimm_fn export PATH OUT.pth           the weights alone, for torch.load(weights_only=True)
    python -m pimm_fn export PATH OUT.safetensors   the same without pickle, the step and metrics in its header
    python -m pimm_fn plan HOOKS --iters-per-epoch N (--max-epochs E | --max-steps S)

Exit codes, which scripts may rely on:

    0  success; for ``verify`` and ``ls``: every checkpoint is complete and readable; for ``status``: the run finished
    1  a checkpoint is incomplete or damaged (``verify``, ``ls``: one of them; ``inspect``/``export``: the one
       named; ``status``: every one, so none can be resumed from)
    2  usage error: bad arguments, a hook expression or config that does not build, ``OUT`` exists
    3  not found: ``PATH`` does not exist, or holds no checkpoint
    4  ``status``: the run stopped mid-run, neither finished nor saved to be continued (a crash, a kill, a
       Ctrl-C, or still running); ``resume="auto"`` goes on from its newest checkpoint
   75  ``status``: the run stopped to be continued (a preemption signal, ``max_time``: its checkpoint's
       ``saved_for``); run it again with ``resume="auto"`` (``EX_TEMPFAIL``, as the run itself exits)

``PATH`` and ``DIR`` may be fsspec URLs (``s3://bucket/exp1``, ``gs://...``),
as ``loop(save_dir=)`` takes them; ``OUT`` is a local file.

Data goes to stdout (``--json``: one JSON document), messages to stderr, an
error as one line ``pimm_fn <command>: <what is wrong and how to fix it>``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from typing import TYPE_CHECKING

from pimm_fn.core.preemption import EX_TEMPFAIL

if TYPE_CHECKING:
    from pimm_fn.checkpoint.storage import Location

__all__ = ["OK", "DAMAGED", "USAGE", "NOT_FOUND", "FINISHED", "MID_RUN", "TO_CONTINUE", "Failure", "main"]

OK, DAMAGED, USAGE, NOT_FOUND = 0, 1, 2, 3
FINISHED, MID_RUN, TO_CONTINUE = OK, 4, EX_TEMPFAIL  # status's: how the run ended
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # an fsspec URL (s3://...): pimm_fn.checkpoint.storage reads it


class Failure(Exception):
    """A command's failure: the exit ``code`` and the one-line ``message`` for stderr."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pimm_fn",
        description=__doc__.split("\n\n")[0],
        epilog="exit codes: 0 ok (status: finished), 1 a checkpoint incomplete or damaged (ls, verify: any of them), "
        "2 usage error, 3 not found; status: 4 stopped mid-run (a crash, a kill), 75 to continue "
        "(preempted, max_time)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status",
        help="how the run in a save_dir ended: finished (0), to continue (75), stopped mid-run (4)",
        epilog="exit codes: 0 finished, 75 to continue (a preemption signal or max_time saved it: run it again with "
        'resume="auto"), 4 stopped mid-run (a crash, a kill, a Ctrl-C, or still running), 3 no checkpoint, '
        "1 none can be read, 2 usage error",
    )
    status.add_argument("dir", metavar="DIR", help="a save_dir (or its model/ directory), a path or a URL")
    ls = commands.add_parser("ls", help="list every checkpoint under a save_dir or model_dir")
    ls.add_argument("dir", metavar="DIR")
    inspect = commands.add_parser("inspect", help="what a checkpoint holds, without reading its tensors")
    inspect.add_argument("path", metavar="PATH")
    verify = commands.add_parser("verify", help="check that checkpoints are complete and every shard reads back")
    verify.add_argument("path", metavar="PATH", help="a checkpoint, or a save_dir/model_dir (all of its checkpoints)")
    for command in (status, ls, inspect, verify):
        command.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    export = commands.add_parser("export", help="write a checkpoint's weights as a plain state dict or safetensors")
    export.add_argument("path", metavar="PATH", help="a checkpoint, a weights file, or a save_dir/model_dir (newest)")
    export.add_argument("out", metavar="OUT", help="the file to write: OUT.pth, or OUT.safetensors")
    export.add_argument(
        "--format",
        choices=("pth", "safetensors"),
        help="pth (torch.save) or safetensors (no pickle; needs pip install 'pimm_fn[safetensors]'); "
        "by default what OUT's suffix says",
    )
    export.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    _plan_arguments(commands.add_parser("plan", help="the effects a hook list would execute, step by step"))
    return parser


def _plan_arguments(plan: argparse.ArgumentParser) -> None:
    plan.add_argument(
        "hooks",
        metavar="HOOKS",
        help='a Python list of pimm_fn hook factory calls, e.g. "[save_every(4), log_every(2)]" '
        "(evaluator stand-in: evaluate), or a pimm config file (.py or .json) "
        "with hooks=[dict(...)]",
    )
    plan.add_argument("--iters-per-epoch", type=int, required=True, metavar="N")
    budget = plan.add_mutually_exclusive_group()
    budget.add_argument("--max-epochs", type=int, metavar="E")
    budget.add_argument("--max-steps", type=int, metavar="S")
    plan.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a value every evaluation publishes (repeatable), so best_on and early_stop act",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON document instead of text")


_COMMANDS = {
    "status": ("pimm_fn.cli._show", "status"),
    "ls": ("pimm_fn.cli._show", "ls"),
    "inspect": ("pimm_fn.cli._show", "inspect"),
    "verify": ("pimm_fn.cli._verify", "verify"),
    "export": ("pimm_fn.cli._export", "export"),
    "plan": ("pimm_fn.cli._plan", "plan"),
}


def emit(data, text: str, as_json: bool) -> None:
    """Print a command's result: ``data`` as JSON, or its ``text`` rendering."""
    print(json.dumps(data, indent=2, default=repr) if as_json else text)


def _check_exists(path) -> None:
    """A missing checkpoint path is said at once, before torch is imported (a URL is looked up by its command)."""
    if path is not None and not _URL.match(path) and not os.path.exists(path):
        raise Failure(NOT_FOUND, f"{str(path)!r} does not exist; pass a checkpoint, a save_dir or a model_dir")


def location(value: str) -> Location:
    """A command's ``PATH``: a local ``pathlib.Path``, or a store's ``StorePath`` for a URL (a clear failure when unusable)."""
    from pimm_fn.checkpoint import storage  # noqa: PLC0415 - imports torch

    try:
        return storage.location(value)
    except ValueError as exc:
        raise Failure(USAGE, str(exc)) from None


def main(argv=None) -> int:
    """Run one command; returns its exit code (see the module docstring).

    >>> main(["plan", "[save_every(3)]", "--iters-per-epoch", "4", "--max-epochs", "2"])
    step  event       hook           effect
       3  AfterStep   save_every(3)  SaveCheckpoint(step=3)
       6  AfterStep   save_every(3)  SaveCheckpoint(step=6)
       8  AfterTrain  save_every(3)  SaveCheckpoint(step=8, final=True)
    3 effects
    0
    """
    args = _parser().parse_args(argv)  # a usage error exits with 2 here
    module, function = _COMMANDS[args.command]
    try:
        _check_exists(getattr(args, "dir", None) or getattr(args, "path", None))
        return getattr(importlib.import_module(module), function)(args)  # only plan's module needs no torch
    except Failure as failure:
        print(f"pimm_fn {args.command}: {failure}", file=sys.stderr)
        return failure.code
