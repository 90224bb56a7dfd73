"""compat is a plug-in: nothing in pimm_fn imports it or is filled by importing it; its hooks carry their adapter,
its handlers carry the reader of pimm's layouts, and pimm's warm start is pimm_fn's one LoadWeights effect."""

import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pimm_fn as pf  # noqa: E402
from pimm_fn.compat import HANDLERS, HookBase, build_hooks  # noqa: E402
from pimm_fn.compat.checkpoints import PimmCheckpoints  # noqa: E402
from pimm_fn.core import hook as protocol  # noqa: E402
from pimm_fn.core.effects import LoadWeights  # noqa: E402

ROOT = pathlib.Path(pf.__file__).parent
# The CLI is a front end, like a user's script, that offers the plug-in pimm_fn ships: `python -m pimm_fn plan cfg.py`
# plans a pimm config, and `inspect` shows a pimm run's slots.
FRONT_ENDS = {"pimm_fn.cli._plan", "pimm_fn.cli._show"}


def _importers_of_compat() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        if name.startswith("pimm_fn.compat") or name in FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "pimm_fn.compat" or n.startswith("pimm_fn.compat.") for n in names):
                found.append(f"{name} (line {node.lineno})")
    return found


def test_no_module_outside_compat_imports_it():
    """The core, hooks, checkpoint and runtime never import pimm_fn.compat (at the top or inside a function)."""
    assert _importers_of_compat() == []


def test_a_run_that_never_saw_pimm_never_imports_compat(tmp_path):
    """import pimm_fn, a fresh run with a save_dir and its resumes ('auto', a path) leave pimm_fn.compat unloaded."""
    code = textwrap.dedent(f"""
        import sys, torch
        import pimm_fn as pf
        from torch.utils.data import DataLoader, TensorDataset
        class Net(torch.nn.Linear):
            def forward(self, batch):
                return {{"loss": super().forward(batch[0]).pow(2).mean()}}
        def run(resume):
            torch.manual_seed(0)
            model = Net(2, 1)
            data = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
            run = pf.loop(model, torch.optim.SGD(model.parameters(), lr=0.1), data, hooks=[pf.save_every(2)],
                          max_epochs=2, save_dir={str(tmp_path)!r}, resume=resume,
                          watching=pf.Watching(console=False))
            run()
        run(None); run("auto"); run({str(tmp_path / "model" / "last")!r})
        assert "pimm_fn.compat" not in sys.modules, sorted(m for m in sys.modules if "compat" in m)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


class Adapter:
    """Not a hook itself (not callable): it declares the hook that runs in its place."""

    def as_hook(self):
        return pf.save_every(3)


def test_the_core_keeps_no_adapter_and_an_object_brings_its_own():
    """core.hook has no adapter list to fill; an object declaring as_hook() stands in any hook list."""
    assert not hasattr(protocol, "register_adapter") and not hasattr(protocol, "_ADAPTERS")
    assert [e.step for e in pf.plan([Adapter()], iters_per_epoch=3, max_epochs=2)] == [3, 6]
    assert pf.chain(Adapter(), name="c").hooks == (pf.save_every(3),)
    assert repr(HookBase().as_hook()).startswith("adapt(")


def test_pimms_warm_start_is_the_one_load_weights_effect():
    """CheckpointLoader asks for a LoadWeights in pimm's dialect; load_weights for one in pimm_fn's."""
    hooks = build_hooks([dict(type="CheckpointLoader", keywords="backbone", replacement="encoder")], weight="w.pth")
    (entry,) = pf.plan(hooks, iters_per_epoch=2, max_epochs=1)
    assert entry.effect == LoadWeights("w.pth", (("backbone", "encoder"),), False, "pimm")
    (entry,) = pf.plan([pf.load_weights("w.pth")], iters_per_epoch=2, max_epochs=1)
    assert entry.effect == LoadWeights("w.pth") and entry.effect.dialect == "pimm_fn"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(3, 2)

    def forward(self, batch):
        return {"loss": self.encoder(batch[0]).pow(2).mean()}


def _loop(model, hooks, handlers=None, max_epochs=1, **kwargs):
    data = DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2)
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        data,
        hooks=hooks,
        max_epochs=max_epochs,
        handlers=handlers,
        watching=pf.Watching(console=False),
        **kwargs,
    )


def test_each_dialect_goes_to_its_handler(tmp_path):
    """Without compat's handlers a pimm-dialect warm start is refused naming them; with them, pimm_fn's own warm
    start keeps pimm_fn's rules (a rule matching nothing is an error) while pimm's skips a key of another shape."""
    source = Net()
    torch.save(
        {
            "state_dict": {
                "module.backbone.weight": source.encoder.weight.detach(),
                "module.backbone.bias": torch.zeros(5),
            }
        },
        tmp_path / "w.pth",
    )
    pimm = build_hooks(
        [dict(type="CheckpointLoader", keywords="backbone", replacement="encoder")], weight=str(tmp_path / "w.pth")
    )
    with pytest.raises(pf.MissingHandlerError, match=r"'pimm' dialect .*loop\(handlers=pimm_fn\.compat\.HANDLERS\)"):
        _loop(Net(), pimm).step()
    model = Net()
    _loop(model, pimm, HANDLERS).step()
    assert torch.equal(model.encoder.weight, source.encoder.weight)
    ours = [pf.load_weights(str(tmp_path / "w.pth"), replacements={"trunk.": "encoder."})]
    with pytest.raises(ValueError, match=r"\['trunk\.'\] matched no key"):
        _loop(Net(), ours, HANDLERS).step()


class CountingReader(PimmCheckpoints):
    """pimm's reader, counting the looks the resume asks of it."""

    def __init__(self):
        self.looks = []

    def recognise(self, path):
        self.looks.append(pathlib.Path(path).name)
        return super().recognise(path)


def test_the_reader_is_asked_only_where_pimm_fns_discovery_found_nothing(tmp_path):
    """A save_dir holding a pimm_fn checkpoint is resumed (or refused to a fresh run) without asking the reader;
    an empty one asks it once, on resume='auto' only."""
    reader = CountingReader()
    handlers = {**HANDLERS, LoadWeights: reader}
    _loop(Net(), [pf.save_every(2)], handlers, save_dir=tmp_path / "a")()
    assert reader.looks == []  # a fresh run into a new save_dir: no model/ to look in
    resumed = _loop(Net(), [pf.save_every(2)], handlers, 2, save_dir=tmp_path / "a", resume="auto")
    assert resumed.state.progress.global_step == 2
    with pytest.raises(FileExistsError, match=r"already holds checkpoints;"):
        _loop(Net(), [pf.save_every(2)], handlers, save_dir=tmp_path / "a")
    assert reader.looks == []
    run = _loop(Net(), [pf.save_every(2)], handlers, save_dir=tmp_path / "b", resume="auto")
    assert reader.looks == ["model"] and run.state.progress.global_step == 0
