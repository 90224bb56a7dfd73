"""A Ctrl-C that lands inside DCP's write is an interruption, not a storage failure."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from pimm_fn.checkpoint.errors import CheckpointStorageError, storage_errors


class _CtrlCWriter(dcp.FileSystemWriter):
    """A real DCP writer whose data write is stopped by a Ctrl-C, as a SIGINT landing there would."""

    def write_data(self, plan, planner):
        raise KeyboardInterrupt


class _BrokenWriter(dcp.FileSystemWriter):
    def write_data(self, plan, planner):
        raise RuntimeError("the disk went away")


def _save(directory, writer):
    with storage_errors(directory, 0, "the trainer state", "nothing was published"):
        dcp.save({"w": torch.ones(3)}, storage_writer=writer(directory), no_dist=True)


def test_a_ctrl_c_inside_dcps_write_arrives_as_keyboard_interrupt(tmp_path):
    """DCP hands the Ctrl-C back wrapped as a rank failure; the caller sees the KeyboardInterrupt it was."""
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, _CtrlCWriter)


def test_another_failure_inside_dcps_write_is_still_a_storage_error(tmp_path):
    with pytest.raises(CheckpointStorageError, match="the disk went away"):
        _save(tmp_path, _BrokenWriter)
