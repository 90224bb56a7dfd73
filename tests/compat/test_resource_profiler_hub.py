"""ResourceUtilizationLogger, RuntimeProfiler and PushToHub: pimm's cadences planned as pure hooks, and a real run
whose handlers measure resources, write the profiler's trace and stage the weights the Hub upload sends."""

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.compat import HANDLERS, build_hooks  # noqa: E402
from pimm_fn.compat import effects as fx  # noqa: E402
from pimm_fn.compat.monitors import stage_for_hub  # noqa: E402
from pimm_fn.core.effects import Stop  # noqa: E402

HAS_HUB = importlib.util.find_spec("huggingface_hub") is not None


def _effects(configs, ipe=5, epochs=2):
    return [
        (e.step, type(e.effect).__name__) for e in pf.plan(build_hooks(configs), iters_per_epoch=ipe, max_epochs=epochs)
    ]


def test_resources_are_measured_every_log_frequency_global_steps():
    """pimm's default of 10 and any log_frequency: one LogResources per multiple of it, across epochs."""
    assert _effects([dict(type="ResourceUtilizationLogger", log_frequency=3)]) == [
        (3, "LogResources"),
        (6, "LogResources"),
        (9, "LogResources"),
    ]
    assert [s for s, _ in _effects([dict(type="ResourceUtilizationLogger")], ipe=10, epochs=3)] == [10, 20, 30]


def test_the_profiler_covers_the_first_warm_up_plus_one_steps_and_interrupt_stops_the_run():
    """Started before training, stopped after step warm_up + 1; with interrupt=True the run stops there."""
    assert _effects([dict(type="RuntimeProfiler", warm_up=2)]) == [(0, "StartProfiler"), (3, "StopProfiler")]
    trace = pf.plan(
        build_hooks([dict(type="RuntimeProfiler", warm_up=0, interrupt=True)]), iters_per_epoch=5, max_epochs=2
    )
    assert [type(e.effect) for e in trace] == [fx.StartProfiler, fx.StopProfiler, Stop]
    assert trace[-1].step == 1


def test_a_run_shorter_than_the_profiling_window_still_stops_the_profiler():
    """Fewer steps than warm_up + 1: the profiler is stopped (and its output written) after training."""
    assert _effects([dict(type="RuntimeProfiler", warm_up=5)], ipe=2, epochs=1) == [
        (0, "StartProfiler"),
        (2, "StopProfiler"),
    ]


def test_push_to_hub_pushes_once_after_training_and_refuses_what_it_cannot_do():
    """One PushToHub at AfterTrain; a token, pushes during training and unknown keywords are refused by name."""
    assert _effects([dict(type="PushToHub", repo_id="someone/model")]) == [(10, "PushToHub")]
    with pytest.raises(ValueError, match="'token' in a config"):
        build_hooks([dict(type="PushToHub", repo_id="a/b", token="hf_x")])
    with pytest.raises(ValueError, match="every_n_steps=5"):
        build_hooks([dict(type="PushToHub", repo_id="a/b", every_n_steps=5)])
    with pytest.raises(TypeError, match="did you mean 'repo_id'"):
        build_hooks([dict(type="PushToHub", repo_idd="a/b")])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 1)

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.head(x) - y) ** 2).mean()}


def _run(tmp_path, configs):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01),
        DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4),
        hooks=build_hooks(configs),
        max_epochs=2,
        save_dir=tmp_path,
        handlers=HANDLERS,
        watching=pf.Watching(console=False, progress=False),
    )


def test_a_run_logs_its_resources_and_writes_the_profile(tmp_path):
    """The handlers log this process's memory under pimm's names and write the trace and table into save_dir."""
    run = _run(
        tmp_path,
        [
            dict(type="ResourceUtilizationLogger", log_frequency=2),
            dict(type="RuntimeProfiler", warm_up=1, sort_by="cpu_time_total", row_limit=5),
        ],
    )
    run()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    resources = [r for r in records if r["kind"] == "resources"]
    assert [r["step"] for r in resources] == [2, 4, 6]
    assert all(0 < r["resources/process_rss_gb"] < 1e3 for r in resources)
    trace = json.loads((tmp_path / "profiler" / "trace.json").read_text())
    assert trace["traceEvents"]
    assert "Self CPU" in (tmp_path / "profiler" / "table.txt").read_text()


@pytest.mark.skipif(HAS_HUB, reason="checks the message shown when huggingface_hub is missing")
def test_push_to_hub_without_the_package_names_the_extra_and_the_staged_folder_holds_the_weights(tmp_path):
    """The upload fails naming the 'hub' extra; the folder it would upload holds the last weights, loadable safely."""
    run = _run(tmp_path, [dict(type="PushToHub", repo_id="someone/model", checkpoint="last")])
    with pytest.raises(ImportError, match=r"pimm_fn\[hub\]"):
        run()
    folder = stage_for_hub(fx.PushToHub(6, "someone/model", "last"), run.ctx)
    staged = torch.load(folder / "last.pth", weights_only=True)
    assert staged.keys() == run.ctx.weights().keys()
    assert all(torch.equal(staged[k], v) for k, v in run.ctx.weights().items())


@pytest.mark.skipif(not HAS_HUB, reason="needs huggingface_hub (the 'hub' extra)")
def test_push_to_hub_uploads_the_staged_folder(tmp_path, monkeypatch):
    """With huggingface_hub, the run ends by HfApi().upload_folder of save_dir/hub (HfApi replaced: no network)."""
    import huggingface_hub

    calls = []

    class OfflineApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", repo_id))

        def upload_folder(self, *, repo_id, folder_path, **kwargs):
            calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineApi)
    _run(tmp_path, [dict(type="PushToHub", repo_id="someone/model", checkpoint="last")])()
    assert calls == [("create_repo", "someone/model"), ("upload_folder", "someone/model", ["last.pth"])]
