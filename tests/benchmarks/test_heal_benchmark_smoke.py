"""The heal benchmark runs end to end on 2 ranks with a tiny state (no timing is asserted)."""

import pytest

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """A quick run must not overwrite the real results under benchmarks/results/."""
    from benchmarks import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")


def test_heal_runs_quick_and_compares_to_the_raw_tensors(tmp_path):
    """Two ranks heal and send the raw tensors, and heal / raw is reported with what was sent.

    The launch kills both ranks past 60 s (``heal.launch``), so a hang in a send or receive fails the test.
    """
    from benchmarks import heal

    (size,) = heal.run(quick=True)["sizes"].values()
    assert size["heal_ratio_vs_raw"]["n"] == 2 and size["seconds"]["raw"]["median"] > 0
    assert size["tensors"] > 2 and size["tensor_mb"] > 2 * size["parameters_mb"] and size["json_bytes"] > 0
    assert (tmp_path / "results" / "heal.json").is_file()
