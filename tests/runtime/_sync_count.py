"""Counting the reads of tensor values (device-to-host transfers on a GPU) a piece of code makes."""

from benchmarks.host_reads import READS, counting_reads  # noqa: F401 - the one counter: the benchmark's


def quiet_steps(max_step: int, cadences, iters_per_epoch: int) -> list:
    """The steps on which no cadence fires and no epoch opens or closes."""
    return [k for k in range(1, max_step + 1) if all(k % c for c in cadences) and k % iters_per_epoch not in (0, 1)]


def reads_per_step(run) -> dict:
    """``{global step: [reads]}``: ``run`` stepped to its end, each ``step()`` call's tensor reads recorded."""
    found = {}
    while not run.finished:
        with counting_reads() as calls:
            run.step()
        found[run.state.progress.global_step] = list(calls)
    return found
