"""The FSDP2 checkpoint benchmark runs end to end on 2 ranks with a tiny state (no timing is asserted)."""

import pytest

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """A quick run must not overwrite the real results under benchmarks/results/."""
    from benchmarks import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")


def test_fsdp_io_runs_quick_and_compares_to_raw_dcp(tmp_path):
    """Two ranks save and load a sharded state every way, and every ratio against raw DCP is reported.

    The launch kills both ranks past 60 s (``fsdp_io.launch``), so a hang in a collective fails the test.
    """
    from benchmarks import fsdp_io

    size = fsdp_io.run(quick=True)["size"]
    assert size["save_ratio_vs_dcp"]["n"] == 2 and size["load_ratio_vs_dcp"]["median"] > 0
    assert size["weights_file_ratio"]["n"] == 2 and set(size["seconds"]) == {*fsdp_io.SAVES, *fsdp_io.LOADS, "gather"}
    assert (tmp_path / "results" / "fsdp_io.json").is_file()
