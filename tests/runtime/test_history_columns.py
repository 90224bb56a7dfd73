"""run.history stored as columns: a logged step costs bytes, values read back as logged, plot's two axes."""

import math
import tracemalloc

import matplotlib
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pimm_fn as pf
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.runtime.logs.history import History
from _tiny_workload import build

matplotlib.use("Agg")


def test_a_step_logged_every_step_holds_under_50_bytes():
    """20 000 training records as log_every(1) writes them (epoch, iter, of, loss, lr) hold < 50 bytes each."""
    steps = 20_000
    tracemalloc.start()
    try:
        history = History()
        before = tracemalloc.get_traced_memory()[0]
        for step in range(1, steps + 1):
            values = {"epoch": step // 1000, "iter": step % 1000, "of": 1000, "loss": 1 / step, "lr": 0.1 / step}
            history.append(step, "train", FrozenMap(values))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(history) == steps and held / steps < 50, f"{held / steps:.1f} bytes a step"


def test_every_value_reads_back_as_the_type_it_was_logged_as():
    """Ints of any size, floats (NaN and inf too), strings, bools, None and objects come back equal and alike."""
    logged = [
        (1, "train", {"i": 1, "f": 0.5, "s": "rank 0", "b": True, "n": None, "t": (1, 2)}),
        (2, "train", {"i": 300, "f": math.inf, "s": "rank 0", "b": False, "n": None, "t": (3,)}),
        (3, "train", {"i": 2**40, "f": -0.0, "s": "mean of 2 ranks", "b": True, "n": None, "t": ()}),
        (4, "train", {"i": 2**70, "f": 1, "s": 5, "b": 1, "n": 0.5, "t": "x"}),  # every column turns mixed
    ]
    records = History(logged).records()
    assert records == [{"step": s, "kind": k, **v} for s, k, v in logged]
    for record, (_, _, values) in zip(records, logged):
        assert {n: type(x) for n, x in record.items() if n in values} == {n: type(x) for n, x in values.items()}
    nan = History([(1, "train", {"loss": math.nan})]).records()[0]["loss"]
    assert math.isnan(nan)


_VALUES = st.one_of(
    st.integers(),
    st.integers(-300, 300),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.booleans(),
    st.none(),
    st.just(math.inf),
)
_RECORDS = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        st.sampled_from(["train", "epoch", "eval/a"]),
        st.dictionaries(st.sampled_from("abcd"), _VALUES, max_size=4),
    ),
    max_size=30,
)


@given(_RECORDS)
def test_any_records_read_back_as_logged_in_order(logged):
    """Whatever the values (types changing between records, names coming and going), records() gives them back."""
    history = History(logged)
    records = history.records()
    assert records == [{"step": s, "kind": k, **v} for s, k, v in logged]
    assert [{n: type(x) for n, x in r.items()} for r in records] == [
        {"step": int, "kind": str, **{n: type(x) for n, x in v.items()}} for _, _, v in logged
    ]
    for kind in history.kinds:
        chosen = [(s, v) for s, k, v in logged if k == kind]
        columns = history.columns(kind)
        assert columns["step"] == [s for s, _ in chosen]
        assert all(columns[n] == [v.get(n) for _, v in chosen] for n in columns if n != "step")


def test_a_missing_value_stays_apart_from_a_logged_nan():
    """A record lacking a name leaves it out of records() and None in columns(); a logged NaN stays NaN."""
    history = History([(1, "train", {"loss": math.nan}), (2, "train", {"acc": 0.5}), (3, "train", {"loss": 1.0})])
    assert [sorted(r) for r in history.records()] == [
        ["kind", "loss", "step"],
        ["acc", "kind", "step"],
        ["kind", "loss", "step"],
    ]
    columns = history.columns("train")
    assert math.isnan(columns["loss"][0]) and columns["loss"][1:] == [None, 1.0]
    assert columns["acc"] == [None, 0.5, None]


def test_records_keep_their_order_across_kinds():
    """records() interleaves the kinds in the order they were logged; records(kind) keeps that kind's order."""
    logged = [
        (1, "train", {"loss": 1.0}),
        (1, "eval/a", {"m": 1}),
        (2, "train", {"loss": 0.5}),
        (2, "eval/b", {"m": 2}),
        (2, "eval/a", {"m": 3}),
        (2, "epoch", {"loss": 0.75}),
    ]
    history = History(logged)
    assert [(r["step"], r["kind"]) for r in history.records()] == [(s, k) for s, k, _ in logged]
    assert [r["m"] for r in history.records("eval")] == [1, 2, 3]
    assert history.columns("eval") == {"step": [1, 2, 2], "kind": ["eval/a", "eval/b", "eval/a"], "m": [1, 2, 3]}


def test_plot_labels_the_y_axis_and_puts_a_second_key_on_its_own_axis():
    """plot() names its y-axis; plot('loss', 'lr') draws lr on a twin y-axis labelled 'lr', one legend for both."""
    history = History([(s, "train", {"loss": 10.0 / s, "lr": 1e-4 * s}) for s in range(1, 6)])
    ax = history.plot()
    assert ax.get_ylabel() == "loss" and len(ax.figure.axes) == 1
    ax = history.plot("loss", "lr")
    left, right = ax.figure.axes
    assert left is ax and [line.get_label() for line in ax.get_lines()] == ["loss (train)"]
    assert [line.get_label() for line in right.get_lines()] == ["lr (train)"]
    assert (ax.get_ylabel(), right.get_ylabel()) == ("loss", "lr")
    assert right.get_ylim()[1] < 1e-3 < ax.get_ylim()[1]  # lr on its own scale, not flat on the loss axis
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss (train)", "lr (train)"]


def test_a_run_logging_every_step_fills_the_columns(tmp_path):
    """A real run with log_every(1): one train row a step, the train columns as the step outputs came."""
    _, run = build(tmp_path, hooks=[pf.log_every(1)], max_epochs=1)
    run()
    columns = run.history.columns("train")
    steps = run.state.progress.global_step
    assert columns["step"] == list(range(1, steps + 1)) and len(columns["loss"]) == steps
    assert all(isinstance(x, float) for x in columns["loss"]) and run.history.kinds == ("train", "epoch")
    with pytest.raises(KeyError, match="no \\['nothing'\\]"):
        run.history.plot("nothing")
