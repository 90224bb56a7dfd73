"""A custom ``Log`` handler changes how a record is shown, not whether the run keeps it."""

import json

import pimm_fn as pf
from pimm_fn.core.effects import Log
from pimm_fn.runtime.handlers import dispatch as handlers

from _tiny_workload import build


class Shown:
    """A Log handler of a user's: it keeps what it is handed, and has a close()."""

    def __init__(self, then_default=False):
        self.records, self.closed, self.then_default = [], 0, then_default

    def __call__(self, effect, state, ctx):
        self.records.append((effect.step, effect.kind))
        return handlers.log(effect, state, ctx) if self.then_default else ()

    def close(self):
        self.closed += 1


def _keys(records) -> list:
    return [(r["step"], r["kind"]) for r in records]


def test_a_custom_log_handler_sees_every_record_and_the_history_and_log_file_still_keep_them(tmp_path, capsys):
    """handlers={Log: show}: show gets each record, run.history and log.jsonl hold each once, no console line."""
    _, reference = build(tmp_path / "ref", hooks=[pf.log_every(2)], max_epochs=2)
    reference()
    show = Shown()
    _, run = build(tmp_path / "run", hooks=[pf.log_every(2)], max_epochs=2, handlers={Log: show}, console=True)
    capsys.readouterr()
    run()
    expected = _keys(reference.history.records())
    assert expected and show.records == expected and _keys(run.history.records()) == expected
    lines = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert _keys(lines) == expected and show.closed >= 1
    assert "train:" not in capsys.readouterr().out  # the handler replaced the console line


def test_a_custom_log_handler_calling_the_default_keeps_each_record_once(tmp_path):
    """A handler that wraps the default one: the records are kept by that call, not a second time."""
    show = Shown(then_default=True)
    _, run = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=2, handlers={Log: show})
    run()
    assert _keys(run.history.records()) == show.records != []
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == len(show.records)
