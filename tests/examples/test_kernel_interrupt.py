"""A notebook run in a real Jupyter kernel, interrupted (SIGINT) mid-training, continues exactly.

nbclient executes a notebook in an ipykernel. Three cells call ``run.run()``
and are interrupted by nbclient itself (``interrupt_on_timeout``: a real
``interrupt_kernel()``, SIGINT to the kernel process) at different times
after they start, wherever the loop happens to be; the last cell calls
``run.run()`` to the end. The weights, optimizer state, trace and state then
equal those of an uninterrupted run of the same workload in the same kernel.
"""

import pathlib
import re
import sys

import nbformat
import torch
from nbclient import NotebookClient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _stuck import within  # noqa: E402

RUNTIME_TESTS = pathlib.Path(__file__).resolve().parents[1] / "runtime"  # _tiny_workload.py
INTERRUPT_AFTER = (0.3, 0.7, 1.2)  # seconds after each run.run() cell starts; training takes longer
CELL_TIMEOUT = 60  # for the cells that are not interrupted
TEST_TIMEOUT = 120  # the whole test, kernel start and shutdown included: a stuck kernel fails it

SETUP = """\
import sys, tempfile, torch
sys.path.insert(0, {runtime!r})
import pimm_fn as pf
from _tiny_workload import TinyNet, loader, negative_mse

def build():
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.9)
    hooks = [pf.evaluate_every(10, negative_mse, name="val"), pf.save_every(50), pf.best_on("score"),
             pf.log_every(200)]
    run = pf.loop(model, optimizer, loader(), hooks=hooks, max_epochs=500, save_dir=tempfile.mkdtemp(),
                  scheduler=scheduler)
    return model, optimizer, run

def keep(path, model, optimizer, run):
    torch.save({{"weights": model.state_dict(), "optimizer": optimizer.state_dict(),
                "trace": [repr(e) for e in run.trace], "state": repr(run.state)}}, path)
"""


def code(source, **metadata):
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def notebook(out: pathlib.Path):
    cells = [
        code(SETUP.format(runtime=str(RUNTIME_TESTS))),
        code(f"model, optimizer, run = build()\nrun.run()\nkeep({str(out / 'reference.pt')!r}, model, optimizer, run)"),
        code("model, optimizer, run = build()"),
    ]
    for seconds in INTERRUPT_AFTER:
        cells.append(code("run.run()", interrupt_after=seconds, tags=["raises-exception"]))
        cells.append(code("print('interrupted:', run.interrupted)"))
    cells.append(
        code(
            f"final = run.run()\nkeep({str(out / 'continued.pt')!r}, model, optimizer, run)\n"
            f"print('finished at step', final.progress.global_step)"
        )
    )
    return nbformat.v4.new_notebook(cells=cells)


def text(cell) -> str:
    """A cell's stdout, stderr and error tracebacks, ANSI colours removed."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.extend([f"{output.ename}: {output.evalue}", *output.traceback])
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def same(a, b) -> bool:
    """Equal nested values, tensors compared bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def test_kernel_interrupts_mid_training_then_run_continues_exactly(tmp_path):
    """SIGINT to a real kernel at three times during run.run(), then run.run(): bit-identical to no interrupt."""
    nb = notebook(tmp_path)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
        startup_timeout=60,
        # A cell marked interrupt_after is interrupted that long after it starts; nbclient then takes
        # the cell's outputs up to the kernel's next idle (the KeyboardInterrupt traceback included)
        # and goes on to the next cell. A kernel that does not get there fails on the iopub timeout.
        timeout_func=lambda cell: cell.metadata.get("interrupt_after", CELL_TIMEOUT),
        interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellInterrupted", "evalue": "interrupted by the test", "traceback": []},
        iopub_timeout=30,
        raise_on_iopub_timeout=True,
    )
    with within(TEST_TIMEOUT, "the kernel test"):
        client.execute()

    interrupted = [cell for cell in nb.cells if "interrupt_after" in cell.metadata]
    stops = []
    for cell, report in zip(interrupted, [nb.cells[nb.cells.index(c) + 1] for c in interrupted]):
        out = text(cell)
        assert "KeyboardInterrupt" in out, f"run.run() was not interrupted (training ended first?):\n{out[-2000:]}"
        lines = re.findall(r"interrupted at step (\d+) during (.+); run\(\) continues exactly from here", out)
        # A Ctrl-C held to the safe point between two steps stops the run there, with nothing half done.
        between = re.findall(r"interrupted after step (\d+); run\(\) continues exactly", out)
        # No line: the SIGINT landed between the loop's guarded regions (e.g. in Loop._train between
        # its fetch and the held batch, or after the train step returned), so run() cannot continue exactly.
        assert len(lines) + len(between) == 1, (
            f"KeyboardInterrupt without one interruption line (after {stops}):\n{out[-2000:]}"
        )
        if between:
            assert "interrupted: None" in text(report), text(report)  # no step is left half done
            stops.append((int(between[0]), "between steps"))
            continue
        step, phase = lines[0]
        # Loop.interrupted, read in the next cell, is the place the line named.
        assert f"interrupted: interrupted at step {step} during {phase};" in text(report), text(report)
        if "ResumeNotExactWarning" in out:  # an interrupt inside optimizer.step(): said, not silent
            phase += " (ResumeNotExactWarning)"
        stops.append((int(step), phase))
    assert [s for s, _ in stops] == sorted(s for s, _ in stops), stops
    assert "finished at step 2500" in text(nb.cells[-1]), text(nb.cells[-1])[-2000:]

    reference = torch.load(tmp_path / "reference.pt", weights_only=False)
    continued = torch.load(tmp_path / "continued.pt", weights_only=False)
    if any("ResumeNotExactWarning" in phase for _, phase in stops):
        return  # the loop said this continuation is not exact; the lines above were checked
    assert same(continued["weights"], reference["weights"]), stops
    assert same(continued["optimizer"], reference["optimizer"]), stops
    assert continued["trace"] == reference["trace"], stops
    assert continued["state"] == reference["state"], stops
