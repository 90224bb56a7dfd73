"""Test processes forked from one that has torch and pimm_fn imported: each starts in milliseconds, not seconds.

Importing torch, its distributed checkpoint and pimm_fn takes a fresh
interpreter about three seconds of CPU; the multi-process tests start a few
hundred processes, so the suite spent a third of its time importing. Here
``multiprocessing``'s fork server imports ``PRELOAD`` once per test process
and forks each script from there.

A process started here is still a real one of its own: its pid, its exit
code (``-signal`` when a signal killed it), its own environment, working
directory, ``sys.argv`` and output files, and its script runs as
``__main__``. What a fresh interpreter would do differently is done here:
Python's ``random`` is reseeded, the script's ``atexit`` handlers run at its
end, and its output is flushed before it exits.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import random
import runpy
import subprocess
import sys
import tempfile
import traceback

PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torchdata.stateful_dataloader",
    "pimm_fn",
    "pimm_fn.runtime.engine.loop",
    "torchft",  # the fault-tolerance tests' replicas (an extra: skipped where it is not installed)
]

_context = None


def _server():
    """The fork server's context, its preloads set on first use (one server per test process)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _exit_code(code) -> int:
    """A script's exit code from its ``SystemExit``, as the interpreter makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _redirect(fd: int, path: str) -> None:
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(opened, fd)
    os.close(opened)


def _main(argv: list[str], env: dict, cwd: str, stdout: str, stderr: str) -> None:
    """In the forked process: its output files, environment and directory, then ``python argv...``; never returns."""
    _redirect(1, stdout)
    _redirect(2, stderr)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # As the interpreter would: the script's folder first, then PYTHONPATH.
    sys.path[:0] = [os.path.dirname(os.path.abspath(argv[0]))] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    sys.argv = list(argv)
    random.seed()
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Process:
    """A started process, read as ``subprocess.Popen`` is: ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``."""

    def __init__(self, process, args: list[str]):
        self._process, self.args = process, args
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, once it exited; ``subprocess.TimeoutExpired`` when it still runs after ``timeout``."""
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def kill(self) -> None:
        if self._process.exitcode is None:
            self._process.kill()


def start(
    argv, *, env: dict | None = None, cwd=None, stdout, stderr=None, fresh_interpreter: bool = False
) -> "Process | subprocess.Popen":
    """``python argv...`` (``argv[0]`` the script) forked from the preloaded server, its output appended to files.

    ``stderr`` defaults to ``stdout``'s file; ``env`` to this process's
    environment, ``cwd`` to its directory. ``fresh_interpreter`` starts a new
    interpreter instead (``subprocess.Popen``), for a test about what only a
    fresh one has: its own ``PYTHONHASHSEED`` from ``env``, say.
    """
    args = (
        [str(a) for a in argv],
        dict(os.environ if env is None else env),
        str(cwd if cwd is not None else os.getcwd()),
        str(stdout),
        str(stderr if stderr is not None else stdout),
    )
    for path in args[3:]:
        open(path, "a").close()  # there to read from the start, whatever becomes of the process
    if fresh_interpreter:
        with open(args[3], "a") as out, open(args[4], "a") as err:
            return subprocess.Popen([sys.executable, *args[0]], env=args[1], cwd=args[2], stdout=out, stderr=err)
    process = _server().Process(target=_main, args=args)
    process.start()
    return Process(process, args[0])


def run(argv, *, timeout: float, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, the script forked as ``start`` does.

    Raises:
        subprocess.TimeoutExpired: past ``timeout`` (the process killed first), with what it wrote.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        process = start(argv, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        with open(out) as o, open(err) as e:
            written = o.read(), e.read()
    if code is None:
        raise subprocess.TimeoutExpired(process.args, timeout, output=written[0], stderr=written[1])
    return subprocess.CompletedProcess(process.args, code, *written)
