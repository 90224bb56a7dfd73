"""Every file pimm_fn writes honours the umask: best weights, their JSON, exports and legacy files too (not 0600)."""

import os
import stat

import pytest
import torch

from pimm_fn.checkpoint import save_checkpoint, write_best
from pimm_fn.cli import OK, main


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    """The process umask set for the test (0644 or 0640 files), restored after."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_best_weights_export_and_checkpoints_get_the_modes_of_the_umask(tmp_path, umask):
    """model_best.pth/.json, an exported state dict, a legacy last.pth and a standard checkpoint's files are all
    0666 less the umask, like a file made with open()."""
    expected = 0o666 & ~umask
    write_best(tmp_path, {"w": torch.zeros(2)}, metric="m", value=1.0, step=1)
    write_best(tmp_path, {"w": torch.zeros(2)}, metric="acc", value=1.0, step=1, per_metric=True)
    save_checkpoint(
        tmp_path, step=1, weights={"w": torch.zeros(2)}, trainer={}, local={}, format="legacy", snapshot=True
    )
    save_checkpoint(tmp_path / "std", step=1, weights={"w": torch.zeros(2)}, trainer={}, local={})
    assert main(["export", str(tmp_path / "std"), str(tmp_path / "exported.pth")]) == OK
    with open(tmp_path / "plain.txt", "w"):
        pass
    files = [
        "model_best.pth",
        "model_best.json",
        "model_best_acc.pth",
        "model_best_acc.json",
        "last.pth",
        "iter_1.pth",
        "exported.pth",
        "plain.txt",
        "std/last/model.pth",
        "std/last/COMPLETE",
    ]
    assert {name: oct(_mode(tmp_path / name)) for name in files} == {name: oct(expected) for name in files}
    assert not list(tmp_path.glob(".staging-*"))


def test_a_replaced_best_file_gets_the_mode_of_the_umask_again(tmp_path, umask):
    """A second best replaces the first with a file of the umask's mode (a rename of a fresh temp file)."""
    write_best(tmp_path, {"w": torch.zeros(2)}, metric="m", value=1.0, step=1)
    write_best(tmp_path, {"w": torch.ones(2)}, metric="m", value=2.0, step=2)
    assert _mode(tmp_path / "model_best.pth") == _mode(tmp_path / "model_best.json") == 0o666 & ~umask
