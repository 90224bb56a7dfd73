"""The digests benchmark runs end to end on a tiny state (no timing is asserted)."""

import pytest

pytest.importorskip("torch")


def test_digests_benchmark_pairs_sync_and_async_saves_with_and_without(tmp_path, monkeypatch):
    """Each size reports paired sync and async times with and without digests, and their ratios."""
    from benchmarks import _common, digests

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")  # never the real results
    result = digests.main(["--quick", "--dir", str(tmp_path)])
    (size,) = result["sizes"]
    for kind in ("sync", "async", "staged"):
        assert size[f"{kind}_off"]["n"] == size[f"{kind}_on"]["n"] == 2 and size[f"{kind}_ratio"]["median"] > 0
    assert size["hash_mb_s"] > 0 and (tmp_path / "results" / "digests.json").is_file()
    assert not list(tmp_path.glob("pimm_fn-digests-*"))  # its checkpoints are removed
