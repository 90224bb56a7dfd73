"""The demo refuses to start afresh over an earlier run, advising its own --resume flag."""

import pytest
import torch

from test_train_pointcloud_script import TINY, _script


def test_a_fresh_start_over_an_earlier_run_advises_the_scripts_resume_flag(tmp_path):
    """A second run into the same --save-dir without --resume exits naming --resume, not loop()'s resume='auto'."""
    script = _script()
    torch.manual_seed(0)
    args = TINY + ["--save-dir", str(tmp_path / "run"), "--epochs", "1"]
    script.train(script.parse_args(args))
    with pytest.raises(SystemExit) as exited:
        script.train(script.parse_args(args))
    message = str(exited.value.code)
    assert "pass --resume to continue it" in message and "resume='auto'" not in message, message
    assert isinstance(exited.value.__cause__, FileExistsError)
    assert script.train(script.parse_args(args + ["--resume"])).progress.completed_epochs == 1  # as advised
