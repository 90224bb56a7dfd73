"""The example notebook runs top to bottom (its code cells, in order, in one namespace)."""

import json
import pathlib

NOTEBOOK = pathlib.Path(__file__).parents[2] / "examples" / "notebook.ipynb"


def test_example_notebook_runs_and_resumes_to_the_end(capsys):
    """Every code cell executes; the resumed run finishes at the last step."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    assert namespace["final"].progress.global_step == 16
    assert "resumed at step 8" in capsys.readouterr().out
