"""ls, inspect and verify on crafted files under a save_dir: each answers at once, naming the file and what is wrong.

A FIFO as ``COMPLETE`` or ``model_best.json`` once made all three wait
forever; JSON nested 100,000 deep, a ``model_best.json`` that is not a
record, or a marker whose metrics are a list made ``ls`` end in a
traceback (RecursionError, TypeError, AttributeError). A command run in
this process that could wait runs under a deadline; the exit codes and
stderr through a subprocess with a timeout.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import save_checkpoint
from pimm_fn.cli import DAMAGED, OK, main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

DEEP = "[" * 100000


def _cli(*args):
    """``python -m pimm_fn ARGS`` in a subprocess, bounded: a hang is a failure, not a stuck suite."""
    return subprocess.run(
        [sys.executable, "-m", "pimm_fn", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def _main(capsys, *args) -> tuple[int, str, str]:
    """``python -m pimm_fn ARGS`` in this process, bounded: exit code, stdout, stderr."""
    with within(60):
        code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run: last, iter_4, iter_2 and model_best.pth (best_on 'acc'), never modified."""
    root = tmp_path_factory.mktemp("untrusted") / "run"
    scores = iter([0.1, 0.5])
    torch.manual_seed(0)
    model = _Net()
    pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(2, 4)] * 4,
        hooks=[
            pf.evaluate_every(2, lambda m: {"acc": next(scores)}),
            pf.best_on("acc"),
            pf.save_every(2, snapshots=True),
        ],
        max_epochs=1,
        save_dir=root,
        watching=pf.Watching(console=False, progress=False),
    )()
    return root


@pytest.fixture
def run_dir(trained, tmp_path):
    """A copy of the finished run, this test's to damage."""
    return shutil.copytree(trained, tmp_path / "run")


def _replace(path, content):
    """Put ``content`` where ``path`` was: a FIFO for ``None``, else the text."""
    path.unlink()
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)


def _rows(capsys, save_dir, code=OK) -> dict:
    """``ls --json``'s rows by name, its exit code checked: 1 when a row is damaged or incomplete."""
    found, out, err = _main(capsys, "ls", save_dir, "--json")
    assert found == code, err
    return {r["name"]: r for r in json.loads(out)["entries"]}


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "COMPLETE is a FIFO, not a regular file"),
        (DEEP, "COMPLETE is not valid JSON (nested too deeply to parse)"),
    ],
)
def test_a_fifo_or_too_deep_marker_is_a_damaged_row_in_ls_inspect_and_verify(run_dir, capsys, content, problem):
    """last/COMPLETE a FIFO or 100,000 brackets deep: ls marks last damaged; ls, inspect and verify exit 1, at once."""
    _replace(run_dir / "model" / "last" / "COMPLETE", content)
    rows = _rows(capsys, run_dir, DAMAGED)
    assert rows["last"]["status"] == "damaged" and problem in rows["last"]["problem"]
    assert rows["iter_4"]["status"] == "complete" and rows["model_best.pth"]["best"] == {"acc": 0.5}
    code, _, err = _main(capsys, "inspect", run_dir / "model" / "last")
    assert code == DAMAGED and problem in err
    code, out, _ = _main(capsys, "verify", run_dir)
    assert code == DAMAGED
    assert any(line.startswith("DAMAGED") and "last" in line and problem in line for line in out.splitlines()), out


def test_scripts_get_an_exit_code_and_one_line_not_a_wait_or_a_traceback(run_dir):
    """Through a real subprocess (bounded): a FIFO marker is exit 1 and one line for inspect; ls lists both damaged
    rows and exits 1, naming them."""
    _replace(run_dir / "model" / "last" / "COMPLETE", None)
    _replace(run_dir / "model" / "iter_4" / "COMPLETE", DEEP)
    inspected = _cli("inspect", run_dir / "model" / "last")
    assert inspected.returncode == DAMAGED and inspected.stdout == "" and "Traceback" not in inspected.stderr
    assert "COMPLETE is a FIFO, not a regular file" in inspected.stderr
    listed = _cli("ls", run_dir)
    assert listed.returncode == DAMAGED and listed.stderr == "pimm_fn ls: 2 of 4 damaged or incomplete: last, iter_4\n"
    assert [line.split()[3] for line in listed.stdout.splitlines()[1:3]] == ["DAMAGED", "DAMAGED"]


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "model_best.json is a FIFO, not a regular file"),
        (DEEP, "model_best.json is damaged (ValueError: nested too deeply to parse)"),
        ("[1]", "model_best.json is damaged (ValueError: holds a JSON list, not a record"),
        ('"x"', "model_best.json is damaged (ValueError: holds a JSON str, not a record"),
        ('{"metric": [1], "step": 4, "value": 1.0}', "model_best.json is damaged (ValueError: 'metric' must be a str"),
        ('{"metric": "acc", "value": 1.0}', "model_best.json is damaged (ValueError: 'step' must be an int >= 0"),
    ],
)
def test_a_damaged_best_record_is_a_problem_in_ls_and_inspect_and_verify_answers(run_dir, capsys, content, problem):
    """A FIFO, too deep JSON or not a record as model_best.json: ls and inspect say which file and why, verify calls
    the best model damaged (which metric it is the best of, and its digest, cannot be read); none waits."""
    best = run_dir / "model" / "model_best.pth"
    _replace(best.with_suffix(".json"), content)
    row = _rows(capsys, run_dir)["model_best.pth"]
    assert (row["status"], row["best"]) == ("best", {}) and row["problem"].startswith(problem), row
    code, out, _ = _main(capsys, "inspect", best, "--json")
    assert code == OK and json.loads(out)["best"]["problem"].startswith(problem)
    code, out, _ = _main(capsys, "verify", best)
    assert code == DAMAGED and out.startswith("DAMAGED") and "model_best.json" in out, out


@pytest.fixture
def listed_metrics(tmp_path):
    """Two checkpoints whose markers record metrics as a list, not a dict: a standard one and a legacy one."""
    save_checkpoint(
        tmp_path / "standard", step=3, weights={"w": torch.ones(2)}, trainer={}, local={}, metrics={"acc": 0.5}
    )
    marker = tmp_path / "standard" / "last" / "COMPLETE"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "metrics": [1]}))
    save_checkpoint(
        tmp_path / "legacy",
        step=3,
        weights={"w": torch.ones(2)},
        trainer={},
        local={},
        metrics={"acc": 0.5},
        format="legacy",
    )
    path = tmp_path / "legacy" / "last.pth"
    content = torch.load(path, weights_only=True)
    content["marker"]["metrics"] = [1]
    torch.save(content, path)
    return tmp_path


@pytest.mark.parametrize("fmt, name", [("standard", "last"), ("legacy", "last.pth")])
def test_ls_says_a_markers_metrics_are_not_a_dict_instead_of_failing(listed_metrics, capsys, fmt, name):
    """A marker recording metrics as a list: ls lists the checkpoint, its problem saying so, in JSON and as text."""
    assert main(["ls", str(listed_metrics / fmt), "--json"]) == OK
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)["entries"]}[name]
    assert (row["status"], row["step"], row["metrics"]) == ("complete", 3, {})
    assert row["problem"] == "its marker's metrics are a list, not a dict (damaged or crafted)"
    assert main(["ls", str(listed_metrics / fmt)]) == OK
    assert "its marker's metrics are a list" in capsys.readouterr().out
