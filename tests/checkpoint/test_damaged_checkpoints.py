"""A damaged checkpoint is skipped by resume='auto' (one line each) and named by resume=<path>, never loaded.

One tiny run is saved once; each case copies it, damages one file of
``last/`` and only resumes. Every file of a checkpoint is damaged in five
ways; the two-rank version lives in ``tests/distributed``.
"""

import hashlib
import json
import pathlib
import pickle
import shutil
import sys

import pytest
import torch

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.checkpoint import CheckpointError
from pimm_fn.checkpoint import validation

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
import _tiny_workload as tw  # noqa: E402
from _disk_faults import damage, hashes  # noqa: E402
from _process_group import one_rank_group  # noqa: E402, F401 - a fixture

FILES = ["COMPLETE", "model.pth", "trainer/.metadata", "trainer/__0_0.distcp", "receipts/rank0"]
DAMAGES = ["truncate", "empty", "zeros", "garbage", "delete"]
HARMLESS = {"receipts/rank0"}  # proof of where a rank wrote: loading never reads it


hooks = tw.snapshotting


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A finished 10-step run: last/ (step 10), iter_4, iter_8, iter_10, and its final weights."""
    root = tmp_path_factory.mktemp("saved")
    return root / "run", tw.finished(root / "run")


def resumed(run_dir, resume):
    """The run rebuilt from ``resume``, with a budget left, its console on: skipped checkpoints are said there."""
    return tw.build(
        run_dir, hooks=hooks(), max_epochs=3, resume=resume, console=True, watching=pf.Watching(progress=False)
    )


def copied(saved, tmp_path) -> pathlib.Path:
    run_dir = tmp_path / "run"
    shutil.copytree(saved[0], run_dir)  # copies, not hard links: damaging last/ leaves iter_10 whole
    return run_dir


def test_the_matrix_covers_every_file_of_a_checkpoint(saved):
    """FILES is exactly what a saved checkpoint directory holds, so no file escapes the corruption matrix."""
    last = saved[0] / "model" / "last"
    assert sorted(p.relative_to(last).as_posix() for p in last.rglob("*") if p.is_file()) == sorted(FILES)
    assert sorted(p.name for p in (saved[0] / "model").iterdir()) == ["iter_10", "iter_4", "iter_8", "last"]


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_auto_resume_skips_a_damaged_checkpoint_with_one_line(saved, tmp_path, capsys, name, how):
    """resume='auto' passes over a damaged last/, saying which file and what, and loads the newest whole one."""
    run_dir = copied(saved, tmp_path)
    last = run_dir / "model" / "last"
    damage(last / name, how)
    model, run = resumed(run_dir, "auto")
    lines = [line for line in capsys.readouterr().out.splitlines() if "skipped checkpoint" in line]
    assert run.state.progress.global_step == 10 and tw.same_weights(tw.weights(model), saved[1])
    if name in HARMLESS:
        assert lines == []
        return
    assert len(lines) == 1 and str(last) in lines[0] and name in lines[0], lines


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_resume_from_a_damaged_path_raises_checkpoint_error_and_changes_nothing(saved, tmp_path, name, how):
    """resume=<damaged last/> raises CheckpointError naming it, the file and the fix; no file under save_dir changes."""
    run_dir = copied(saved, tmp_path)
    last = run_dir / "model" / "last"
    damage(last / name, how)
    before = hashes(run_dir)
    if name in HARMLESS:
        resumed(run_dir, last)
        return
    with pytest.raises(pf.CheckpointError) as caught:
        resumed(run_dir, last)
    message = str(caught.value)
    assert caught.value.path == str(last) and caught.value.file == name, message
    assert str(last) in message and name in message and "python -m pimm_fn ls" in message, message
    assert "weights_only=False" not in message and "`False`" not in message, message
    assert hashes(run_dir) == before


def test_an_emptied_last_is_skipped_and_named(saved, tmp_path, capsys):
    """A last/ with nothing in it is skipped by 'auto' and, given as the path, named as never finished."""
    run_dir = copied(saved, tmp_path)
    last = run_dir / "model" / "last"
    shutil.rmtree(last)
    last.mkdir()
    _, run = resumed(run_dir, "auto")
    assert run.state.progress.global_step == 10
    assert "skipped checkpoint" in capsys.readouterr().out
    with pytest.raises(pf.CheckpointError, match="COMPLETE is missing"):
        resumed(run_dir, last)


def test_auto_resume_refuses_and_changes_nothing_when_every_checkpoint_is_damaged(saved, tmp_path, capsys):
    """With every checkpoint damaged, 'auto' raises CheckpointError naming each one; no file under save_dir changes.

    (It used to start from step 0, and its first save replaced the checkpoints it had rejected: issue 20.)
    """
    run_dir = copied(saved, tmp_path)
    for entry in (run_dir / "model").iterdir():
        damage(entry / "trainer" / ".metadata", "garbage")
    before = hashes(run_dir)
    with pytest.raises(pf.CheckpointError) as caught:
        resumed(run_dir, "auto")
    message = str(caught.value)
    assert capsys.readouterr().out.count("skipped checkpoint") == 4
    assert [pathlib.Path(r[0]).name for r in caught.value.rejected] == ["last", "iter_10", "iter_8", "iter_4"]
    assert all(f"{run_dir / 'model' / name} (" in message for name in ("last", "iter_4", "iter_8", "iter_10")), message
    assert message.count("trainer/.metadata") == 4 and "resume=None" in message and "move them aside" in message
    assert hashes(run_dir) == before


def test_the_marker_records_every_file_with_its_size(saved):
    """COMPLETE lists each file but itself and the receipts, as {path: {"size": bytes}}."""
    last = saved[0] / "model" / "last"
    files = json.loads((last / "COMPLETE").read_text())["files"]
    assert sorted(files) == sorted(set(FILES) - {"COMPLETE", "receipts/rank0"})
    assert files == {rel: {"size": (last / rel).stat().st_size} for rel in files}


def test_digests_are_recorded_on_request_and_catch_bytes_changed_in_place(tmp_path):
    """With digests=True the marker holds SHA-256s; validate(digests=True) names a file overwritten at the same size."""
    info = checkpoint.save_checkpoint(
        tmp_path, step=3, weights={"w": torch.ones(8)}, trainer={"m": torch.zeros(8)}, local={}, digests=True
    )
    files = json.loads((info.path / "COMPLETE").read_text())["files"]
    data = info.path / "trainer" / "__0_0.distcp"
    assert files["model.pth"]["sha256"] == hashlib.sha256((info.path / "model.pth").read_bytes()).hexdigest()
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # a tensor byte: every read still succeeds, only the digest notices
    data.write_bytes(bytes(raw))
    assert validation.validate(info.path).step == 3
    with pytest.raises(CheckpointError, match="SHA-256") as caught:
        validation.validate(info.path, digests=True)
    assert caught.value.file == "trainer/__0_0.distcp"


def test_a_marker_without_files_still_loads_and_a_short_data_file_is_still_found(tmp_path):
    """A checkpoint from before sizes were recorded loads; the DCP metadata still tells a data file cut short."""
    info = checkpoint.save_checkpoint(
        tmp_path, step=2, weights={"w": torch.ones(4)}, trainer={"m": torch.ones(64)}, local={"r": 1}
    )
    marker = info.path / "COMPLETE"
    payload = json.loads(marker.read_text())
    del payload["files"]
    marker.write_text(json.dumps(payload))
    assert checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path)).local == {"r": 1}
    damage(info.path / "trainer" / "__0_0.distcp", "truncate")
    assert checkpoint.latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="cut short") as caught:
        checkpoint.find_checkpoint(info.path)
    assert caught.value.file == "trainer/__0_0.distcp"


def test_checkpoint_error_is_a_value_error_that_pickles():
    """CheckpointError is caught by `except ValueError` and crosses processes unchanged."""
    for error in (
        CheckpointError("runs/x/model/last", "model.pth", "is missing"),
        CheckpointError("runs/x/model/model_best.pth", "model_best.pth", "is cut", advice="Restore it"),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert isinstance(error, ValueError) and pf.CheckpointError is CheckpointError
        assert (again.path, again.file, again.problem, again.advice, str(again)) == (
            error.path,
            error.file,
            error.problem,
            error.advice,
            str(error),
        )
    assert str(error) == "checkpoint runs/x/model/model_best.pth: model_best.pth is cut. Restore it"


def test_a_sharded_save_records_its_shards_and_a_damaged_one_is_skipped(one_rank_group, tmp_path, capsys):
    """An FSDP2 save without a weights file lists model.pth.skipped and the shard file; a rewritten one is skipped."""
    from torch.distributed.fsdp import fully_shard

    def build(resume=None, epochs=4, console=False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 1))
        fully_shard(net)
        data = torch.utils.data.DataLoader(tw.dataset(16), batch_size=8)
        return pf.loop(
            Regression(net),
            torch.optim.Adam(net.parameters(), lr=0.01),
            data,
            hooks=hooks(),
            max_epochs=epochs,
            save_dir=tmp_path,
            resume=resume,
            saving=pf.Saving(weights_file=False),
            watching=pf.Watching(console=console, progress=False),
        )

    build().run()  # 8 steps: last/ and iter_4, iter_8 (hard links of last/)
    last = tmp_path / "model" / "last"
    assert sorted(json.loads((last / "COMPLETE").read_text())["files"]) == [
        "model.pth.skipped",
        "trainer/.metadata",
        "trainer/__0_0.distcp",
    ]
    shard = last / "trainer" / "__0_0.distcp"
    size = shard.stat().st_size
    shard.unlink()  # a new file at the same size: iter_8's link keeps the old bytes
    shard.write_bytes(bytes(size))
    assert build(resume="auto", epochs=5, console=True).state.progress.global_step == 8
    assert f"skipped checkpoint {last} (step 8): trainer/__0_0.distcp" in capsys.readouterr().out


class Regression(torch.nn.Module):
    """Wraps a regression module as the loop's model: ``{"loss": mse}``."""

    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.body(x) - y) ** 2).mean()}
