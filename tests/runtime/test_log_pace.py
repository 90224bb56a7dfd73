"""The pace on log lines counts training time: a notebook's pause between cells is left out."""

import re
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import pimm_fn as pf
from pimm_fn.core.state import Progress
from pimm_fn.runtime.handlers.logs import Logs


def _ms_per_step(line: str) -> float:
    return float(re.search(r"([\d.]+) ms/step", line).group(1))


def _logging_every_2(model, step_fn, *, save_dir=None, console=True):
    """A run of 8 steps of ``model`` by ``step_fn``, logging every 2, without a progress bar."""
    data = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=2)
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        hooks=[pf.log_every(2)],
        max_epochs=1,
        step_fn=step_fn,
        save_dir=save_dir,
        watching=pf.Watching(console=console, progress=False),
    )


def test_the_clock_held_between_calls_leaves_the_pause_out_of_the_pace():
    """hold() at a return, go() at the next call: the pace is the time spent training, not the wall clock."""
    logs = Logs()
    logs.start(Progress(10, 1), resumed=False)
    logs.hold()
    time.sleep(0.3)
    logs.go()
    line = logs.pace("train", Progress(10, 1, iter_in_epoch=2, global_step=2, samples_seen=8))
    assert _ms_per_step(line) < 100, line  # 0.3 s over 2 steps would be 150 ms/step


def test_a_run_continued_after_a_pause_reports_its_steps_pace_not_the_pause(capsys):
    """run(steps=2), a pause, run(): the next train line's ms/step does not hold the pause."""
    model = torch.nn.Linear(2, 1)

    def step_fn(model, optimizer, batch, *, scheduler=None, scaler=None):
        loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": loss}

    run = _logging_every_2(model, step_fn)
    run.run(steps=2)
    time.sleep(0.6)
    run.run(steps=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "step 4 train" in line]
    assert lines and _ms_per_step(lines[0]) < 200, lines  # the pause alone would be 300 ms/step


def test_with_the_console_off_no_line_or_pace_is_made_and_every_record_is_kept(monkeypatch, tmp_path):
    """Watching(console=False): the Log handler builds no console line (nor its pace); history and log.jsonl hold all."""
    paced = []
    monkeypatch.setattr(Logs, "pace", lambda self, kind, progress: paced.append(kind) or "")
    run = _logging_every_2(
        torch.nn.Linear(2, 1),
        lambda model, optimizer, batch, **_: {"loss": torch.tensor(0.5)},
        save_dir=tmp_path,
        console=False,
    )
    run()
    steps = [r["step"] for r in run.history.records("train")]
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert paced == [] and steps == [2, 4, 6, 8] and len(lines) == len(run.history)
