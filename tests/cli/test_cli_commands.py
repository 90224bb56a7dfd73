"""``python -m pimm_fn``: ls, inspect, verify, export and plan on real checkpoints, complete, incomplete and damaged.

The exit codes and the stdout/stderr split are the contract scripts rely on, so they are checked through a real
subprocess; the details of each command through ``pimm_fn.cli.main`` in this process (no torch import per call).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

import pimm_fn as pf
from pimm_fn.checkpoint import save_checkpoint
from pimm_fn.checkpoint import publish as _publish
from pimm_fn.checkpoint.formats import standard as _standard
from pimm_fn.cli import DAMAGED, NOT_FOUND, OK, USAGE, main
from pimm_fn.cli._plan import compact
from pimm_fn.compat import build_hooks
from pimm_fn.core.retention import keep_best, keep_last


def _cli(*args):
    """``python -m pimm_fn ARGS`` as a script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pimm_fn", *map(str, args)], capture_output=True, text=True, timeout=60
    )


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)

    def forward(self, batch):
        return {"loss": self.layer(batch).pow(2).mean()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A real run (two best_on metrics, snapshots, a keep policy), a damaged copy, and checkpoints of each kind."""
    root = tmp_path_factory.mktemp("cli")
    scores = iter([0.2, 0.9, 0.1, 0.3, 0.4, 0.5])

    def val(model):
        return {"acc": next(scores), "loss": 1.0}

    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hooks = [
        pf.evaluate_every(2, val),
        pf.best_on("acc"),
        pf.best_on("loss", mode="min"),
        pf.save_every(2, snapshots=True),
    ]
    pf.loop(
        model,
        optimizer,
        [torch.ones(1, 3)] * 4,
        hooks=hooks,
        max_epochs=3,
        save_dir=root / "run",
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 4),
        saving=pf.Saving(keep=keep_last(2) | keep_best(1, "acc")),
        watching=pf.Watching(console=False),
    )()
    broken = root / "broken" / "model"
    shutil.copytree(root / "run" / "model", broken)
    (broken / "iter_10" / "COMPLETE").unlink()  # never finished, as far as anyone can tell
    data = sorted((broken / "iter_4" / "trainer").glob("*.distcp"))[0]
    data.write_bytes(data.read_bytes()[:100])  # cut short after the save
    staging = _publish.fresh_staging(broken, 14)  # a save interrupted before its marker
    _standard.write_state(staging, _standard.packed_state({"step": 14}, {}))
    save_checkpoint(
        root / "legacy",
        step=3,
        weights={"w": torch.ones(2)},
        trainer={"lr": 0.1},
        local={},
        format="legacy",
        snapshot=True,
    )
    save_checkpoint(
        root / "sharded",
        step=5,
        weights=None,
        trainer={},
        local={},
        sharded={"sharded/model/w": torch.arange(6.0).reshape(2, 3)},
    )
    save_checkpoint(root / "digest", step=7, weights={"w": torch.zeros(64)}, trainer={}, local={}, digests=True)
    return root


def test_scripts_get_data_on_stdout_messages_on_stderr_and_documented_exit_codes(runs, tmp_path):
    """verify of a damaged run exits 1, plan 0, a missing path 3, a bad expression or usage 2; data on stdout,
    one error line on stderr. (Only verify imports torch: the others answer before it is needed.)"""
    verified = _cli("verify", runs / "broken")
    assert verified.returncode == DAMAGED
    lines = {line.split()[1]: line.split()[0] for line in verified.stdout.splitlines()}
    assert lines == {
        "last": "OK",
        "iter_12": "OK",
        "iter_10": "INCOMPLETE",
        "iter_4": "DAMAGED",
        "model_best_acc.pth": "OK",
        "model_best_loss.pth": "OK",
        ".staging-last-14": "NOTE",
    }
    assert verified.stderr == "pimm_fn verify: 2 of 7 damaged or incomplete: iter_10, iter_4\n"

    planned = _cli("plan", "[save_every(4)]", "--iters-per-epoch", 4, "--max-epochs", 2)
    assert planned.returncode == OK and planned.stderr == "" and planned.stdout.endswith("2 effects\n")
    missing = _cli("inspect", tmp_path / "nowhere")
    assert (missing.returncode, missing.stdout) == (NOT_FOUND, "") and missing.stderr.startswith("pimm_fn inspect: ")
    unsafe = _cli("plan", "[__import__('os').getcwd()]", "--iters-per-epoch", 4, "--max-epochs", 1)
    assert unsafe.returncode == USAGE and "name '__import__' is not defined" in unsafe.stderr and unsafe.stdout == ""
    usage = _cli("ls")
    assert usage.returncode == USAGE and "the following arguments are required: DIR" in usage.stderr


def test_export_assembles_a_sharded_checkpoints_weights_into_a_plain_state_dict(runs, tmp_path, capsys):
    """export writes a file torch.load(weights_only=True) reads: the shards assembled, weights only."""
    out = tmp_path / "w.pth"
    assert main(["export", str(runs / "sharded"), str(out)]) == OK
    assert capsys.readouterr().out.startswith(f"wrote {out}: 1 tensors, 6 parameters")
    weights = torch.load(out, weights_only=True)
    assert list(weights) == ["w"] and torch.equal(weights["w"], torch.arange(6.0).reshape(2, 3))


def test_ls_lists_every_checkpoint_with_its_status_step_epoch_and_best_values(runs, capsys):
    """ls --json: complete, incomplete (no marker), damaged (cut short), unfinished saves and each best file;
    a damaged or incomplete one makes it exit 1, naming them, as verify does."""
    assert main(["ls", str(runs / "broken"), "--json"]) == DAMAGED
    out, err = capsys.readouterr()
    assert err == "pimm_fn ls: 2 of 7 damaged or incomplete: iter_10, iter_4\n"
    rows = {r["name"]: r for r in json.loads(out)["entries"]}
    assert [rows[n]["status"] for n in ("last", "iter_12", "iter_10", "iter_4")] == [
        "complete",
        "complete",
        "incomplete",
        "damaged",
    ]
    assert (rows["last"]["step"], rows["last"]["epoch"], rows["last"]["best"]) == (12, 2, {"acc": 0.9, "loss": 1.0})
    assert rows["iter_4"]["problem"].endswith("(cut short)") and rows[".staging-last-14"]["status"] == "unfinished"
    assert rows["model_best_acc.pth"]["best"] == {"acc": 0.9} and rows["model_best_loss.pth"]["step"] == 2


def test_inspect_shows_progress_slots_by_identity_and_optimizer_without_reading_tensors(runs, capsys):
    """inspect --json gives the step, epoch, best values, each hook's slot by identity, optimizer and scheduler."""
    assert main(["inspect", str(runs / "run"), "--json"]) == OK
    found = json.loads(capsys.readouterr().out)
    assert found["path"].endswith("last") and found["progress"]["global_step"] == 12
    assert found["best"] == {"acc": 0.9, "loss": 1.0} and found["recorded_metrics"] == {"acc": 0.5, "loss": 1.0}
    assert found["slots"]["best_on('acc')"] == "BestState(value=0.9, step=4)"
    assert found["slots"]["save_every(2, snapshots=True)"].startswith("SaveEveryState(last_saved=12")
    group = found["optimizer"]["param_groups"][0]
    assert (group["momentum"], group["params"], found["optimizer"]["tensors"]) == (0.9, 2, 2)
    assert found["scheduler"]["last_epoch"] == 12 and found["weights"] == {"tensors": 2, "bytes": 32, "parameters": 8}


def test_export_refuses_to_overwrite_and_reads_legacy_and_best_files(runs, tmp_path, capsys):
    """export of a legacy checkpoint and of a model_best file; an existing OUT needs --force (usage error)."""
    out = tmp_path / "w.pth"
    assert main(["export", str(runs / "legacy" / "iter_3.pth"), str(out)]) == OK
    assert torch.equal(torch.load(out, weights_only=True)["w"], torch.ones(2))
    assert main(["export", str(runs / "run" / "model" / "model_best_acc.pth"), str(out)]) == USAGE
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["export", str(runs / "run" / "model" / "model_best_acc.pth"), str(out), "--force"]) == OK
    assert list(torch.load(out, weights_only=True)) == ["layer.weight", "layer.bias"]
    assert main(["export", str(runs / "broken" / "model" / "iter_10"), str(tmp_path / "x.pth")]) == DAMAGED


def test_export_as_safetensors_writes_the_same_tensors_and_records_step_metric_and_digest(runs, tmp_path, capsys):
    """OUT.safetensors holds the .pth export's tensors; its header records the best model's step, metric
    and value, or a checkpoint's step and the SHA-256 its marker records for model.pth."""
    best = runs / "run" / "model" / "model_best_acc.pth"
    assert main(["export", str(best), str(tmp_path / "b.pth")]) == OK
    assert main(["export", str(best), str(tmp_path / "b.safetensors")]) == OK
    assert capsys.readouterr().out.endswith("(recorded: step=4, metric=acc, value=0.9)\n")
    with safe_open(str(tmp_path / "b.safetensors"), "pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    pth = torch.load(tmp_path / "b.pth", weights_only=True)
    assert tensors.keys() == pth.keys() and all(
        v.dtype == pth[k].dtype and torch.equal(v, pth[k]) for k, v in tensors.items()
    )
    assert {k: v for k, v in metadata.items() if k != "pimm_fn.sha256"} == {
        "format": "pt",
        "pimm_fn.step": "4",
        "pimm_fn.metric": "acc",
        "pimm_fn.value": "0.9",
    }

    assert main(["export", str(runs / "digest"), str(tmp_path / "d.safetensors"), "--format", "safetensors"]) == OK
    with safe_open(str(tmp_path / "d.safetensors"), "pt") as f:
        metadata = f.metadata()
    marker = json.loads((runs / "digest" / "last" / "COMPLETE").read_text())
    assert metadata["pimm_fn.step"] == "7"
    assert metadata["pimm_fn.source_sha256"] == marker["files"]["model.pth"]["sha256"]


def test_export_refuses_a_format_its_out_name_contradicts_and_names_the_missing_extra(
    runs, tmp_path, capsys, monkeypatch
):
    """--format against OUT's suffix is a usage error saying the name to use; without the safetensors package the
    error names the extra to install; nothing is written either way."""
    best = str(runs / "run" / "model" / "model_best_acc.pth")
    assert main(["export", best, str(tmp_path / "w.pth"), "--format", "safetensors"]) == USAGE
    assert "name it w.safetensors" in capsys.readouterr().err
    assert main(["export", best, str(tmp_path / "w.safetensors"), "--format", "pth"]) == USAGE
    assert "readers tell a safetensors file by its .safetensors suffix" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # as where the package is not installed
    assert main(["export", best, str(tmp_path / "w.safetensors")]) == USAGE
    assert "pip install 'pimm_fn[safetensors]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_verify_checks_recorded_sizes_and_digests_and_reads_legacy_files(runs, tmp_path, capsys):
    """A byte changed in place fails the recorded SHA-256; a marker's sizes are reported; a legacy file reads back."""
    assert main(["verify", str(runs / "digest" / "last"), "--json"]) == OK
    notes = json.loads(capsys.readouterr().out)["entries"][0]["notes"]
    assert notes[-1].endswith("SHA-256 digests match the marker")
    damaged = tmp_path / "digest"
    shutil.copytree(runs / "digest" / "last", damaged)
    data = bytearray((damaged / "model.pth").read_bytes())
    data[-200] ^= 0xFF  # same size, other bytes: only the digest can tell
    (damaged / "model.pth").write_bytes(bytes(data))
    assert main(["verify", str(damaged)]) == DAMAGED
    assert "model.pth does not match the SHA-256" in capsys.readouterr().out
    assert main(["verify", str(runs / "legacy")]) == OK
    assert "one file written atomically" in capsys.readouterr().out
    assert main(["verify", str(runs / "broken" / "model" / ".staging-last-14")]) == DAMAGED  # named on its own


@pytest.mark.parametrize("fmt", ["standard", "legacy"])
def test_verify_says_a_damaged_file_is_shared_with_the_snapshot_hard_linked_to_it(tmp_path, capsys, fmt):
    """A snapshot is hard links to last's files: a file cut short in last is damaged in iter_3 too, and verify says
    so of both (text and --json), naming the other and counting a link outside; iter_2, of its own files, is ok."""
    for step in (2, 3):
        save_checkpoint(
            tmp_path,
            step=step,
            weights={"w": torch.ones(64) * step},
            trainer={"lr": 0.1},
            local={},
            format=fmt,
            snapshot=True,
        )
    suffix = ".pth" if fmt == "legacy" else ""
    weights = tmp_path / f"last{suffix}" if fmt == "legacy" else tmp_path / "last" / "model.pth"
    weights.write_bytes(weights.read_bytes()[:100])  # in place: the same file under both names
    os.link(weights, tmp_path.parent / f"outside-{fmt}")  # a third name, outside the model_dir
    assert main(["verify", str(tmp_path), "--json"]) == DAMAGED
    found = {e["name"]: e for e in json.loads(capsys.readouterr().out)["entries"]}
    assert found[f"last{suffix}"]["shared_with"] == [f"iter_3{suffix}", "1 link(s) elsewhere"]
    assert found[f"iter_3{suffix}"]["shared_with"] == [f"last{suffix}", "1 link(s) elsewhere"]
    assert found[f"iter_2{suffix}"]["status"] == "ok" and found[f"iter_2{suffix}"]["shared_with"] == []
    assert main(["verify", str(tmp_path / f"iter_3{suffix}")]) == DAMAGED
    assert (
        f"shares the damaged file(s) with last{suffix}, 1 link(s) elsewhere (hard links: a snapshot and the last it was copied from "
        "are the same files), so the damage is theirs too"
    ) in capsys.readouterr().out


def test_ls_and_inspect_as_text_for_people(runs, capsys):
    """The text forms: a table of checkpoints with step, epoch, status, size and metrics; inspect's sections."""
    assert main(["ls", str(runs / "run")]) == OK
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "STEP", "EPOCH", "STATUS", "SIZE", "METRICS"]
    assert [line.split()[0] for line in table[1:]] == [
        "last",
        "iter_12",
        "iter_10",
        "iter_4",
        "model_best_acc.pth",
        "model_best_loss.pth",
    ]
    assert "acc=0.9 loss=1  best: acc=0.9 loss=1" in table[4]
    assert main(["inspect", str(runs / "legacy")]) == OK
    text = capsys.readouterr().out
    assert "checkpoint" in text and "legacy" in text and "{'lr': 0.1}" in text
    assert main(["ls", str(runs / "run" / "model" / "last" / "trainer")]) == NOT_FOUND


def test_plan_prints_the_trace_of_an_expression_or_a_pimm_config(tmp_path, capsys):
    """plan runs the same dry run as pf.plan, from a hook expression or a pimm config (read, not run) with a _base_."""
    assert main(["plan", "[save_every(5)]", "--iters-per-epoch", "5", "--max-steps", "10"]) == OK
    assert capsys.readouterr().out.splitlines() == [
        "step  event       hook           effect",
        "   5  AfterEpoch  save_every(5)  SaveCheckpoint(step=5, deferred=True)",
        "  10  AfterEpoch  save_every(5)  SaveCheckpoint(step=10, deferred=True)",
        "2 effects",
    ]
    (tmp_path / "base.py").write_text("freq = 4\nhooks = [dict(type='CheckpointSaverIteration', save_freq=freq)]\n")
    (tmp_path / "cfg.py").write_text("import os\n_base_ = ['base.py']\nepoch = os.cpu_count()\n")
    assert main(["plan", str(tmp_path / "cfg.py"), "--iters-per-epoch", "10", "--max-epochs", "3", "--json"]) == OK
    planned = json.loads(capsys.readouterr().out)
    hooks = build_hooks([dict(type="CheckpointSaverIteration", save_freq=4)])
    expected = pf.plan(hooks, iters_per_epoch=10, max_epochs=3)
    assert planned["hooks"] == [repr(h) for h in hooks]
    assert [(r["step"], r["effect"]) for r in planned["effects"]] == [(e.step, compact(e.effect)) for e in expected]
    assert (
        main(["plan", "[best_on('m')]", "--iters-per-epoch", "2", "--max-epochs", "1", "--metric", "m=high"]) == USAGE
    )


@pytest.mark.parametrize(
    "content", [pytest.param("{", id="malformed"), pytest.param('{"hooks":' + "[" * 100000, id="nested-100000-deep")]
)
def test_plan_of_a_json_config_that_does_not_parse_is_a_usage_error_naming_it(tmp_path, capsys, content):
    """A JSON config that is not JSON, or nests past the parser's depth, exits 2 naming the file, not a traceback."""
    config = tmp_path / "cfg.json"
    config.write_text(content)
    assert main(["plan", str(config), "--iters-per-epoch", "2", "--max-epochs", "1"]) == USAGE
    assert f"cannot read the config {str(config)!r}" in capsys.readouterr().err


def test_a_folder_named_pimm_fn_where_the_command_runs_is_named_not_an_attribute_error(tmp_path):
    """From a directory holding a pimm_fn/ folder (a clone's parent), the command works, or (an editable install,
    which that folder hides) exits 2 naming the folder and the fix, with no traceback."""
    (tmp_path / "pimm_fn").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pimm_fn", "plan", "[save_every(4)]", "--iters-per-epoch", "4", "--max-epochs", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode == OK:  # an installed (not editable) package is found before any folder
        assert done.stdout.endswith("2 effects\n"), done
        return
    assert done.returncode == USAGE and "Traceback" not in done.stderr, done.stderr
    assert str(tmp_path / "pimm_fn") in done.stderr and "another directory" in done.stderr, done.stderr
