"""Every benchmark runs end to end on a tiny size (no timing is asserted)."""

import pytest

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """Quick runs must not overwrite the real results under benchmarks/results/."""
    from benchmarks import _common

    monkeypatch.setattr(_common, "RESULTS", tmp_path / "results")


def test_loop_overhead_runs_quick_with_the_peers_that_are_installed():
    """The loop benchmark measures every available variant, the hook dispatch and the driver alone."""
    from benchmarks import loop_overhead

    result = loop_overhead.run(quick=True)
    rows = result["variants"]
    assert {"raw PyTorch loop", "pimm_fn, no hooks", "pimm_fn, standard stack", "pimm_fn, 10 trivial hooks"} <= set(
        rows
    )
    assert all(r["intervals"] > 0 and r["step_us_p10"] > 0 for r in rows.values())
    assert set(result["dispatch_us_per_event"]) == {"pimm_fn process(), 10 hooks", "Python list of 10 callbacks"}
    assert set(result["driver_alone_us_per_step"]) == {"no hooks", "standard stack"}
    assert all(us > 0 for us in result["driver_alone_us_per_step"].values())


@pytest.mark.parametrize(
    "peer, row",
    [
        ("lightning", "Lightning, 10 no-op callbacks"),
        ("ignite", "Ignite Engine, 10 handlers"),
        ("torchtnt", "torchtnt, 10 callbacks"),
    ],
)
def test_each_peer_trains_the_same_workload(peer, row):
    """A peer that is installed trains the benchmark's workload and reports its step stamps."""
    pytest.importorskip(peer)
    from benchmarks import loop_overhead

    fn = loop_overhead.available().get(row)
    if fn is None:
        pytest.skip(f"{peer} is installed but does not import cleanly")
    assert len(fn(12)) == 12


def test_checkpoint_io_runs_quick():
    """The checkpoint benchmark saves and loads a tiny state every way and compares to raw DCP."""
    from benchmarks import checkpoint_io

    size = checkpoint_io.run(quick=True)["sizes"]["2MB"]
    assert size["save_ratio_vs_dcp"]["n"] == 1 and size["load_ratio_vs_dcp"]["median"] > 0


def test_async_save_runs_quick():
    """The async-save benchmark measures a sync and an async save of a tiny state."""
    from benchmarks import async_save

    size = async_save.run(quick=True)["sizes"]["2MB"]
    assert size["holdup_ratio"]["n"] == 1 and size["sync_save_s"]["median"] > 0


def test_main_writes_results_md(tmp_path, monkeypatch):
    """python -m benchmarks --quick writes RESULTS.md with the machine and every table."""
    from benchmarks import __main__ as entry

    monkeypatch.setattr(entry, "HERE", tmp_path)
    monkeypatch.setattr(entry, "OTHERS", ())
    entry.main(["--quick"])
    text = (tmp_path / "RESULTS.md").read_text()
    assert "machine:" in text and "Loop overhead" in text and "Checkpoint throughput" in text and "Async save" in text


def test_soak_runs_quick_and_stays_flat():
    """500 steps with a save every 100 and keep_snapshots=3: no file, thread or descriptor is left growing."""
    from benchmarks import soak

    result = soak.run(quick=True)
    assert result["end"]["step"] == 500 and len(result["samples"]) >= 2
    goal = result["goal"]
    assert goal["fds_threads_files_constant"] and goal["disk_constant"], result["peak"]


def test_soak_history_measures_under_50_bytes_a_logged_step():
    """--history's two measurements, small: History fed records, and a real pf.loop with log_every(1)."""
    from benchmarks import soak

    fed, looped = soak.history_fed(20_000), soak.history_in_a_run(2_000)
    assert fed["records"] == 20_000 + 2 * 20 and fed["bytes_per_step"] < soak.GOAL_HISTORY_BYTES, fed
    assert looped["records"] >= 2_000 and looped["bytes_per_step"] < soak.GOAL_HISTORY_BYTES, looped


def test_the_exit_code_benchmark_runs_each_kind_once_under_torchrun():
    """One finished 2-rank run of the plain torch script and one of pimm_fn's, each counted by its exit code."""
    from benchmarks import exit_codes

    result = exit_codes.measure(runs=1, busy=0)
    for kind in exit_codes.KINDS:
        assert sum(result[kind]["exit_codes"].values()) == 1 and result[kind]["ranks_finished"] == 2, result
    assert result["pimm_fn"]["status_codes"] == {"0": 1}, result  # finished, whatever torchrun's exit code


def test_soak_whole_run_holds_under_50_bytes_a_step_once_its_trace_is_full():
    """--whole, small: a run logging every step, evaluating and saving snapshots holds < 50 B a step, history included."""
    from benchmarks import soak

    result = soak.whole_run(4_500, keep_trace=500, fill=1_500, samples=1)
    assert result["trace"] == 500 and result["records"] >= 4_500, result
    assert result["bytes_per_step"] < soak.GOAL_RUN_BYTES, result  # an AfterStep and its Log kept: ~750 B a step


def test_soak_long_epoch_holds_under_50_bytes_a_step():
    """--long-epoch, small: one epoch whose outputs no hook reads holds < 50 B a step (each step's kept: ~360 B)."""
    from benchmarks import soak

    result = soak.long_epoch(3_000, fill=1_500)
    assert result["measured_to"] == 2_500 and result["bytes_per_step"] < soak.GOAL_RUN_BYTES, result


def test_the_layout_benchmark_counts_this_checkout_and_its_two_trips():
    """--root this checkout: its modules and folders counted, and a save and a resume each enter some modules."""
    import pathlib

    from benchmarks import layout

    root = pathlib.Path(layout.__file__).resolve().parent.parent
    found = layout.measure(root)
    assert found["modules"] == len(list((root / "pimm_fn").rglob("*.py"))) and found["floors"] >= 2, found
    for trip in ("save", "resume"):
        entered = found["trips"][trip]
        assert 0 < entered["modules"] <= entered["functions"] and "pimm_fn.checkpoint.saving" in entered["entered"], (
            found
        )
