"""On a step where no hook is called, the loop reads no tensor's value: no host sync on a GPU."""

import json

import pytest
import torch
from torch.utils.data import DataLoader

import pimm_fn as pf
from _sync_count import quiet_steps, reads_per_step
from _tiny_workload import TinyNet, dataset, negative_mse, one_long_epoch

CADENCES = (7, 25, 10)  # evaluate_every, save_every, log_every
IPE = 5


def _standard_run(tmp_path, extra=(), first=(), **kwargs):
    torch.manual_seed(0)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # Adam reads its step count
    hooks = [
        *first,
        pf.evaluate_every(7, negative_mse, name="val"),
        pf.save_every(25),
        pf.best_on("score"),
        pf.log_every(10),
        *extra,
    ]
    data = DataLoader(dataset(), batch_size=8)  # unshuffled: a sampler's own reads are not the loop's
    return pf.loop(
        model,
        optimizer,
        data,
        hooks=hooks,
        max_epochs=8,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
        **kwargs,
    )


@pytest.mark.parametrize("on_nonfinite", ["raise", "warn"])
def test_the_standard_stack_reads_no_tensor_on_quiet_steps(tmp_path, on_nonfinite):
    """Zero reads on the quiet steps; the steps where log_every or an evaluation fires do read (the count can fail)."""
    reads = reads_per_step(_standard_run(tmp_path, training=pf.Training(on_nonfinite=on_nonfinite)))
    quiet = quiet_steps(40, CADENCES, IPE)
    assert quiet and {k: reads[k] for k in quiet} == dict.fromkeys(quiet, [])
    assert reads[10] and reads[20]


def test_skip_reads_the_loss_on_every_step_before_its_backward(tmp_path):
    """'skip' decides before the backward: the one policy that reads each loss (documented)."""
    reads = reads_per_step(_standard_run(tmp_path, training=pf.Training(on_nonfinite="skip")))
    assert all(reads[k] == ["item"] for k in quiet_steps(40, CADENCES, IPE))


def test_epoch_means_from_device_sums_equal_those_of_a_run_reading_every_step(tmp_path):
    """Outputs read in batches give the epoch means of outputs read every step, bit for bit."""
    _standard_run(tmp_path / "quiet")()
    _standard_run(tmp_path / "read", extra=[pf.chain(pf.log_every(1), name="every")])()

    def epoch_means(path):
        records = map(json.loads, (path / "log.jsonl").read_text().splitlines())
        return [r for r in records if r["kind"] == "epoch"]

    quiet, read = epoch_means(tmp_path / "quiet"), epoch_means(tmp_path / "read")
    assert len(quiet) == 8 and quiet == read[::2]  # the second log_every logs each epoch again


def test_a_long_epoch_read_every_wait_at_most_steps_has_the_epoch_mean_of_one_read_every_step():
    """A 2 500-step epoch whose outputs are read at steps 1 000, 2 000 and its end: the epoch mean, bit for bit."""
    from pimm_fn.runtime.engine.outputs import WAIT_AT_MOST

    def epoch_mean(*hooks):
        torch.manual_seed(0)
        model = TinyNet()
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.01),
            one_long_epoch(5 * WAIT_AT_MOST // 2),
            hooks=[pf.log_every(10 * WAIT_AT_MOST), *hooks],
            max_epochs=1,
            watching=pf.Watching(console=False),
        )
        run()
        return run.history.columns("epoch")["loss"]

    assert epoch_mean() == epoch_mean(pf.chain(pf.log_every(1), name="every"))[:1]


def test_a_weight_average_called_every_step_reads_no_outputs(tmp_path):
    """ema() declares reads_outputs=False: called every step, it leaves the outputs on the device."""
    reads = reads_per_step(_standard_run(tmp_path, first=[pf.ema(0.9)]))
    quiet = quiet_steps(40, CADENCES, IPE)
    assert {k: reads[k] for k in quiet} == dict.fromkeys(quiet, [])


def test_a_hook_of_your_own_called_every_step_gets_floats(tmp_path):
    """A hook that reads the outputs (the default) is handed floats, read on every step it is called."""
    seen = []

    def record(state, event):
        seen.append(event.outputs["loss"])
        return state, ()

    record.events = (pf.events.AfterStep,)
    _standard_run(tmp_path, extra=[record])()
    assert len(seen) == 40 and all(type(v) is float for v in seen)
