"""The progress bar in a real Jupyter kernel: each cell's run() shows its bar in that cell; text on one stream.

nbclient executes a notebook in an ipykernel with ipywidgets installed
(the ``notebook`` extra) and keeps the widgets' final state. Two cells each
train 3 steps of epochs of 5 and 4 (``max_steps=9``): each cell must display
its own bar widget, counting the epoch it shows (3 of epoch 0's 5, then 1
of epoch 1's 4), and the first cell's bar is not painted as failed. A third cell hides ipywidgets: its bar is text, on stdout beside
the console lines, with nothing on stderr.
"""

import pathlib
import sys

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

RUNTIME_TESTS = pathlib.Path(__file__).resolve().parents[1] / "runtime"  # _tiny_workload.py
CELL_TIMEOUT = 60
TEST_TIMEOUT = 120  # the whole test, kernel start and shutdown included: a stuck kernel fails it
WIDGET = "application/vnd.jupyter.widget-view+json"

SETUP = """\
import sys, tempfile, torch
sys.path.insert(0, {runtime!r})
import pimm_fn as pf
from _tiny_workload import TinyNet, loader
torch.manual_seed(0)
model = TinyNet()
run = pf.loop(model, torch.optim.SGD(model.parameters(), lr=0.01), loader(), hooks=[pf.log_every(1)],
              max_steps=9, watching=pf.Watching(progress=True))
"""


def _widgets(cell) -> list:
    return [o.data[WIDGET]["model_id"] for o in cell.outputs if o.output_type == "display_data" and WIDGET in o.data]


def _stream(cell, name: str) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


def test_each_cell_shows_its_own_bar_and_a_text_bar_shares_stdout(tmp_path):
    """Cell 2 and cell 3 each show one bar widget, at 3/5 (epoch 0) and 1/4 (epoch 1); without ipywidgets the bar is
    on stdout."""
    cells = [
        SETUP.format(runtime=str(RUNTIME_TESTS)),
        "state = run.run(steps=3)",
        "state = run.run(steps=3)",
        "sys.modules['ipywidgets'] = None  # as if not installed\nstate = run.run(steps=3)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT,
        startup_timeout=60,
        record_timing=False,
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with within(TEST_TIMEOUT, "the progress-bar notebook"):
        client.execute()
    _, first, second, text = nb.cells
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]

    def bar(model_id) -> dict:
        """The progress widget inside tqdm's box: its value, maximum and style."""
        progress = state[state[model_id]["state"]["children"][1].removeprefix("IPY_MODEL_")]["state"]
        return {"value": progress["value"], "max": progress["max"], "style": progress.get("bar_style", "")}

    (first_bar,), (second_bar,) = _widgets(first), _widgets(second)
    assert bar(first_bar) == {"value": 3, "max": 5, "style": ""}  # set aside where it stopped, not 'danger'
    assert bar(second_bar)["value"] == 1 and bar(second_bar)["max"] == 4  # step 6: epoch 1's first of 4
    assert _widgets(text) == [] and _stream(text, "stderr") == ""
    out = _stream(text, "stdout")
    assert "step 9 train: epoch=1" in out and "epoch 1: 100%" in out and "4/4 [" in out, out
