"""The simulation benchmark runs on a tiny size, and its skipping and walking simulations agree."""

from benchmarks import simulation


def test_simulation_benchmark_measures_every_variant_and_checks_skipping_changes_nothing():
    """A tiny run fills both variants and finds the skipping simulation identical to the walking one."""
    result = simulation.measure(steps=2_000, world_size=2, iters_per_epoch=1_000, repeats=1)
    quiet, losses = result["variants"]["metrics only"], result["variants"]["metrics + per-step losses"]
    assert quiet["identical_to_every_event"] is True
    assert quiet["simulate_s"] >= 0 and quiet["simulate_every_event_s"] > 0 and quiet["bare_loop_s"] > 0
    assert losses["simulate_s"] > 0 and losses["bare_loop_s"] > 0


def test_simulation_benchmark_main_quick_writes_nothing(tmp_path, monkeypatch):
    """--quick prints the table and leaves results/simulation.json alone."""
    target = tmp_path / "simulation.json"
    monkeypatch.setattr(simulation, "RESULTS", target)
    result = simulation.main(["--quick"])
    assert result["quick"] is True and not target.exists()
