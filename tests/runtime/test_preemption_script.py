"""A training script stopped from outside, as a cluster or a person stops it: real signals, real exit codes.

The script (``_preemption_workload.py``) runs ``run()`` at its top level and
catches nothing. SIGTERM at a random moment: exit code 75, one line saying
what was saved, no traceback, and ``resume="auto"`` ends bit-identical to an
uninterrupted run. Ctrl-C: no loop traceback, but where the last checkpoint
is and how to continue.
"""

import contextlib
import json
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

import _preemption_workload as pw
import _tiny_workload as tw

HERE = pathlib.Path(__file__).resolve().parent
TIMEOUT = 60


def _start(save_dir, ready, *flags) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_preemption_workload.py"), str(save_dir), str(ready), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(proc, ready: pathlib.Path) -> None:
    """Wait until ``ready`` exists (the script writes its ready file once it trained two steps); fail if the script
    ends or ``TIMEOUT`` passes first."""
    deadline = time.monotonic() + TIMEOUT
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the script never got to train: {proc.communicate()}")
        time.sleep(0.01)


def _signal_when_ready(proc, ready: pathlib.Path, sig, delay: float) -> tuple:
    """Send ``sig`` ``delay`` seconds after ``ready`` appeared (``_wait_ready``); its (exit code, stdout, stderr)."""
    _wait_ready(proc, ready)
    time.sleep(delay)
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the script did not stop within {TIMEOUT}s of {sig.name}: {proc.communicate()}")
    return proc.returncode, out, err


def test_sigterm_at_a_random_moment_saves_one_step_exits_75_and_resumes_bit_identical(tmp_path):
    """SIGTERM to a running script: one agreed step saved, one line, exit 75, no traceback; the resume is exact."""
    delay = random.uniform(0.0, 0.3)
    code, out, err = _signal_when_ready(
        _start(tmp_path / "run", tmp_path / "ready"), tmp_path / "ready", signal.SIGTERM, delay
    )
    said = [line for line in out.splitlines() if "SIGTERM" in line]
    assert code == 75, (delay, out, err)
    assert "Traceback" not in err, err
    assert len(said) == 1 and "saved step" in said[0] and 'resume="auto"' in said[0], out
    step = int(said[0].split("saved step ")[1].split()[0])
    assert json.loads((tmp_path / "run" / "model" / "last" / "COMPLETE").read_text())["step"] == step

    model, run = pw.build(tmp_path / "run", resume="auto")
    run()
    reference_model, reference = pw.build(tmp_path / "reference")
    reference()
    assert run.state.progress.global_step == reference.state.progress.global_step
    assert tw.same_weights(tw.weights(model), tw.weights(reference_model)), delay


def _signal_until_it_exits(proc, sig, every: float = 0.005) -> int:
    """Send ``sig`` every ``every`` seconds until ``proc`` exits (within ``TIMEOUT``); its exit code."""
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the script did not exit within {TIMEOUT}s of {sig.name}: {proc.communicate()}")
        with contextlib.suppress(ProcessLookupError):  # it may exit between poll() and here
            proc.send_signal(sig)
        time.sleep(every)
    return proc.returncode


@pytest.mark.parametrize("trial", range(3))
def test_sigterms_after_the_first_are_held_until_the_script_exits_with_75(tmp_path, trial):
    """SIGTERM, then SIGTERM again every 5 ms until the script is gone: the save, its line, and exit 75 every time."""
    proc = _start(tmp_path / "run", tmp_path / "ready")
    _wait_ready(proc, tmp_path / "ready")
    code = _signal_until_it_exits(proc, signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert code == 75, (code, out, err[-2000:])
    assert "Traceback" not in err and [line for line in out.splitlines() if "SIGTERM: saved step" in line], (out, err)


def test_ctrl_c_in_a_script_says_where_the_last_checkpoint_is_without_the_loops_traceback(tmp_path):
    """SIGINT to a script: it ends as Ctrl-C ends a script, saying the last checkpoint and resume="auto", no traceback."""
    code, out, err = _signal_when_ready(
        _start(tmp_path / "run", tmp_path / "ready"), tmp_path / "ready", signal.SIGINT, 0.2
    )
    assert code != 0, (code, out, err)  # 130 for a bare script; 1 once torch's imports are in
    assert "Traceback" not in err, err
    assert "stopped by Ctrl-C " in err and ('loop(..., resume="auto")' in err or "starts over" in err), err
    assert "save_on_interrupt=True" in err and "continues exactly" not in out + err, (out, err)


def test_ctrl_c_in_a_script_built_to_resume_says_one_line_with_the_step_it_resumes_from(tmp_path):
    """SIGINT to a script built with resume="auto": one line, no "run() continues", the step stopped and the
    checkpoint's step it resumes from, and no advice to pass resume="auto" again."""
    marker = tmp_path / "run" / "model" / "last" / "COMPLETE"
    code, out, err = _signal_when_ready(
        _start(tmp_path / "run", tmp_path / "ready", "--resume"), marker, signal.SIGINT, 0.05
    )  # once a checkpoint is there
    said = [line for line in (out + err).splitlines() if "Ctrl-C" in line or "interrupted" in line]
    assert code != 0 and "Traceback" not in err, (code, out, err)
    assert len(said) == 1 and "continues exactly" not in out + err, said
    saved = json.loads(marker.read_text())["step"]
    stopped = int(said[0].split("stopped by Ctrl-C ")[1].split("step ")[1].split()[0])
    assert stopped > saved, said
    assert f'Run the script again: it resumes from step {saved} (resume="auto")' in said[0], said
    assert "loop(..., resume=" not in said[0], said
