"""``python -m pimm_fn ls / inspect / verify / export`` on a save_dir on S3 (moto's server on loopback)."""

import json
import pathlib
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn.checkpoint import storage
from pimm_fn.cli import main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _s3  # noqa: E402


@pytest.fixture(scope="module")
def run_url():
    """A save_dir on S3 with two checkpoints, a snapshot, a best model and a half-written save."""
    with _s3.s3_server():
        url = f"s3://{_s3.new_bucket()}/run"
        for step in (1, 2):
            pf.checkpoint.save_checkpoint(
                url + "/model",
                step=step,
                weights={"w": torch.arange(3.0) + step},
                trainer={"lr": 0.1},
                local={},
                snapshot=True,
                digests=True,
            )
        pf.checkpoint.write_best(url + "/model", {"w": torch.ones(3)}, metric="acc", value=0.5, step=2)
        (storage.location(url) / "model" / "last-9-0123abcd" / "model.pth").write_bytes(b"half")  # no marker
        yield url


def _json(capsys, argv) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_ls_lists_committed_checkpoints_and_the_unfinished_save(run_url, capsys):
    code, listing = _json(capsys, ["ls", run_url])
    assert code == 0
    status = {e["name"]: e["status"] for e in listing["entries"]}
    assert listing["model_dir"] == run_url + "/model"
    assert status["iter_1"] == status["iter_2"] == "complete" and status["last-9-0123abcd"] == "unfinished"
    assert [n for n in status if n.startswith("last-2-")] and "model_best.pth" in status


def test_inspect_and_verify_read_the_store(run_url, capsys):
    code, described = _json(capsys, ["inspect", run_url])
    assert code == 0 and described["step"] == 2 and described["path"].startswith(run_url + "/model/last-2-")
    code, verified = _json(capsys, ["verify", run_url])
    assert code == 0 and verified["ok"]
    statuses = {e["name"]: e["status"] for e in verified["entries"]}
    assert statuses["iter_1"] == statuses["iter_2"] == "ok" and statuses["last-9-0123abcd"] == "note"


def test_verify_finds_changed_bytes_on_the_store(run_url, capsys):
    target = storage.location(run_url) / "model" / "iter_1" / "model.pth"
    original = target.read_bytes()
    target.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit changed
    try:
        code, verified = _json(capsys, ["verify", run_url + "/model/iter_1"])
        assert code == 1 and "SHA-256" in json.dumps(verified)
    finally:
        target.write_bytes(original)


def test_export_from_a_url_writes_a_local_file(run_url, tmp_path, capsys):
    out = tmp_path / "w.pth"
    assert main(["export", run_url, str(out)]) == 0
    assert torch.equal(torch.load(out, weights_only=True)["w"], torch.arange(3.0) + 2)
    assert main(["export", run_url, "s3://bucket/w.pth"]) == 2  # OUT on a store: refused, nothing written
    assert main(["ls", "nosuchstore://bucket/run"]) == 2
    assert "no storage protocol" in capsys.readouterr().err
