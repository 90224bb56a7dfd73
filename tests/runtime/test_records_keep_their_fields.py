"""A log record keeps its own fields: no metric or output overwrites its step, kind or position, none is lost."""

import json

import pytest

import pimm_fn as pf
from pimm_fn.core.effects import Log
from _tiny_workload import build


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", ["step", "kind", "epoch"])
def test_an_evaluator_metric_named_like_a_record_field_is_refused_at_the_evaluation(tmp_path, name):
    """A metric named step, kind or epoch stops the run at that evaluation, naming evaluator, metric and fix."""
    hooks = [pf.evaluate_every(2, lambda model: {name: 123.0, "acc": 0.5}, name="val"), pf.log_every(1)]
    _, run = build(tmp_path, hooks=hooks, max_epochs=1)
    fix = rf"evaluator 'val' returned metric '{name}'.*rename it \(e\.g\. 'val_{name}'\)"
    with pytest.raises(ValueError, match=fix):
        run()
    lines = _lines(tmp_path / "log.jsonl")
    # Step 2's own record runs first (a record); the refused evaluation's is never written.
    assert [(line["step"], line["kind"]) for line in lines] == [(1, "train"), (2, "train")]


def test_metric_names_alike_once_written_are_refused(tmp_path):
    """{1: a, "1": b} would keep one value under "1": the evaluation is refused, naming both."""
    hooks = [pf.evaluate_every(2, lambda model: {1: 0.1, "1": 0.2}, name="val"), pf.log_every(1)]
    _, run = build(tmp_path, hooks=hooks, max_epochs=1)
    with pytest.raises(ValueError, match=r"evaluator 'val' returned metric 1 and '1', which are one name once written"):
        run()


def _step_returning(extra):
    def step_fn(model, optimizer, batch, scheduler=None, scaler=None):
        loss = model(batch)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach(), **extra}

    return step_fn


@pytest.mark.parametrize(
    "outputs, message",
    [
        ({"epoch": 7.0}, r"log_every: the train step returned output 'epoch'.*rename it \(e\.g\. 'train_epoch'\)"),
        ({"step": 7.0}, r"log_every: the train step returned output 'step'"),
        ({1: 0.5, "1": 0.25}, r"log_every: the train step returned output 1 and '1', which are one name once written"),
    ],
)
def test_a_train_output_that_would_overwrite_or_lose_a_field_is_refused(tmp_path, outputs, message):
    """A step output named like a record's position or own field, or two alike, is refused where it is logged."""
    _, run = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=1, step_fn=_step_returning(outputs))
    with pytest.raises(ValueError, match=message):
        run()


def test_no_log_record_holds_a_value_under_its_own_fields():
    """A Log built by any hook refuses a value named step or kind, or two names alike, at construction."""
    for values in ({"step": 1.0}, {"kind": "x"}, {1: 0.5, "1": 0.5}):
        with pytest.raises(ValueError, match=r"Log\(3, 'custom'\) holds value"):
            Log(3, "custom", values)
    assert Log(3, "custom", {"epoch": 1, "loss": 0.5}).values["epoch"] == 1  # a position is the hooks' to set


def test_a_resume_keeps_all_four_evaluation_records(tmp_path):
    """With the metric renamed as the error says, 4 evaluations logged before a resume are all kept, at their steps."""
    step = iter(range(2, 100, 2))
    hooks = lambda: [
        pf.evaluate_every(2, lambda model: {"val_step": float(next(step)) * 1000}, name="val"),
        pf.save_every(8),
        pf.log_every(100),
    ]
    _, first = build(tmp_path, hooks=hooks(), max_epochs=2)
    first.run(steps=9)  # evaluations at 2, 4, 6, 8; the checkpoint is step 8
    first.ctx.close()
    _, resumed = build(tmp_path, hooks=hooks(), max_epochs=2, resume="auto")
    evaluations = [(r["step"], r["kind"]) for r in resumed.history.records("eval")]
    assert evaluations == [(2, "eval/val"), (4, "eval/val"), (6, "eval/val"), (8, "eval/val")]
    lines = [line for line in _lines(tmp_path / "log.jsonl") if line["kind"] == "eval/val"]
    assert [(line["step"], line["val_step"]) for line in lines] == [(2, 2000.0), (4, 4000.0), (6, 6000.0), (8, 8000.0)]
    resumed()
    assert [r["step"] for r in resumed.history.records("eval")] == [2, 4, 6, 8, 10]
