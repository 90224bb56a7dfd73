"""A damaged log.jsonl never blocks a resume: its damaged lines are set aside, counted, and the good ones kept."""

import json

import pimm_fn as pf
from pimm_fn.runtime.logs.history import History
from _tiny_workload import build

_HOOKS = lambda: [pf.save_every(4), pf.log_every(1)]  # noqa: E731 - a fresh list per run


def _logged(tmp_path, steps=6) -> list:
    """A real run's log.jsonl lines (bytes, newline included) after ``steps`` steps; its checkpoint is step 4."""
    _, run = build(tmp_path, hooks=_HOOKS(), max_epochs=2)
    run.run(steps=steps)
    run.ctx.close()
    return (tmp_path / "log.jsonl").read_bytes().splitlines(keepends=True)


def _damage(tmp_path) -> tuple:
    """log.jsonl with a non-UTF-8 line (2), half a JSON line (4) and its last line cut: (good, damaged, count)."""
    good = _logged(tmp_path)  # steps 1..6 (step 5 ends the epoch: a train and an epoch record)
    bad = [b"\xff\xfe\x00 not text\n", good[2][: len(good[2]) // 2] + b"\n", good[-1][:-9]]
    lines = [good[0], bad[0], good[1], bad[1], *good[2:-1], bad[2]]
    (tmp_path / "log.jsonl").write_bytes(b"".join(lines))
    return good[:-1], [line.rstrip(b"\n") + b"\n" for line in bad], len(lines)


def test_a_resume_sets_damaged_lines_aside_and_keeps_the_good_records_in_order(tmp_path, capsys):
    """Non-UTF-8 bytes, a half line in the middle and a cut last line: the resume goes on, saying so once."""
    good, damaged, count = _damage(tmp_path)
    capsys.readouterr()
    _, resumed = build(tmp_path, hooks=_HOOKS(), max_epochs=2, resume="auto", console=True)
    upto_4 = [line for line in good if json.loads(line)["step"] <= 4]
    assert (tmp_path / "log.jsonl").read_bytes() == b"".join(upto_4)
    assert (tmp_path / "log.jsonl.damaged").read_bytes() == b"".join(damaged)
    said = [line for line in capsys.readouterr().out.splitlines() if "log.jsonl:" in line]
    past = len(good) - len(upto_4)  # the good records past step 4; the damaged ones are not among them
    assert said == [  # one line for the damaged ones, one for those past the checkpoint
        f"[pimm_fn] log.jsonl: 3 lines (2, 4, {count}) damaged (not UTF-8, not a JSON record, or cut short): moved "
        "as they were to log.jsonl.damaged; the good records are kept in order",
        f"[pimm_fn] log.jsonl: dropped {past} record(s) after step 4, where the run resumed",
    ]
    assert [(r["step"], r["kind"]) for r in resumed.history.records()] == [
        (json.loads(line)["step"], json.loads(line)["kind"]) for line in upto_4
    ]
    resumed()  # and the log goes on from there
    steps = [json.loads(line)["step"] for line in (tmp_path / "log.jsonl").read_bytes().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10]


def test_a_later_resume_appends_to_the_damaged_file(tmp_path):
    """An earlier resume's damaged lines stay in log.jsonl.damaged; the new ones are added after them."""
    (tmp_path / "log.jsonl.damaged").write_bytes(b"an earlier one\n")
    _, damaged, _ = _damage(tmp_path)
    build(tmp_path, hooks=_HOOKS(), max_epochs=2, resume="auto")
    assert (tmp_path / "log.jsonl.damaged").read_bytes() == b"an earlier one\n" + b"".join(damaged)


def test_a_cut_last_line_alone_is_set_aside_not_counted_as_a_later_step(tmp_path, capsys):
    """A kill mid-write leaves half a line: it is set aside and counted as damaged; no record is dropped with it."""
    good = _logged(tmp_path, steps=4)
    (tmp_path / "log.jsonl").write_bytes(b"".join(good) + b'{"step": 5, "ki')
    capsys.readouterr()
    _, resumed = build(tmp_path, hooks=_HOOKS(), max_epochs=2, resume="auto", console=True)
    said = capsys.readouterr().out
    assert f"log.jsonl: 1 line ({len(good) + 1}) damaged" in said and "dropped" not in said
    assert (tmp_path / "log.jsonl").read_bytes() == b"".join(good) and len(resumed.history) == len(good)
    assert (tmp_path / "log.jsonl.damaged").read_bytes() == b'{"step": 5, "ki\n'


def test_reading_a_damaged_log_keeps_the_good_records_and_writes_nothing(tmp_path):
    """History.from_jsonl (run.history of a finished run) skips damaged lines and leaves the file as it was."""
    good, _, _ = _damage(tmp_path)
    before = (tmp_path / "log.jsonl").read_bytes()
    history = History.from_jsonl(tmp_path / "log.jsonl")
    assert [r["step"] for r in history.records()] == [json.loads(line)["step"] for line in good]
    assert (tmp_path / "log.jsonl").read_bytes() == before and not (tmp_path / "log.jsonl.damaged").exists()


def test_a_complete_last_line_without_its_newline_is_not_glued_to_the_next(tmp_path):
    """A last record whose newline was never written is kept, and the resumed run's first record starts a new line."""
    good = _logged(tmp_path, steps=4)
    (tmp_path / "log.jsonl").write_bytes(b"".join(good).rstrip(b"\n"))
    _, resumed = build(tmp_path, hooks=_HOOKS(), max_epochs=2, resume="auto")
    resumed.run(steps=1)
    lines = (tmp_path / "log.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4, 5, 5]


def test_many_damaged_lines_are_counted_in_one_message_naming_the_first_few(tmp_path):
    """Seven damaged lines among good ones: one message, all seven counted, the first five line numbers named."""
    from pimm_fn.runtime.logs.loggers import keep_upto

    good = [b'{"step": %d, "kind": "train", "loss": 0.5}\n' % n for n in range(1, 4)]
    lines = good[:1] + [b"\xff%d\n" % n for n in range(7)] + good[1:]
    (tmp_path / "log.jsonl").write_bytes(b"".join(lines))
    said = []
    keep_upto(tmp_path / "log.jsonl", 2, said.append)
    assert said == [
        "log.jsonl: 7 lines (2, 3, 4, 5, 6, ...) damaged (not UTF-8, not a JSON record, or cut short): moved as they "
        "were to log.jsonl.damaged; the good records are kept in order",
        "log.jsonl: dropped 1 record(s) after step 2, where the run resumed",
    ]
    assert (tmp_path / "log.jsonl").read_bytes() == b"".join(good[:2])
    assert (tmp_path / "log.jsonl.damaged").read_bytes() == b"".join(lines[1:8])
