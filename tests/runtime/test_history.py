"""run.history: the logged records as columns, kept beside the state, continuous across a resume."""

import json
import math
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.runtime.logs.history import History, read_jsonl
from _tiny_workload import TinyNet, build, loader, negative_mse

RECORDS = [
    (2, "train", {"epoch": 0, "iter": 2, "of": 4, "loss": 0.5}),
    (4, "train", {"epoch": 0, "iter": 4, "of": 4, "loss": 0.25, "lr": 0.1}),
    (4, "epoch", {"epoch": 0, "loss": 0.375}),
    (4, "eval/val", {"score": 0.7}),
    (4, "eval/test", {"score": 0.6, "acc": 0.9}),
]


def test_columns_hold_one_list_per_name_with_none_where_a_record_lacks_it():
    """columns(kind) has 'step' first, then every name in first-seen order, None for a missing value."""
    columns = History(RECORDS).columns("train")
    assert columns == {
        "step": [2, 4],
        "epoch": [0, 0],
        "iter": [2, 4],
        "of": [4, 4],
        "loss": [0.5, 0.25],
        "lr": [None, 0.1],
    }


def test_a_kind_names_its_family_with_a_kind_column():
    """'eval' takes every eval/<name> record, saying which in a 'kind' column."""
    columns = History(RECORDS).columns("eval")
    assert columns == {"step": [4, 4], "kind": ["eval/val", "eval/test"], "score": [0.7, 0.6], "acc": [None, 0.9]}
    assert History(RECORDS).columns("nothing") == {"step": []}


def test_repr_is_one_short_line_and_len_counts_records():
    """The repr names the kinds, their counts and their values, not every number."""
    history = History(RECORDS)
    assert len(history) == 5 and history.kinds == ("train", "epoch", "eval/val", "eval/test")
    assert repr(history) == (
        "History(5 records, steps 2-4: train x2 (loss, lr), epoch x1 (loss), "
        "eval/val x1 (score), eval/test x1 (score, acc))"
    )
    assert repr(History()) == "History(0 records)"


def test_to_pandas_gives_a_frame_of_the_columns():
    """to_pandas(kind) is a DataFrame with the same columns, NaN where missing."""
    pytest.importorskip("pandas")
    frame = History(RECORDS).to_pandas()
    assert list(frame.columns) == ["step", "epoch", "iter", "of", "loss", "lr"]
    assert frame["loss"].tolist() == [0.5, 0.25] and math.isnan(frame["lr"][0])


def test_plot_draws_one_line_per_kind_holding_the_key():
    """plot() draws the loss of the train and epoch records; plot('score') each evaluation; Axes returned."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    history = History(RECORDS)
    ax = history.plot()
    assert sorted(line.get_label() for line in ax.get_lines()) == ["loss (epoch)", "loss (train)"]
    ax = history.plot("score", kind="eval")
    assert [line.get_label() for line in ax.get_lines()] == ["score (eval/val)", "score (eval/test)"]
    assert ax.get_xlabel() == "step"
    with pytest.raises(KeyError, match="no \\['mIoU'\\].*logged"):
        history.plot("mIoU")


def test_a_missing_extra_is_named_in_the_error(monkeypatch):
    """Without pandas (or matplotlib) the error says which extra to install."""
    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install 'pimm_fn\[pandas\]'"):
        History(RECORDS).to_pandas()
    with pytest.raises(ImportError, match=r"pip install 'pimm_fn\[plot\]'"):
        History(RECORDS).plot()


def test_read_jsonl_restores_non_finite_values_and_skips_a_cut_line(tmp_path):
    """'nan'/'inf' strings become floats again; a last line cut by a kill is left out."""
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"step": 1, "kind": "train", "loss": "nan"}\n{"step": 2, "kind": "train", "loss": "-inf"}\n'
        '{"step": 3, "kind": "tr'
    )
    records = read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2] and math.isnan(records[0]["values"]["loss"])
    assert records[1]["values"]["loss"] == -math.inf
    assert len(History.from_jsonl(path, upto=1)) == 1 and len(History.from_jsonl(tmp_path / "none.jsonl")) == 0


def test_read_jsonl_skips_a_line_nested_too_deeply_to_parse(tmp_path):
    """A damaged or crafted line of 100,000 brackets is skipped like any line that is no record."""
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1, "kind": "train", "loss": 0.5}\n' + '{"step": 2, "values": ' + "[" * 100000 + "\n")
    assert [r["step"] for r in read_jsonl(path)] == [1]


def _hooks():
    return [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(3), pf.log_every(1)]


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_history_equals_the_jsonl_and_stays_out_of_the_state(tmp_path):
    """Each record the run logs is in run.history and in log.jsonl alike; the State holds none of it."""
    _, run = build(tmp_path, hooks=_hooks(), max_epochs=2)
    run()
    from_file = [(r.pop("step"), r.pop("kind"), r) for r in _records(tmp_path / "log.jsonl")]
    assert [
        (r["step"], r["kind"], {k: v for k, v in r.items() if k not in ("step", "kind")}) for r in run.history.records()
    ] == from_file
    assert len(run.history) == 10 + 2 + 2 and "History" not in repr(run.state)


def test_a_resumed_run_continues_the_history_without_repeating_a_step(tmp_path):
    """Records past the checkpoint are dropped from log.jsonl; the resumed history equals an uninterrupted one."""
    _, whole = build(tmp_path / "whole", hooks=_hooks(), max_epochs=2)
    whole()
    _, first = build(tmp_path / "run", hooks=_hooks(), max_epochs=2)
    first.run(steps=8)  # the last checkpoint is step 6: steps 7 and 8 were logged past it
    first.ctx.close()
    _, resumed = build(tmp_path / "run", hooks=_hooks(), max_epochs=2, resume="auto")
    assert [r["step"] for r in resumed.history.records()][-1] == 6
    assert max(r["step"] for r in _records(tmp_path / "run" / "log.jsonl")) == 6
    resumed()
    assert resumed.history.records() == whole.history.records()
    assert _records(tmp_path / "run" / "log.jsonl") == _records(tmp_path / "whole" / "log.jsonl")


def test_a_fresh_run_sets_an_earlier_log_aside(tmp_path, capsys):
    """A fresh run into a save_dir holding a log.jsonl (no checkpoint) keeps it as log.1.jsonl and starts anew."""
    _, first = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=1)
    first()
    model = TinyNet()
    second = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        loader(),
        hooks=[pf.log_every(5)],
        max_epochs=1,
        save_dir=tmp_path,
        watching=pf.Watching(progress=False),
    )
    second()
    assert [r["step"] for r in _records(tmp_path / "log.1.jsonl")] == [2, 4, 5]
    assert [(r["step"], r["kind"]) for r in _records(tmp_path / "log.jsonl")] == [(5, "train"), (5, "epoch")]
    assert len(second.history) == 2 and "log.jsonl is kept as log.1.jsonl" in capsys.readouterr().out
