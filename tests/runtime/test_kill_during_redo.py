"""A save fails half-way, run() redoes it, and the process is SIGKILLed in the middle of the redo.

Real processes, real writer: the checkpoint of step ``K`` is written by the
real ``save_checkpoint`` handler into its staging directory, and only DCP's
``FileSystemWriter`` is interrupted, after the data files (and the weights
file) are written and before the metadata and the ``COMPLETE`` marker:

    try 1 (in the training process): ``finish`` raises ENOSPC, the save
        says ``No space left on device``, removes its half-written
        ``.staging-last-K/`` and leaves the step interrupted;
    try 2 (``run()`` again, same process): the writer redoes the save from a
        fresh staging directory, writes its data files, then blocks in
        ``finish``; the parent SIGKILLs the process there;
    resume (a fresh process, ``resume="auto"``): discovery ignores the
        half-written staging directory and picks the previous complete save
        (step ``K - 3``); training ends bit-identical to an uninterrupted run,
        and its first save cleans the leftover.

Run as a script, this file is the training process (``crash`` or ``resume``).
"""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import _preloaded as preloaded

WORKLOAD = pathlib.Path(__file__).with_name("_tiny_workload.py")
TIMEOUT = 60  # per subprocess: a hang fails the test instead of stalling the suite
K = 6  # the save that fails, then is killed during its redo; save_every(3) published step 3 before it
PREVIOUS = 3


def _listing(directory: pathlib.Path) -> list[str]:
    """Every path under ``directory``, relative, sorted (``[]`` when it does not exist)."""
    if not directory.is_dir():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _write_json(path: pathlib.Path, content: dict) -> None:
    """Write ``content`` under a temp name, then rename: the parent never reads half a report."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the training process


@contextlib.contextmanager
def _writer_interrupted(report: dict, report_path: pathlib.Path):
    """DCP's ``FileSystemWriter`` with its ``finish`` interrupted: try 1 raises, try 2 blocks until killed.

    ``write_data`` (the real one) runs unchanged; it only records what the
    staging directory held when the try began to write its data.
    """
    from torch.distributed.checkpoint import FileSystemWriter

    write_data, finish = FileSystemWriter.write_data, FileSystemWriter.finish

    def recording_write_data(self, plan, planner):
        staging = pathlib.Path(self.path).parent
        report["tries"].append({"staging": staging.name, "before_data": _listing(staging)})
        return write_data(self, plan, planner)

    def interrupted_finish(self, metadata, results):
        staging = pathlib.Path(self.path).parent
        attempt = report["tries"][-1]
        attempt["before_finish"] = _listing(staging)
        if len(report["tries"]) == 1:
            raise OSError(28, "injected: no space left on device while writing the checkpoint metadata")
        _write_json(report_path, report)  # the parent's cue: the redo is half-written now
        time.sleep(TIMEOUT)
        os._exit(3)  # never reached when the parent kills as it should

    FileSystemWriter.write_data, FileSystemWriter.finish = recording_write_data, interrupted_finish
    try:
        yield
    finally:
        FileSystemWriter.write_data, FileSystemWriter.finish = write_data, finish


def _crash(save_dir: pathlib.Path, report_path: pathlib.Path) -> None:
    """Train; the save of step K fails half-way, ``run()`` redoes it and blocks in the redo's write."""
    from pimm_fn.core.effects import SaveCheckpoint
    from pimm_fn.runtime.handlers.dispatch import DEFAULT_HANDLERS
    from _tiny_workload import build

    real = DEFAULT_HANDLERS[SaveCheckpoint]
    report = {"tries": []}

    def save(effect, state, ctx):
        if effect.step != K:
            return real(effect, state, ctx)
        with _writer_interrupted(report, report_path):
            return real(effect, state, ctx)

    _, run = build(save_dir, handlers={SaveCheckpoint: save})
    try:
        run()
    except BaseException as error:  # noqa: BLE001 - DCP raises a CheckpointException, a BaseException
        report["error"] = f"{type(error).__name__}: {error}"
    report["interrupted"] = None if run.interrupted is None else [run.interrupted.step, run.interrupted.phase]
    report["after_failure"] = _listing(save_dir / "model")
    run()  # redoes the save of step K; blocks in it until the parent kills this process
    sys.exit("the redo of the failed save returned: the parent was to kill it first")


def _resume(save_dir: pathlib.Path, report_path: pathlib.Path, out: pathlib.Path) -> None:
    """Resume with ``resume="auto"`` and train to the end, noting the model dir after the first save."""
    import torch
    from pimm_fn.checkpoint import latest_checkpoint
    from _tiny_workload import build, weights

    model, run = build(save_dir, resume="auto")
    report = {"resumed_at": run.state.progress.global_step}
    model_dir = save_dir / "model"
    while not run.finished:
        run.step()
        if run.state.progress.global_step == K and "after_save" not in report:
            report["after_save"] = _listing(model_dir)
            report["latest_after_save"] = latest_checkpoint(model_dir).step
    report["final"] = _listing(model_dir)
    _write_json(report_path, report)
    torch.save({"weights": weights(model), "trace": [repr(e) for e in run.trace]}, out)


# --------------------------------------------------------------------------- the test


class _Processes:
    """The subprocesses of one test, each logging to a file (a full pipe could block one); all ended on exit."""

    def __init__(self, logs: pathlib.Path):
        self.logs = logs
        self.started: list[preloaded.Process] = []

    def spawn(self, name: str, *args) -> preloaded.Process:
        process = preloaded.start(args, stdout=self.logs / f"{name}.log")
        process.name = name
        self.started.append(process)
        return process

    def log(self, process: preloaded.Process) -> str:
        return (self.logs / f"{process.name}.log").read_text()

    def finish(self, process: preloaded.Process) -> tuple[int, str]:
        """Wait for ``process`` (bounded); returns its exit status and output."""
        import pytest

        try:
            process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the {process.name} process hung for {TIMEOUT}s: {self.log(process)}")
        return process.returncode, self.log(process)

    def __enter__(self) -> "_Processes":
        return self

    def __exit__(self, *exc) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_sigkill_during_the_redo_of_a_half_written_save_resumes_from_the_previous_checkpoint(tmp_path):
    """A save fails half-way and its redo is SIGKILLed half-way: resume='auto' takes the previous save, ends identical."""
    import torch
    from pimm_fn.checkpoint import latest_checkpoint
    from _tiny_workload import same_weights

    save_dir, model_dir, crash_report = tmp_path / "run", tmp_path / "run" / "model", tmp_path / "crash.json"
    with _Processes(tmp_path) as processes:
        reference = processes.spawn("uninterrupted", WORKLOAD, tmp_path / "full", "--out", tmp_path / "full.pt")
        victim = processes.spawn("killed", __file__, "crash", save_dir, crash_report)
        deadline = time.monotonic() + TIMEOUT
        while not crash_report.exists():
            assert victim.poll() is None, f"the training process ended before its redo blocked: {processes.log(victim)}"
            assert time.monotonic() < deadline, f"the redo did not reach its write within {TIMEOUT}s"
            time.sleep(0.02)
        at_kill = _listing(model_dir)
        os.kill(victim.pid, signal.SIGKILL)
        code, log = processes.finish(victim)
        assert code == -signal.SIGKILL, log
        report = json.loads(crash_report.read_text())
        staging = f".staging-last-{K}"

        # Try 1 failed inside the real writer, after its data files, and left the step interrupted on the save.
        assert report["error"].startswith("DiskFullError: [Errno 28] No space left on device"), report["error"]
        assert report["interrupted"][0] == K and "SaveCheckpoint" in report["interrupted"][1]
        first, redo = report["tries"]
        assert first["staging"] == redo["staging"] == staging
        assert "trainer/__0_0.distcp" in first["before_finish"]
        after_failure = report["after_failure"]  # the half-written staging directory is removed: its space comes back
        assert not [name for name in after_failure if name.startswith(staging)], after_failure
        assert "last/COMPLETE" in after_failure
        # Try 2 started from a clean staging directory (none of try 1's data), and was killed with its own data written.
        assert not any(name.endswith(".distcp") for name in redo["before_data"]), redo["before_data"]
        assert "trainer/__0_0.distcp" in redo["before_finish"] and "COMPLETE" not in redo["before_finish"]
        assert f"{staging}/trainer/__0_0.distcp" in at_kill and f"{staging}/COMPLETE" not in at_kill

        # Discovery skips the half-written redo: the previous complete save, as 'last'.
        found = latest_checkpoint(model_dir)
        assert (found.step, found.path.name) == (PREVIOUS, "last")
        assert f"{staging}/trainer/__0_0.distcp" in _listing(model_dir)

        resume_report, out = tmp_path / "resume.json", tmp_path / "resumed.pt"
        code, log = processes.finish(processes.spawn("resumed", __file__, "resume", save_dir, resume_report, out))
        assert code == 0, log
        code, log = processes.finish(reference)
        assert code == 0, log
    resumed = json.loads(resume_report.read_text())
    assert resumed["resumed_at"] == PREVIOUS
    # The first save after the resume (step K again) cleaned every staging leftover and published.
    assert not [name for name in resumed["after_save"] if name.startswith(".staging-")], resumed["after_save"]
    assert resumed["latest_after_save"] == K
    assert not [name for name in resumed["final"] if name.startswith(".staging-")], resumed["final"]

    result, expected = torch.load(out, weights_only=True), torch.load(tmp_path / "full.pt", weights_only=True)
    assert same_weights(result["weights"], expected["weights"])
    assert expected["trace"][-len(result["trace"]) :] == result["trace"]


if __name__ == "__main__":
    mode, where, report_file, *rest = sys.argv[1:]
    if mode == "crash":
        _crash(pathlib.Path(where), pathlib.Path(report_file))
    else:
        _resume(pathlib.Path(where), pathlib.Path(report_file), pathlib.Path(rest[0]))
