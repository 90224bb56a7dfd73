"""The example notebook, run headlessly in a real Jupyter kernel, shows what its markdown says.

nbclient executes ``examples/notebook.ipynb`` in an ipykernel (kernel
``python3``: jupyter_client starts it with the interpreter running pytest,
which the test checks), with a timeout per cell, in an empty working
directory. The checks read the cells' outputs (found by their tags): the
plan, the trace equal to it, stepping, the history and its plot, Ctrl-C and
continue, the resume after a simulated kernel restart, the extended run and
the log order. The same checks run on the committed notebook, whose saved
outputs must say the same. Timings in the console lines are never checked.
"""

import base64
import pathlib
import re
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
CELL_TIMEOUT = 30  # seconds per cell; each takes well under one
TEST_TIMEOUT = 90  # the whole execution, kernel start and shutdown included: a stuck kernel fails the test


def cells_by_tag(nb) -> dict:
    return {tag: cell for cell in nb.cells if cell.cell_type == "code" for tag in cell.metadata.get("tags", [])}


def stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def result(cell) -> str:
    """The text the cell's last expression displayed."""
    (shown,) = [o for o in cell.outputs if o.output_type == "execute_result"]
    return shown.data["text/plain"]


def lines_in_order(text: str, *patterns: str) -> bool:
    """Each pattern matches a line of ``text``, after the line the previous one matched."""
    lines, at = text.splitlines(), 0
    for pattern in patterns:
        at = next((i for i in range(at, len(lines)) if re.search(pattern, lines[i])), None)
        if at is None:
            return False
        at += 1
    return True


def check(nb) -> None:
    """Assert the outputs of an executed notebook show each section's point."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), "not executed top to bottom"
    for cell in code:
        kinds = [(o.output_type, o.get("name")) for o in cell.outputs]
        assert ("error", None) not in kinds and ("stream", "stderr") not in kinds, (cell.source, cell.outputs)
    every = "\n".join(
        stdout(cell) + "".join(o.get("data", {}).get("text/plain", "") for o in cell.outputs) for cell in code
    )
    assert tempfile.gettempdir() + "/" not in every, "an absolute temporary path in the outputs"
    # Every "new best" line follows the evaluation line that caused it (issue 12: log order).
    lines = every.splitlines()
    for i, line in enumerate(lines):
        if found := re.search(r"new best neg_mse=\S+ at step (\d+)", line):
            assert re.search(rf"step {found[1]} eval/val: neg_mse=", lines[i - 1]), lines[i - 1 : i + 1]

    cell = cells_by_tag(nb)
    # 1. The plan, the reference run, and its trace equal to the plan.
    plan = result(cell["plan"])
    assert plan.startswith("Trace: 15 effects, steps 2 to 12"), plan
    assert lines_in_order(plan, r"^  4 .*Log\(step=4, kind='epoch'", r"^  4 .*SaveCheckpoint\(step=4, deferred=True\)")
    assert "WriteBest" not in plan  # the plan does not know the metric values
    ran = stdout(cell["reference"])
    assert [int(s) for s in re.findall(r"saved checkpoint of step (\d+) to runs/reference/model/last", ran)] == [
        4,
        8,
        12,
    ]
    assert result(cell["trace-equals-plan"]) == "True"
    # 2. Stepping: the compact State display.
    assert "progress: step 1/12, epoch 0 (iter 1/4)" in result(cell["step"])
    stepped = result(cell["run-steps"])
    assert stepped.startswith("State\n") and "progress: step 4/12" in stepped and len(stepped.splitlines()) <= 8
    # 3. History: its summary, a DataFrame and a plot as an image.
    assert result(cell["history"]) == (
        "History(12 records, steps 2-12: train x6 (loss, lr), eval/val x3 (neg_mse), epoch x3 (loss, lr))"
    )
    (frame,) = [o for o in cell["pandas"].outputs if o.output_type == "execute_result"]
    assert "<table" in frame.data["text/html"] and frame.data["text/plain"].split()[:6] == [
        "step",
        "epoch",
        "iter",
        "of",
        "loss",
        "lr",
    ]
    assert len(frame.data["text/plain"].splitlines()) == 1 + 6  # header and the six logged steps
    images = [o.data["image/png"] for o in cell["plot"].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1 and base64.b64decode(images[0]).startswith(b"\x89PNG")
    # 4. Ctrl-C inside the forward at step 6, caught; run() continues exactly.
    assert lines_in_order(
        stdout(cell["interrupt"]),
        r"interrupted at step 6 during the train step; run\(\) continues exactly from here",
        r"^caught KeyboardInterrupt$",
    )
    assert result(cell["interrupt"]) == "Interruption(step=6, phase='the train step', continues=True)"
    assert result(cell["continue"]) == "(True, True)"
    # 5. A fresh loop after a simulated kernel restart resumes at step 8 and ends as the reference.
    assert "resumed from runs/demo/model/last at step 8" in stdout(cell["restart"]) and result(cell["restart"]) == "8"
    assert lines_in_order(stdout(cell["identical"]), r"^same weights: True$", r"^same history: True$")
    # 6. A finished run extended to one more epoch.
    extended = stdout(cell["extend"])
    assert lines_in_order(extended, "resumed from runs/demo/model/last at step 12", r"max_epochs 3 -> max_epochs 4")
    assert "progress: step 15/16" in result(cell["extend"])
    # 7. The log order of the last step: train (a record, first), evaluation, new best, epoch, the deferred save.
    assert lines_in_order(
        stdout(cell["log-order"]),
        r"step 16 train:",
        r"step 16 eval/val: neg_mse=",
        r"new best neg_mse=\S+ at step 16",
        r"step 16 epoch:",
        r"saved checkpoint of step 16",
        r"^finished: True$",
    )
    assert result(cell["log-order"]).startswith("History(16 records, steps 2-16: train x8")


def test_the_committed_notebook_holds_the_outputs_of_every_section():
    """The notebook in the repository is saved executed, top to bottom, and its outputs show each section."""
    check(nbformat.read(NOTEBOOK, as_version=4))


def test_the_notebook_runs_headlessly_in_a_kernel_and_shows_every_section(tmp_path):
    """nbclient executes every cell in a python3 kernel of this interpreter; the fresh outputs pass the checks."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    launched = []
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        startup_timeout=60,
        record_timing=False,
        coalesce_streams=True,  # as the committed notebook was saved
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.on_notebook_start = lambda notebook: launched.append(list(client.km.provisioner.process.args))
    with within(TEST_TIMEOUT, "the notebook"):
        client.execute()
    assert launched and launched[0][0] == sys.executable, launched  # the kernel runs this venv's python
    check(nb)
    assert list(tmp_path.iterdir()) == []  # the notebook worked in its own scratch directory and removed it
