"""How long a checkpoint holds training up: background (async) save vs synchronous.

A real ``pf.loop`` trains an MLP with Adam whose state (weights and both
moments) is about 100 or 500 MB, with ``save_every(S)`` or
``save_every(S, async_save=True)``; the same process alternates the two in
paired rounds. For the save at step S:

* *sync save*: seconds the save handler ran (training stops that long);
* *hold-up*: seconds from the save request until the optimizer may change
  parameters again: the handler's own time plus any wait for staging before
  the next ``optimizer.step()``;
* *total delay*: from the save request until the write finished, the time
  those steps took beyond the pre-save step time (hold-up plus the slowdown
  of the steps that ran during the write).

Ratios are async / sync of the same round (min/median/max over rounds).
Background saves keep their CPU staging copy for the next save of the
process, so only the first save of a process meets fresh memory (page
faults). Each round therefore also runs a *first save* in a new process
(after the same small warm-up run): a real run's first background save, in
a loop that readies its staging memory after the first optimizer step (the
loop does so whenever a hook saves in the background). Dropping the staging
area inside one process would not do: the allocator then reuses memory the
process already touched.

Run: ``python -m benchmarks.async_save [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks._common import fmt_spread, print_table, spread, write_result

SIZES_MB = (100, 500)
SAVE_AT, AFTER = 4, 12  # the save happens after step SAVE_AT; AFTER more steps run during the write


def _setup(mb: float):
    import torch

    from benchmarks.checkpoint_io import make_state

    torch.set_num_threads(1)
    net, _ = make_state(mb)
    width = net[0].in_features

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.stamps = []

        def forward(self, batch):
            self.stamps.append(time.perf_counter())
            return {"loss": self.net(batch).pow(2).mean()}

    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, width, generator=g) for _ in range(SAVE_AT + AFTER)]
    return Model(), batches


def one_run(mb: float, async_save: bool) -> dict:
    import torch

    import pimm_fn as pf
    from pimm_fn.core.effects import SaveCheckpoint
    from pimm_fn.runtime.handlers import checkpointing as handlers

    model, batches = _setup(mb)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    seen = {}

    def timed_save(effect, state, ctx):
        if effect.final:
            return handlers.save_checkpoint(effect, state, ctx)
        if "request" in seen:
            return ()  # only the first cadence save is measured; later ones would overlap the window
        seen["request"] = time.perf_counter()
        out = handlers.save_checkpoint(effect, state, ctx)
        seen["returned"] = time.perf_counter()
        seen["pending"] = ctx.saver.pending
        return out

    with tempfile.TemporaryDirectory(prefix="pimm-async-bench-") as tmp:
        run = pf.loop(
            model,
            opt,
            batches,
            hooks=[pf.save_every(SAVE_AT, async_save=async_save)],
            max_epochs=1,
            save_dir=tmp,
            watching=pf.Watching(console=False),
            handlers={SaveCheckpoint: timed_save},
        )
        while run.state.progress.global_step < SAVE_AT + AFTER:
            run.step()
        pending = seen.get("pending")
        done_at = pending.wait() and pending.done_at if pending is not None else seen["returned"]
        stamps = model.stamps
        run.run()  # the final (synchronous) save, untimed
    before = [b - a for a, b in zip(stamps[1:SAVE_AT], stamps[2:SAVE_AT])]  # steps 2..SAVE_AT, before the save
    base = statistics.median(before)
    req = seen["request"]
    handler = seen["returned"] - req
    waited = pending.waited_s if pending is not None else 0.0
    # Without the save, the first forward after the request would start at once and the next ones
    # one base step apart: the delay is how much later the first forward after the write's end came.
    after = [s for s in stamps if s > req]
    end = next((s for s in after if s >= done_at), after[-1])
    steps_in = sum(1 for s in after if s <= end)
    total = (end - req) - (steps_in - 1) * base
    return {
        "base_step_s": base,
        "handler_s": handler,
        "staging_wait_s": waited,
        "holdup_s": handler + waited,
        "total_delay_s": max(total, handler + waited),
        "write_s": (done_at - req),
        "steps_during_write": steps_in,
    }


def first_save(mb: float) -> dict:
    """``one_run(mb, async)`` as the first background save of a new process, after the warm-up."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.async_save", "--first-save", str(mb)],
        cwd=pathlib.Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(mb: float, rounds: int) -> dict:
    one_run(min(mb, 5), True)  # warm-up: imports, thread start, the gloo-free DCP path
    rows = {"sync": [], "async": [], "first": []}
    for r in range(rounds):
        for mode in ("sync", "first", "async") if r % 2 == 0 else ("async", "first", "sync"):
            rows[mode].append(first_save(mb) if mode == "first" else one_run(mb, mode == "async"))
    sync, asyn, first = rows["sync"], rows["async"], rows["first"]
    return {
        "runs": rows,
        "sync_save_s": spread(x["handler_s"] for x in sync),
        "async_holdup_s": spread(x["holdup_s"] for x in asyn),
        "async_total_delay_s": spread(x["total_delay_s"] for x in asyn),
        "holdup_ratio": spread(a["holdup_s"] / s["handler_s"] for a, s in zip(asyn, sync)),
        "first_save_holdup_s": spread(x["holdup_s"] for x in first),
        "holdup_ratio_first_save": spread(a["holdup_s"] / s["handler_s"] for a, s in zip(first, sync)),
        "total_delay_ratio": spread(a["total_delay_s"] / s["handler_s"] for a, s in zip(asyn, sync)),
        "step_s": spread(x["base_step_s"] for x in sync + asyn),
    }


def run(quick: bool = False, sizes=SIZES_MB, rounds: int = 3) -> dict:
    """Measure, print the table and write ``results/async_save.json``."""
    if quick:
        sizes, rounds = (2,), 1
    result = {"quick": quick, "rounds": rounds, "save_at_step": SAVE_AT, "sizes": {}}
    for mb in sizes:
        result["sizes"][f"{mb}MB"] = measure(mb, rounds)
    table(result)
    write_result("async_save", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    rows = []
    for name, s in result["sizes"].items():
        rows.append(
            [
                name,
                f"{s['step_s']['median'] * 1e3:.0f}",
                fmt_spread(s["sync_save_s"], "s", 3),
                fmt_spread(s["async_holdup_s"], "s", 3),
                fmt_spread(s["holdup_ratio"], digits=3),
                fmt_spread(s["holdup_ratio_first_save"], digits=3),
                fmt_spread(s["total_delay_ratio"], digits=3),
            ]
        )
    print_table(
        "Async save: training held up, async / sync (median [min..max] over paired rounds)",
        ["state", "step ms", "sync save", "async hold-up", "hold-up / sync", "first save", "total delay / sync"],
        rows,
        file=file,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES_MB))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-save", type=float, metavar="MB", help="print one first-save run as JSON (internal)")
    args = parser.parse_args(argv)
    if args.first_save is not None:
        one_run(min(args.first_save, 5), True)  # the same warm-up as measure()
        print(json.dumps(one_run(args.first_save, True)))
        return
    run(quick=args.quick, sizes=args.sizes, rounds=args.rounds)


if __name__ == "__main__":
    main()
