"""The manual builds strictly from docs/ and the docstrings, with an entry for every public name."""

import importlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PUBLIC = ("pimm_fn", "pimm_fn.testing", "pimm_fn.compat")


def _build(config_dir: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    # Not -q: it hides the warnings, and --strict then counts none of them.
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=config_dir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """The manual's sources in a folder of their own, beside the package they document."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "scripts" / "site", copy / "scripts" / "site")
    (copy / "pimm_fn").symlink_to(ROOT / "pimm_fn")
    return copy


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it from this checkout."""
    site = tmp_path_factory.mktemp("site")
    done = _build(ROOT, site)
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def test_the_manual_builds_strictly(site):
    """`mkdocs build --strict` succeeds (no broken link, anchor or reference) and writes every page of the nav."""
    for page in (
        "index.html",
        "tutorials/compose-a-loop/index.html",
        "how-to/preemption/index.html",
        "architecture/index.html",
        "reference/pimm_fn/index.html",
    ):
        assert (site / page).is_file(), page


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_has_a_rendered_entry(site, module):
    """Each name of the module's __all__ is an anchor of the built reference, under its public path."""
    html = "".join(page.read_text(encoding="utf-8") for page in (site / "reference").rglob("*.html"))
    names = importlib.import_module(module).__all__
    missing = [name for name in names if f'id="{module}.{name}"' not in html]
    assert not missing, f"no reference entry rendered for {missing}"


def test_a_public_name_left_out_of_the_reference_fails_the_build(tmp_path):
    """A reference page without `::: pimm_fn.loop` stops the build, naming the name and where to add it."""
    copy = _copy(tmp_path)
    page = copy / "docs" / "reference" / "pimm_fn.md"
    page.write_text(page.read_text().replace("::: pimm_fn.loop\n", ""))
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "the API reference has no entry for pimm_fn.loop" in done.stdout + done.stderr, done.stderr


def test_a_broken_link_fails_the_build(tmp_path):
    """A link to a page that does not exist fails the strict build, naming it."""
    copy = _copy(tmp_path)
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\nSee [the missing page](how-to/missing.md).\n")
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0 and "how-to/missing.md" in done.stdout + done.stderr, done.stderr
