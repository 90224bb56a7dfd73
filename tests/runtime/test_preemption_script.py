"""A training script stopped from outside, as a cluster or a person stops it: real signals, real exit codes.

The script (``_preemption_workload.py``) runs ``run()`` at its top level and
catches nothing. SIGTERM at a random moment: exit code 75, one line saying
what was saved, no traceback, and ``resume="auto"`` ends bit-identical to an
uninterrupted run. Ctrl-C: no loop traceback, but where the last checkpoint
is and how to continue.
"""

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
    return subprocess.Popen([sys.executable, str(HERE / "_preemption_workload.py"), str(save_dir), str(ready), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _signal_when_ready(proc, ready: pathlib.Path, sig, delay: float) -> tuple:
    """Send ``sig`` ``delay`` seconds after the script trained two steps; its (exit code, stdout, stderr)."""
    deadline = time.monotonic() + TIMEOUT
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the script never got to train: {proc.communicate()}")
        time.sleep(0.01)
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
    code, out, err = _signal_when_ready(_start(tmp_path / "run", tmp_path / "ready"), tmp_path / "ready",
                                        signal.SIGTERM, delay)
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


def test_ctrl_c_in_a_script_says_where_the_last_checkpoint_is_without_the_loops_traceback(tmp_path):
    """SIGINT to a script: it ends as Ctrl-C ends a script, saying the last checkpoint and resume="auto", no traceback."""
    code, out, err = _signal_when_ready(_start(tmp_path / "run", tmp_path / "ready"), tmp_path / "ready",
                                        signal.SIGINT, 0.2)
    assert code != 0, (code, out, err)  # 130 for a bare script; 1 once torch's imports are in
    assert "Traceback" not in err, err
    assert "stopped by Ctrl-C at step" in err and 'resume="auto"' in err, err
    assert "save_on_interrupt=True" in err
