"""The wheel, as ``pip install pimm_fn`` gives it: built, installed beside no checkout, run; and nothing else in it.

The sdist is built from a copy of the checkout (its caches included, as a
developer's has them), the wheel from the unpacked sdist alone, both offline
(``python -m build --no-isolation``). The wheel is installed by pip into a
fresh virtual environment; its dependencies come from this environment, not
the network: a ``.pth`` file there names a directory of links to exactly the
distributions its requirements pull in (a path line in a ``.pth`` adds the
directory without reading the ``.pth`` files inside it, so nothing else of
this environment, and no editable install of the checkout, is seen). There,
with a scratch directory as the working directory, the CLI answers, the demo
trains, saves, resumes and exports its best model, and ``pf.plan`` runs
without torch; ``pip check`` finds every requirement met.
"""

import email.message
import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import pimm_fn as pf

ROOT = pathlib.Path(__file__).resolve().parents[1]
DECLARED = {"attrs", "toolz", "torch", "numpy", "tqdm"}  # pyproject's dependencies, all the wheel may need
EXTRAS = ("data", "safetensors")  # the demo's StatefulDataLoader (torchdata); export --format safetensors
NOT_SOURCE = {".git", ".venv", "build", "dist", "runs", ".pytest_cache", ".hypothesis", ".benchmarks"}  # .gitignore's
PLANNED = "[pf.save_every(2), pf.log_every(1)]"  # pf.plan's hooks, in the fresh environment and here
TINY = ["--num-train", "32", "--num-val", "8", "--points", "64", "--batch-size", "8", "--threads", "1"]


def _run(*command, timeout: int, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``command`` run to its end within ``timeout`` seconds; a failure shows its output."""
    result = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


def _package_files() -> set:
    """What the wheel must hold of the package: every module of the checkout, and the typing marker."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "pimm_fn").rglob("*.py")} | {"pimm_fn/py.typed"}


def _copied(source, target):
    """A file of the checkout copied, unless it went while copying (a cache another test process just replaced)."""
    try:
        shutil.copy2(source, target)
    except FileNotFoundError:
        pass


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(sdist, wheel)``: the sdist from a copy of the checkout, the wheel from the unpacked sdist alone."""
    root = tmp_path_factory.mktemp("build")
    source, out = root / "checkout", root / "dist"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,
        copy_function=_copied,
        ignore=lambda _, names: {n for n in names if n in NOT_SOURCE or n.endswith(".egg-info")},
    )
    _run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", out, source, timeout=300)
    (sdist,) = out.glob("pimm_fn-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (root / "unpacked").iterdir()
    _run(sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", out, unpacked, timeout=300)
    (wheel,) = out.glob("pimm_fn-*.whl")
    return sdist, wheel


def _metadata(wheel: pathlib.Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def _closure(requirements, extras) -> dict:
    """The distributions of this environment that ``requirements`` (with ``extras``) pull in, theirs too, by name;
    each of a version its requirement allows (what ``pip check`` leaves out: the extras')."""
    found: dict = {}
    todo = [(Requirement(r), tuple(extras)) for r in requirements]
    while todo:
        requirement, wanted = todo.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in ("", *wanted)):
            continue
        dist = importlib.metadata.distribution(requirement.name)
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{requirement}: {dist.version} installed"
        )
        name = canonicalize_name(dist.metadata["Name"])
        extras_seen = found.get(name, (None, None))[1]
        if extras_seen is not None and set(requirement.extras) <= extras_seen:
            continue
        found[name] = (dist, (extras_seen or set()) | set(requirement.extras))
        todo += [(Requirement(r), tuple(requirement.extras)) for r in dist.requires or ()]
    return {name: dist for name, (dist, _) in found.items()}


def _linked(dists: dict, into: pathlib.Path) -> pathlib.Path:
    """A directory of links to each distribution's top-level files and folders (its dist-info included)."""
    into.mkdir()
    for dist in dists.values():
        assert dist.files is not None, f"{dist.metadata['Name']} was installed without a RECORD: its files are unknown"
        for top in {f.parts[0] for f in dist.files}:
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and not (into / top).exists():
                (into / top).symlink_to(dist.locate_file(top))
    return into


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """``(python, env, workdir, closure)``: a fresh virtual environment holding the wheel, pip-installed, and its
    requirements' distributions linked in; a clean environment and an empty working directory to run it in."""
    root = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", "--without-pip", root / "env", timeout=120)
    python = root / "env" / "bin" / "python"
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "--no-cache-dir",
        "--disable-pip-version-check",
        built[1],
        timeout=300,
    )
    closure = _closure(_metadata(built[1]).get_all("Requires-Dist"), EXTRAS)
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", timeout=60).stdout.strip()
    (pathlib.Path(site) / "_dependencies.pth").write_text(f"{_linked(closure, root / 'dependencies')}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    env.update(PYTHONNOUSERSITE="1", VIRTUAL_ENV=str(root / "env"))
    (root / "work").mkdir()
    return python, env, root / "work", closure


def test_the_wheel_holds_the_package_its_typing_marker_and_its_metadata_only(built):
    """Every module and py.typed under pimm_fn/, the dist-info; no tests, benchmarks, examples or caches."""
    with zipfile.ZipFile(built[1]) as archive:
        names = archive.namelist()
    package = {n for n in names if n.startswith("pimm_fn/")}
    info = {n.split("/", 1)[1] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert package == _package_files()
    assert info == {"METADATA", "WHEEL", "RECORD", "top_level.txt"}, sorted(set(names) - package)
    assert len(names) == len(package) + len(info)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]


def test_the_wheel_declares_exactly_the_projects_requirements(built):
    """Requires-Dist: the five dependencies unconditionally, every other one under an extra (safetensors under its own)."""
    requirements = [Requirement(r) for r in _metadata(built[1]).get_all("Requires-Dist")]
    assert {r.name for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})} == DECLARED
    assert {r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "safetensors"})} == {
        "safetensors"
    }


def test_the_sdist_holds_what_a_build_needs_and_no_tests_or_caches(built):
    """The sdist holds pyproject.toml, README.md, MANIFEST.in and the package (the wheel was built from it alone);
    no tests, benchmarks, examples or caches."""
    with tarfile.open(built[0]) as archive:
        names = {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}
    assert {"pyproject.toml", "README.md", "MANIFEST.in", "PKG-INFO"} <= names
    assert {n for n in names if n.startswith("pimm_fn/")} == _package_files()
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "docs", "scripts")]
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]


def test_the_installed_wheel_runs_from_the_environment_with_exactly_its_requirements(venv, built):
    """pimm_fn imports from the fresh environment (an archive install, not editable), nothing of the checkout is on
    sys.path, the distributions seen are the wheel's and its requirements' only, pip check finds them all met, and
    pf.plan runs without importing torch."""
    python, env, work, closure = venv
    report = _run(
        python,
        "-c",
        """
import importlib.metadata as md, json, sys
import pimm_fn as pf
trace = pf.plan(%s, iters_per_epoch=4, max_epochs=1)
print(json.dumps({"file": pf.__file__, "path": sys.path, "trace": str(trace),
                  "torch": any(m == "torch" or m.startswith("torch.") for m in sys.modules),
                  "direct_url": json.loads(md.distribution("pimm_fn").read_text("direct_url.json")),
                  "requires": md.requires("pimm_fn"),
                  "seen": sorted({d.metadata["Name"] for d in md.distributions()})}))
"""
        % PLANNED,
        timeout=120,
        cwd=work,
        env=env,
    )
    found = json.loads(report.stdout)
    env_root = pathlib.Path(env["VIRTUAL_ENV"])
    assert pathlib.Path(found["file"]).is_relative_to(env_root)
    assert "archive_info" in found["direct_url"] and "dir_info" not in found["direct_url"]
    assert not [p for p in found["path"] if p and pathlib.Path(p).resolve().is_relative_to(ROOT)]
    assert found["requires"] == _metadata(built[1]).get_all("Requires-Dist")
    assert {canonicalize_name(n) for n in found["seen"]} == set(closure) | {"pimm-fn"}
    assert found["trace"] == str(pf.plan(eval(PLANNED, {"pf": pf}), iters_per_epoch=4, max_epochs=1))
    assert not found["torch"]
    checked = _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "check",
        "--disable-pip-version-check",
        timeout=120,
        env={**env, "PIP_NO_INDEX": "1"},
    )
    assert "No broken requirements found" in checked.stdout


def test_the_installed_cli_answers_help(venv):
    """python -m pimm_fn --help lists the commands."""
    python, env, work, _ = venv
    shown = _run(python, "-m", "pimm_fn", "--help", timeout=120, cwd=work, env=env).stdout
    assert shown.startswith("usage: python -m pimm_fn") and all(c in shown for c in ("ls", "verify", "export", "plan"))


def test_the_installed_wheel_trains_the_demo_saves_resumes_and_exports_its_best_model(venv, tmp_path):
    """The demo, copied beside no checkout, trains an epoch and saves, resumes to a second, and its best model
    is listed and exported as safetensors by the installed CLI."""
    python, env, work, _ = venv
    demo = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", demo, ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    save = ["--save-dir", tmp_path / "run"]
    first = _run(python, demo / "train_pointcloud.py", *TINY, *save, "--epochs", "1", timeout=300, cwd=work, env=env)
    assert "done: 4 steps, 1 epochs" in first.stdout
    second = _run(
        python, demo / "train_pointcloud.py", *TINY, *save, "--epochs", "2", "--resume", timeout=300, cwd=work, env=env
    )
    assert "resumed from" in second.stdout + second.stderr and "done: 8 steps, 2 epochs" in second.stdout
    listed = _run(python, "-m", "pimm_fn", "ls", tmp_path / "run", timeout=120, cwd=work, env=env).stdout
    assert "model_best.pth" in listed and "last" in listed
    out = tmp_path / "best.safetensors"
    _run(
        python,
        "-m",
        "pimm_fn",
        "export",
        tmp_path / "run" / "model" / "model_best.pth",
        out,
        timeout=120,
        cwd=work,
        env=env,
    )
    loaded = _run(
        python,
        "-c",
        "import sys; from pimm_fn.checkpoint import load_weights_file; print(len(load_weights_file(sys.argv[1])))",
        out,
        timeout=120,
        cwd=work,
        env=env,
    )
    assert int(loaded.stdout) > 0
