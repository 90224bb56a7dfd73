"""A live run in a notebook: compact displays of the loop, its state and its trace; log lines in causal order."""

from IPython.lib.pretty import pretty

import torch

import pimm_fn as pf
from pimm_fn.core.trace import Trace
from pimm_fn.testing.assertions import published_metrics
from _tiny_workload import TinyNet, build, loader, negative_mse


def history(state, event):
    """A plain-function user hook, shown by its identity."""
    return state, ()


def _hooks():
    return [
        pf.evaluate_every(4, negative_mse, name="val"),
        pf.save_every(3),
        pf.best_on("score"),
        pf.log_every(5),
        history,
    ]


def test_a_loop_displays_progress_metrics_best_last_save_and_hooks_by_identity(tmp_path):
    """str/pretty/HTML of a Loop: step/total, epoch, metrics, best, last save, last train log, each hook with its slot."""
    _, run = build(tmp_path, hooks=_hooks(), max_epochs=2)
    state = run.run(steps=8)
    text = str(run)
    assert pretty(run) == text and "0x" not in text and "0x" not in repr(run)
    rows = {label: value.strip() for label, value in (line.strip().split(":", 1) for line in text.splitlines()[1:7])}
    assert rows["progress"] == "step 8/10, epoch 1 (iter 3/5), max_epochs=2, 64 samples; after AfterStep"
    assert rows["metrics"] == rows["best"] == f"score={state.metrics['score']:.5g}"
    assert rows["last save"] == "step 6" and rows["trace"] == f"{len(run.trace)} effects (run.trace)"
    assert rows["last train log"].startswith("step 5: epoch=0 iter=5 of=5 loss=")
    assert text.splitlines()[-5:] == [
        "  hooks:          evaluate_every(4, negative_mse, name='val')",
        "                  save_every(3): SaveEveryState(last_saved=6)",
        f"                  best_on('score'): BestState(value={state.best['score']:.5g}, step=8)",
        text.splitlines()[-2],  # log_every(5): its running sums
        f"                  {__name__}.history",
    ]
    assert repr(run).endswith(f"log_every(5), {__name__}.history]>")
    assert '<progress value="8" max="10">' in run._repr_html_()


def test_run_returns_the_state_whose_notebook_display_is_compact(tmp_path):
    """run.run() returns run.state itself; a cell ending in it shows a few lines, not every slot's repr."""
    _, run = build(tmp_path, hooks=_hooks(), max_epochs=1)
    state = run.run(steps=5)
    assert state is run.state and state.progress.global_step == 5
    shown = pretty(state)
    assert shown == str(state) and len(shown.splitlines()) <= 8 and "LogState(sums=FrozenMap" not in shown
    assert "LogState(sums=FrozenMap" in repr(state)  # repr keeps every field, for debugging


def test_run_trace_is_a_trace_equal_to_the_plan(tmp_path):
    """run.trace is a Trace: it equals plan()'s tuple given the published metrics, and displays by hook identity."""
    hooks = [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.best_on("score")]
    _, run = build(tmp_path, hooks=hooks, max_epochs=2)
    run()
    metrics = published_metrics(run.trace)
    planned = pf.plan(hooks, iters_per_epoch=5, max_epochs=2, metrics=metrics)
    trace = run.trace
    assert isinstance(trace, Trace) and [(e.step, e.effect) for e in trace] == [(e.step, e.effect) for e in planned]
    assert str(trace).splitlines()[2].split()[:3] == ["3", "save_every(3)", "AfterStep(step=3,"]


def test_the_evaluation_line_is_printed_before_the_new_best_line(tmp_path, capsys):
    """On the console, each evaluation's log line comes before the "new best" line it caused."""
    model = TinyNet()
    run = pf.loop(
        model, torch.optim.SGD(model.parameters(), lr=0.01), loader(), hooks=_hooks(), max_epochs=1, save_dir=tmp_path
    )  # console on: the default
    run.run(steps=4)
    lines = [line for line in capsys.readouterr().out.splitlines() if "eval/val" in line or "new best" in line]
    assert [("eval" if "eval/val" in line else "best") for line in lines] == ["eval", "best"]
