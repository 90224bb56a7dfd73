"""Extending a finished run: a scheduler whose saved horizon the run outgrew is refused at resume with the fix,
and a finished run resumed with its own budget runs no hook again."""

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.core import events as ev  # noqa: E402
from pimm_fn.core.effects import Log  # noqa: E402


def _data():
    x = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.linear(x) - y) ** 2).mean()}


def at_end(state, event):
    """Logs once, after training: a hook that must not run again when a finished run is resumed."""
    if isinstance(event, ev.AfterTrain):
        return state, (Log(state.progress.global_step, "end", {"done": 1}),)
    return state, ()


def _run(save_dir, *, epochs, resume=None, horizon=None, hooks=None):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=horizon or 5 * epochs)
    run = pf.loop(
        model,
        optimizer,
        _data(),
        hooks=hooks or [pf.save_every(5)],
        max_epochs=epochs,
        save_dir=save_dir,
        scheduler=scheduler,
        resume=resume,
        watching=pf.Watching(console=False),
    )
    return model, run


@pytest.mark.filterwarnings("ignore:resumed from")
def test_extending_a_run_past_its_schedulers_saved_horizon_is_refused_with_the_fix(tmp_path):
    """OneCycleLR saved for 10 steps, resumed with max_epochs=3 and a scheduler built for 15: refused before anything
    is loaded, saying what to do, instead of torch failing one step after step 10."""
    _, run = _run(tmp_path, epochs=2)
    run()
    model, _ = _run(tmp_path / "other", epochs=3)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(
        pf.ResumeError,
        match=r"\(OneCycleLR\) was built for 10 steps and has taken 10; this run "
        r"built it for 15.*pf\.load_weights",
    ):
        _run(tmp_path, epochs=3, resume="auto")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    _, same = _run(tmp_path, epochs=2, resume="auto")  # the budget it was built for resumes
    assert same.state.finished


@pytest.mark.filterwarnings("ignore:resumed from")
def test_a_finished_run_resumed_with_its_budget_runs_no_hook(tmp_path):
    """The last save was the deferred one of the last epoch, written before AfterTrain: the resumed run is finished,
    its AfterTrain hooks do not run a second time, and nothing is trained or written."""
    hooks = [pf.save_every(5), at_end]
    _, run = _run(tmp_path, epochs=3, hooks=hooks)
    run()
    assert [e.effect.kind for e in run.trace if isinstance(e.effect, Log)] == ["end"]
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    called = []

    def probe(state, event):  # listens to every event: any call at all is recorded
        called.append(type(event).__name__)
        return state, ()

    _, resumed = _run(tmp_path, epochs=3, hooks=[*hooks, probe], resume="auto")
    assert resumed.state.finished
    resumed()
    assert called == []  # not even BeforeTrain(resumed=True)
    assert resumed.trace == [] and resumed.state.progress.global_step == 15
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files
