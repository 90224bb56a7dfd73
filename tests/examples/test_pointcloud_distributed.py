"""The evaluator in a real 2-process gloo group equals the whole-set result."""

import json
import multiprocessing
import socket

import pytest
import torch

from _pointcloud_workers import evaluate_shard
from pointcloud import Evaluator, PointSegNet, SyntheticScenes

TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("num_val", [7])  # uneven shards: 4 and 3 scenes
def test_sharded_evaluation_all_reduces_to_whole_set_metrics(tmp_path, num_val):
    """Each rank returns the single-process metrics of the whole validation set."""
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=evaluate_shard, args=(r, 2, port, num_val, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join()
    assert not hung, f"{len(hung)} rank(s) still running after {TIMEOUT_S}s"
    assert [p.exitcode for p in procs] == [0, 0]

    torch.manual_seed(0)
    model = PointSegNet(width=16, k=4)
    whole = Evaluator(SyntheticScenes(num_val, num_points=64, split="val", seed=2), 2)(model)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["mIoU"] == whole["mIoU"]
        assert got["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-6)
