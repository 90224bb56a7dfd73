"""The progress bar: on where someone watches, rank 0 only, no host sync, not in the trace, lines kept whole."""

import re

import pytest
import torch
from torch.utils.data import DataLoader

import pimm_fn as pf
from pimm_fn.runtime.handlers import progress as progress_bar
from _sync_count import quiet_steps, reads_per_step
from _tiny_workload import TinyNet, build, dataset, negative_mse


def _hooks():
    return [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.best_on("score"), pf.log_every(5)]


def test_the_bar_shows_epoch_steps_rate_loss_and_metrics(tmp_path, capsys):
    """progress=True: tqdm's bar on stderr with the epoch, its steps of its length, it/s, the logged loss and the metric."""
    _, run = build(tmp_path, hooks=_hooks(), max_epochs=2, watching=pf.Watching(progress=True))
    assert repr(run.hooks.hooks[-1]) == "progress_bar()"
    run()
    err = capsys.readouterr().err
    assert re.search(r"epoch 0: 100%\|.*\| 5/5 \[", err)
    assert re.search(r"epoch 1: 100%\|.*\| 5/5 \[.*it/s, loss=\S+, lr=\S+, score=\S+\]", err)
    assert not run.ctx.bar.showing  # closed when training ended


def test_the_bar_counts_the_epoch_its_label_names(tmp_path, capsys):
    """Each draw labelled 'epoch e' counts e's steps of e's length: 10 steps in epochs of 4 are 4, 4 and 2 (max_steps)."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(dataset(), batch_size=10),
        max_steps=10,
        watching=pf.Watching(progress=True),
    )
    run()
    draws = re.findall(r"epoch (\d+):\s+\d+%\|[^|]*\| (\d+)/(\d+) ", capsys.readouterr().err)
    assert {(int(e), int(total)) for e, _, total in draws} == {(0, 4), (1, 4), (2, 2)}, draws
    assert all(int(n) <= int(total) for _, n, total in draws)
    assert ("2", "2", "2") in draws and ("0", "4", "4") in draws


def test_the_trace_and_the_weights_are_those_of_a_run_without_bar(tmp_path):
    """The bar's effects are executed but not traced: the trace equals the bar-less run's, and so its plan."""
    model, shown = build(tmp_path / "bar", hooks=_hooks(), max_epochs=2, watching=pf.Watching(progress=True))
    shown()
    plain_model, plain = build(tmp_path / "plain", hooks=_hooks(), max_epochs=2)
    plain()
    assert [(e.step, e.effect) for e in shown.trace] == [(e.step, e.effect) for e in plain.trace]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain_model.state_dict().values()))


def test_a_shown_bar_reads_no_tensor_on_quiet_steps(tmp_path):
    """The bar moves on these short epochs every step, yet the loop reads outputs only where log_every or an evaluation fires."""
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # Adam reads its step count
    run = pf.loop(
        model,
        optimizer,
        DataLoader(dataset(), batch_size=8),
        hooks=[pf.evaluate_every(7, negative_mse, name="val"), pf.log_every(10)],
        max_epochs=8,
        save_dir=tmp_path,
        watching=pf.Watching(console=False, progress=True),
    )
    reads = reads_per_step(run)
    quiet = quiet_steps(40, (7, 10), 5)
    assert quiet and {k: reads[k] for k in quiet} == dict.fromkeys(quiet, []) and reads[10]


def test_console_lines_are_written_above_the_bar_whole(tmp_path, capsys):
    """With the bar on, each console line reaches stdout whole (tqdm.write), none is cut by the bar."""
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(dataset(), batch_size=8),
        hooks=_hooks(),
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(progress=True),
    )
    run()
    out = capsys.readouterr().out.splitlines()
    assert out and all(line.startswith("[pimm_fn] ") for line in out)
    paced = re.compile(r"\[pimm_fn\] step 5 train: .* \(\d+\.\ds, \S+ ms/step, \S+ samples/s\)$")
    assert any(paced.match(line) for line in out)


def test_the_bar_is_off_where_nobody_watches_and_follows_the_argument(tmp_path, capsys):
    """None: on only with console and a terminal or notebook (captured output is neither); True/False force it."""
    assert progress_bar.wanted(None, console=True) is progress_bar.watched() is False
    assert progress_bar.wanted(True, console=False) and not progress_bar.wanted(False, console=True)
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(dataset(), batch_size=8),
        hooks=[pf.log_every(2)],
        max_epochs=1,
        watching=pf.Watching(console=True),
    )
    assert run.ctx.bar is None and "progress_bar" not in repr(run.hooks)


def test_an_error_closes_the_bar_and_the_continued_run_opens_it_again(tmp_path, capsys):
    """A step that raises closes the bar before the interruption line; run() goes on with a new bar to the end."""
    failing = {"left": 1}

    def evaluator(model):
        if failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("flaky evaluator")
        return negative_mse(model)

    _, run = build(
        tmp_path,
        hooks=[pf.evaluate_every(4, evaluator, name="val"), pf.log_every(2)],
        max_epochs=1,
        watching=pf.Watching(progress=True),
    )
    with pytest.raises(RuntimeError, match="flaky evaluator"):
        run()
    assert not run.ctx.bar.showing
    run()
    err = capsys.readouterr().err
    assert "4/5" in err and "5/5" in err and run.finished


def test_a_resume_without_the_bar_says_nothing_of_its_slot(tmp_path, capsys):
    """A checkpoint written with the bar resumes without it, and no 'dropped slot' line is said."""
    _, run = build(tmp_path, hooks=[pf.save_every(3)], max_epochs=1, watching=pf.Watching(progress=True))
    run.run(steps=3)
    run.ctx.close()
    _, resumed = build(
        tmp_path,
        hooks=[pf.save_every(3)],
        max_epochs=1,
        resume="auto",
        watching=pf.Watching(progress=False),
        console=True,
    )
    assert "dropped" not in capsys.readouterr().out and resumed.state.progress.global_step == 3
