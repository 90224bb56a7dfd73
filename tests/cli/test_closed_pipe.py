"""``python -m pimm_fn ... | head -1``: a reader that stops early ends the command quietly, no traceback."""

import subprocess
import sys

import torch

import pimm_fn as pf

CLOSED_PIPE = 141  # 128 + SIGPIPE, as a shell reports it


def test_plan_piped_into_head_prints_no_broken_pipe_traceback():
    """A plan far longer than a pipe's buffer, read by `head -1`: the first line, exit 141, stderr empty."""
    command = (
        f"{sys.executable} -m pimm_fn plan '[save_every(1)]' --iters-per-epoch 10000 --max-epochs 2 | head -1;"
        " echo rc=${PIPESTATUS[0]} >&2"
    )
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["step", "event", "hook", "effect"]
    assert done.stderr.strip() == f"rc={CLOSED_PIPE}", done.stderr


def test_ls_into_a_closed_pipe_prints_no_broken_pipe_traceback(tmp_path):
    """`ls` of a real save_dir whose reader has gone before it writes: exit 141 and nothing on stderr."""
    model = torch.nn.Linear(2, 1)
    batches = [torch.ones(2)] * 2
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        batches,
        hooks=[pf.save_every(2)],
        max_steps=2,
        save_dir=tmp_path,
        step_fn=_step,
        watching=pf.Watching(console=False, progress=False),
    )
    run()
    process = subprocess.Popen(
        [sys.executable, "-m", "pimm_fn", "ls", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    process.stdout.close()  # the reader goes away before the command has written anything
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert (process.returncode, stderr) == (CLOSED_PIPE, "")


def _step(model, optimizer, batch, *, scheduler=None, scaler=None):
    optimizer.zero_grad()
    loss = model(batch).pow(2).sum()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item()}
