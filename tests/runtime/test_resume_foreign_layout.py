"""Another layout resumes through a reader handed to the loop with its plug-in's handlers
(pimm_fn.checkpoint.discovery): asked only where pimm_fn finds nothing of its own, never without one."""

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.checkpoint import discovery as foreign  # noqa: E402

from _pointer_layout import Note, PointerReader  # noqa: E402


class Net(torch.nn.Linear):
    def forward(self, batch):
        return {"loss": super().forward(batch[0]).pow(2).mean()}


def _loop(save_dir, resume=None, handlers=None, max_epochs=3):
    torch.manual_seed(0)
    model = Net(2, 1)
    data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        data,
        hooks=[pf.save_every(2)],
        max_epochs=max_epochs,
        save_dir=save_dir,
        resume=resume,
        handlers=handlers,
    )


def test_readers_are_the_handlers_that_read_a_layout():
    """Among a run's handlers, those with name, recognise and resume_from are readers, each once."""
    reader = PointerReader()
    assert foreign.readers([print, reader, reader, len]) == (reader,)


def test_a_foreign_layout_resumes_through_its_reader_and_only_with_it(tmp_path, capsys):
    """resume=<path> and 'auto' resume what the reader translates; a fresh run over it is refused naming the
    layout; without the reader the same save_dir holds nothing to resume."""
    _loop(tmp_path / "ours", max_epochs=2)()
    toy = tmp_path / "toy" / "model"
    toy.mkdir(parents=True)
    (toy / "pointer.txt").write_text(str(tmp_path / "ours" / "model" / "last"))
    reader = PointerReader()
    handlers = {Note: reader}
    assert _loop(tmp_path / "b", resume=toy, handlers=handlers).state.progress.global_step == 4
    capsys.readouterr()
    assert _loop(tmp_path / "toy", resume="auto", handlers=handlers).state.progress.global_step == 4
    said = capsys.readouterr().out
    assert f"toy layout at {toy}" in said and "starting fresh" not in said
    with pytest.raises(FileExistsError, match=r"already holds toy checkpoints \(model\)"):
        _loop(tmp_path / "toy", handlers=handlers)
    assert reader.looks == ["model"] * 3
    assert _loop(tmp_path / "toy", resume="auto").state.progress.global_step == 0  # no reader: nothing of ours
    with pytest.raises(FileNotFoundError):
        _loop(tmp_path / "c", resume=toy)


def test_a_save_dir_of_ours_never_asks_the_reader(tmp_path):
    """Resuming or refusing a fresh run over pimm_fn's own checkpoints needs no look at other layouts."""
    reader = PointerReader()
    _loop(tmp_path, max_epochs=2, handlers={Note: reader})()
    assert _loop(tmp_path, resume="auto", handlers={Note: reader}).state.progress.global_step == 4
    resumed = _loop(tmp_path / "x", resume=tmp_path / "model" / "last", handlers={Note: reader})
    assert resumed.state.progress.global_step == 4
    with pytest.raises(FileExistsError, match=r"already holds checkpoints;"):
        _loop(tmp_path, handlers={Note: reader})
    assert reader.looks == []


def test_a_fresh_run_never_overwrites_a_last_directory_that_is_not_ours(tmp_path):
    """Without a reader for it, another library's model/last/ is refused to a fresh run, named, and left as it was."""
    theirs = tmp_path / "model" / "last"
    theirs.mkdir(parents=True)
    (theirs / "weights.bin").write_bytes(b"theirs")
    with pytest.raises(FileExistsError, match=r"holds last in model/, which is not a pimm_fn checkpoint .*handlers="):
        _loop(tmp_path)
    assert [p.name for p in theirs.iterdir()] == ["weights.bin"] and (theirs / "weights.bin").read_bytes() == b"theirs"
