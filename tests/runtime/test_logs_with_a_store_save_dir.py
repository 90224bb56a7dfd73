"""A save_dir on an object store keeps its logs local: a logger without a path says so, and a resume never reads one."""

import uuid

import pytest

import _tiny_workload as tw
import pimm_fn as pf
from pimm_fn.checkpoint import storage
from pimm_fn.core.effects import Log
from pimm_fn.core.state import Progress
from pimm_fn.runtime.handlers.logs import Logs


def _url() -> str:
    return f"memory://pimm-{uuid.uuid4().hex[:12]}/run"


@pytest.mark.parametrize("logger", [pf.TensorBoardLogger, pf.CSVLogger])
def test_a_logger_given_no_path_on_a_store_save_dir_says_logs_stay_local(logger):
    """TensorBoardLogger() with save_dir='memory://...': the error names the URL and asks for a local directory."""
    url = _url()
    with pytest.raises(
        ValueError,
        match=rf"save_dir is '{url}', on an object store, and log files stay local .*"
        rf"pass the logger a local directory, e.g. {logger.__name__}\(",
    ):
        tw.build(url, hooks=[pf.save_every(2)], loggers=[logger()])


def test_a_hand_built_logs_with_a_store_save_dir_resumes_without_a_log_file():
    """Logs(save_dir=<a store>) started as a resume: no log.jsonl is looked for, and records still reach history."""
    logs = Logs((), save_dir=storage.location(_url()), say=lambda line: None)
    logs.start(Progress(global_step=4, iters_per_epoch=5, max_epochs=2), resumed=True)
    logs.write(Log(5, "train", {"loss": 0.5}))
    assert logs.save_dir is None and len(logs.history) == 1
