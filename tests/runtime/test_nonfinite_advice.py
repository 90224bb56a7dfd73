"""A NaN loss's interruption line gives advice that works: not "run() continues exactly", which raises again."""

import warnings

import pytest
import torch

import pimm_fn as pf
from _tiny_workload import NaNAt, loader


def _run(model, save_dir, **kwargs):
    return pf.loop(model, torch.optim.SGD(model.parameters(), lr=0.01), loader("plain", 8),
                   hooks=[pf.save_every(2), pf.log_every(1)], max_epochs=2, save_dir=save_dir,
                   watching=pf.Watching(progress=False), **kwargs)


def test_the_nan_interruption_line_says_what_works_and_following_it_finishes(tmp_path, capsys):
    """The line says run() would raise again (it does) and to resume with skip or a lower lr; doing so trains on."""
    torch.manual_seed(0)
    run = _run(NaNAt(5), tmp_path)
    with pytest.raises(pf.NonFiniteLossError, match="global step 5 .*resume='auto'"):
        run()
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "interrupted at step" in line]
    assert "continues exactly" not in line and "run() would raise this again" in line, line
    assert "resume='auto'" in line and "on_nonfinite='skip'" in line and "lower lr" in line
    assert str(run.interrupted) in line
    with pytest.raises(pf.NonFiniteLossError, match="global step 5 "):
        run()  # as the line says: continuing raises again
    run.ctx.close()

    resumed = _run(NaNAt(1), tmp_path, resume="auto", training=pf.Training(on_nonfinite="skip"))
    assert resumed.state.progress.global_step == 4  # the last checkpoint, before the NaN
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        resumed()
    assert any(issubclass(w.category, pf.NonFiniteLossWarning) for w in said)
    assert resumed.state.finished and all(torch.isfinite(p).all() for p in resumed.ctx.model.parameters())
