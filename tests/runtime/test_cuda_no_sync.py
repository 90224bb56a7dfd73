"""On a GPU: quiet and walked steps make no host sync a hook did not ask for (``torch.cuda.set_sync_debug_mode``).

Under sync-debug mode ``"error"`` any synchronizing CUDA call raises. Each
step a hook does not read is run in that mode: the loop's own work, the
default step, hooks that never read the outputs, a slotted hook and a save
cadence with its checkpoint routed to a handler that writes nothing. The
steps where the run itself reads (each epoch's end, where the outputs that
waited are read in one transfer) run outside it. Skipped without CUDA; on
a CPU the reads are counted instead (``test_reads_on_demand``).
"""

import pytest
import torch

import pimm_fn as pf
from benchmarks.host_reads import CountsSteps, noop
from pimm_fn.core.effects import SaveCheckpoint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

IPE, EPOCHS = 6, 3


def _cuda_run(hooks, save_dir, **training):
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
    data = [(torch.randn(8, 4, device=device), torch.randn(8, 1, device=device)) for _ in range(IPE)]
    return pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.01, foreach=True),
        data,
        step_fn=pf.TrainStep(loss_fn=torch.nn.functional.mse_loss),
        hooks=hooks,
        max_epochs=EPOCHS,
        save_dir=save_dir,
        handlers={SaveCheckpoint: lambda effect, state, ctx: ()},
        training=pf.Training(**training),
        watching=pf.Watching(console=False),
    )


@pytest.mark.parametrize(
    "hooks",
    [[], [noop], [noop, CountsSteps()], [pf.chain(noop, CountsSteps(), name="c"), pf.save_every(4)]],
    ids=["none", "plain", "slotted", "chain_and_save"],
)
@pytest.mark.parametrize("exact_retry", [True, False])
def test_steps_no_hook_reads_never_synchronize(tmp_path, hooks, exact_retry):
    run = _cuda_run(hooks, tmp_path, exact_retry=exact_retry)
    run.step()  # the first step initializes CUDA's RNG and the optimizer's state outside the check
    torch.cuda.synchronize()
    while not run.finished:
        ends_epoch = run.state.progress.global_step % IPE == IPE - 1
        if ends_epoch:
            run.step()  # the epoch's end reads what waited: a read the run asks for
            continue
        torch.cuda.set_sync_debug_mode("error")
        try:
            run.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert run.state.progress.global_step == IPE * EPOCHS
