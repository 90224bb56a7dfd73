"""Preemption's loose ends: the stop line names the checkpoint written; a clock hook swapped in hears the clock."""

import uuid

import pytest

import _preemption_workload as pw
import _tiny_workload as tw
import pimm_fn as pf
from pimm_fn.checkpoint import storage
from pimm_fn.core.effects import SaveCheckpoint


def test_on_a_store_the_stop_line_names_the_checkpoint_written(capsys):
    """save_dir=memory://...: Preempted.path and the line are model/last-<step>-<token>, which exists, committed."""
    url = f"memory://pimm-{uuid.uuid4().hex[:12]}/run"
    model, run = tw.build(url, hooks=[pf.save_every(100)], max_epochs=2, console=True)
    pw.signal_at_forward(model, 3)
    with pytest.raises(pf.Preempted) as caught:
        run()
    path = caught.value.path
    assert storage.is_store(path) and path.name.startswith("last-3-"), path
    assert (path / "COMPLETE").exists()
    line = [x for x in capsys.readouterr().out.splitlines() if "SIGTERM: saved step 3 to " in x]
    assert line and str(path) in line[0], line


def test_on_a_file_system_the_stop_line_names_last(tmp_path):
    """A local save_dir: the path is model/last, as before."""
    model, run = tw.build(tmp_path, hooks=[pf.save_every(100)], max_epochs=2)
    pw.signal_at_forward(model, 2)
    with pytest.raises(pf.Preempted) as caught:
        run()
    assert caught.value.path == tmp_path / "model" / "last"


def test_a_save_every_minutes_swapped_in_by_replace_gets_the_clock(tmp_path):
    """A run built with no clock hook, then replace() adds save_every(minutes=...): it saves on time from then on."""
    _, run = tw.build(tmp_path, hooks=[pf.save_every(100)], max_epochs=2)
    run.run(steps=2)
    run.replace("save_every(100)", pf.save_every(100, minutes=1e-6))  # due at the next clock reading
    run.run(steps=2)
    saved = [entry.effect.step for entry in run.trace if isinstance(entry.effect, SaveCheckpoint)]
    assert saved and saved[0] == 3, saved
