"""docs/architecture.md names files that exist: a contributor following it never lands on a moved module."""

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
DOC = ROOT / "docs" / "architecture.md"


def _named_paths() -> set:
    return set(re.findall(r"pimm_fn/[\w/]*\w\.py", DOC.read_text(encoding="utf-8")))


def test_every_module_the_architecture_page_names_exists():
    """Each ``pimm_fn/...py`` path in docs/architecture.md is a file of the package."""
    named = _named_paths()
    assert len(named) > 40, sorted(named)  # the page names the owners, not a handful
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_folder_the_page_names_exists():
    """Each ``pimm_fn/<package>`` folder it names is a package."""
    folders = set(re.findall(r"`(pimm_fn/\w+)`", DOC.read_text(encoding="utf-8")))
    assert folders and not sorted(f for f in folders if not (ROOT / f / "__init__.py").is_file())
