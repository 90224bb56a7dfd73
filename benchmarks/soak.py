"""A long run stays flat: memory, open files, threads and disk use after 200 000 steps.

A real ``pf.loop`` trains a tiny model (one linear layer, SGD with
momentum, batches in memory, one torch thread) for 200 000 quiet steps with
``save_every(100, snapshots=True)``, ``Saving(keep=keep_last(3))`` and an
evaluation with ``best_on`` every 1 000 steps, so 2 000 checkpoints are
published and pruned and 200 evaluations run. Quiet steps: between saves
and evaluations no hook runs (the loop's overhead, not the model, is what a
leak would come from).

After a warm-up of 2 000 steps (the first saves and prunes, the torch and
DCP thread pools, the allocator's arenas) the process samples, every
``steps / 10`` steps and at the end:

* resident memory (``VmRSS``), and the Python objects the collector tracks;
* open file descriptors (``/proc/self/fd``);
* threads (the OS threads of the process, and Python's);
* bytes and files under ``save_dir``;
* the length of ``run.trace`` (the executed effects, kept by design: one
  entry per save or evaluation, a few hundred bytes each).

Goal: resident memory within +50 MB of the warm-up figure, and file
descriptors, threads and disk use constant after it.

Run: ``python -m benchmarks.soak [--quick] [--steps N]`` (a few minutes;
``--quick``: 500 steps). Writes ``results/soak.json``.

``--history`` measures instead what ``run.history`` holds a step when every
step is logged (``log_every(1)``), two ways: a real ``pf.loop`` (a tiny
model, a cheap step function, the console off, ``--loop-steps``, default
1 000 000: some minutes) and the ``History`` object fed 1 000 000 records of the shape
``log_every(1)`` writes (``epoch, iter, of, loss, lr`` a step, an epoch
mean and an evaluation every 1 000 steps). Both under ``tracemalloc``: the
bytes the history holds (the real run: traced memory with the history,
minus after it is dropped), per step. Goal: under 50 bytes a step.
Writes ``results/soak_history.json``.

``--whole`` measures what the whole run holds a step, not its history
alone: a real ``pf.loop`` (the tiny model, its real step) with
``log_every(1)``, an evaluation every 250 steps and ``save_every(500,
snapshots=True)`` under ``keep_last(3)``, for ``Watching(keep_trace=)`` at
its default (10 000), 1 000 and 0. ``tracemalloc`` starts before ``loop()``
builds the run; after ``--fill`` steps (12 000: every bounded buffer full)
the traced memory is taken (after ``gc.collect()``), and the run trains on
to ``--steps`` (default 1 000 000: some minutes a configuration), sampling
it: (end - fill) / (steps - fill) bytes a step. Goal: under 50 bytes a
step, the history included. ``--after-fill`` trains 20 000 steps after the
fill instead (the issue's measure, a minute a configuration). Tracing must
start before the fill: a full buffer (the trace) drops an entry for each
one it takes, and ``tracemalloc`` counts a block freed only if it saw it
allocated; traced from after the fill, every entry dropped was never
counted and every new one is, so the default trace's turnover alone reads
as ~375 B a step of growth where nothing grows. Writes
``results/soak_whole.json`` (``soak_whole_after_fill.json``).

``--long-epoch`` measures a run whose outputs no hook reads, in one epoch of
``--steps`` (default 1 000 000): the step's outputs wait on the device until
read, so what waits must stay bounded within the epoch. The step function
samples the traced memory inside the one ``run()``. Goal: under 50 bytes a
step. Writes ``results/soak_long_epoch.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time

from benchmarks._common import print_table, write_result

STEPS, WARMUP, SAVE_EVERY, KEEP, EVALUATE_EVERY, EPOCH = 200_000, 2_000, 100, 3, 1_000, 1_000
GOAL_RSS_MB = 50


def _status(field: str) -> int:
    """A number from ``/proc/self/status`` (``VmRSS`` in kB, ``Threads``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def _disk(root: str) -> tuple[int, int]:
    """(bytes, files) under ``root``."""
    size = files = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(folder, name))
                files += 1
            except OSError:  # pruned while walking
                pass
    return size, files


def sample(run, save_dir: str, started: float) -> dict:
    """The figures of the process and the run now."""
    gc.collect()
    size, files = _disk(save_dir)
    return {
        "step": run.state.progress.global_step,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "rss_mb": round(_status("VmRSS") / 1024, 1),
        "python_objects": len(gc.get_objects()),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": _status("Threads"),
        "python_threads": threading.active_count(),
        "disk_bytes": size,
        "files": files,
        "trace": len(run.trace),
    }


def _workload():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 1)

        def forward(self, batch):
            x, y = batch
            return {"loss": ((self.linear(x) - y) ** 2).mean()}

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EPOCH, 4, 8, generator=g)
    batches = [(x[i], x[i].sum(1, keepdim=True)) for i in range(EPOCH)]  # one epoch, re-iterated
    probe = (x[:16].reshape(-1, 8), x[:16].reshape(-1, 8).sum(1, keepdim=True))

    def score(model):
        with torch.no_grad():
            return {"score": -float(((model.linear(probe[0]) - probe[1]) ** 2).mean())}

    return model, optimizer, batches, score


def measure(steps: int = STEPS, warmup: int = WARMUP, samples: int = 10, evaluate_every: int = EVALUATE_EVERY) -> dict:
    """Train ``steps`` steps, sampling after ``warmup`` and ``samples`` times more; returns the samples."""
    import pimm_fn as pf

    model, optimizer, batches, score = _workload()
    with tempfile.TemporaryDirectory(prefix="pimm_fn_soak_") as save_dir:
        hooks = [
            pf.evaluate_every(evaluate_every, score, name="score"),
            pf.save_every(SAVE_EVERY, snapshots=True),
            pf.best_on("score"),
        ]
        run = pf.loop(
            model,
            optimizer,
            batches,
            hooks=hooks,
            max_steps=steps,
            save_dir=save_dir,
            saving=pf.Saving(keep=pf.keep_last(KEEP)),
            watching=pf.Watching(console=False),
        )
        started = time.perf_counter()
        run.run(steps=warmup)
        taken = [sample(run, save_dir, started)]
        every = max((steps - warmup) // samples, 1)
        while not run.finished:
            left = steps - run.state.progress.global_step
            if left > every:
                run.run(steps=every)
            else:
                run()  # the last steps and the final save
            taken.append(sample(run, save_dir, started))
    return {"samples": taken}


def summary(result: dict) -> dict:
    """Start (after warm-up) and end figures, the change, the peak after warm-up, and whether the goal holds.

    Constant means never above the warm-up figure at any sample (the end may
    be below it: the run closes its log file when it finishes).
    """
    samples = result["samples"]
    start, end = samples[0], samples[-1]
    flat = ("fds", "threads", "python_threads", "files")
    keys = ("rss_mb", "python_objects", *flat, "disk_bytes", "trace")
    growth = {k: round(end[k] - start[k], 1) for k in keys}
    peak = {k: max(s[k] for s in samples) for k in keys}
    # Disk use is constant up to what changes inside the files (a step number's digits in a marker).
    disk_flat = peak["disk_bytes"] - start["disk_bytes"] <= 0.01 * start["disk_bytes"] + 4096
    return {
        "start": start,
        "end": end,
        "growth": growth,
        "peak": peak,
        "goal": {
            "rss_within_mb": GOAL_RSS_MB,
            "rss_ok": peak["rss_mb"] - start["rss_mb"] <= GOAL_RSS_MB,
            "fds_threads_files_constant": all(peak[k] == start[k] for k in flat),
            "disk_constant": disk_flat,
        },
    }


def run(quick: bool = False, steps: int | None = None) -> dict:
    """Measure, print the table and write ``results/soak.json``."""
    steps = steps or (500 if quick else STEPS)
    # The warm-up holds the first evaluation and KEEP + 1 saves, so that every file exists and one was pruned.
    warmup = min(WARMUP, max(steps // 2, (KEEP + 1) * SAVE_EVERY))
    if warmup >= steps:
        raise ValueError(f"soak: 'steps' must be > {warmup}, the warm-up (got {steps})")
    evaluate_every = min(EVALUATE_EVERY, warmup // 2)
    result = {
        "quick": quick,
        "steps": steps,
        "warmup_steps": warmup,
        "save_every": SAVE_EVERY,
        "keep_snapshots": KEEP,
        "evaluate_every": evaluate_every,
        "steps_per_epoch": EPOCH,
    }
    result.update(measure(steps, warmup, samples=2 if quick else 10, evaluate_every=evaluate_every))
    result.update(summary(result))
    table(result)
    write_result("soak", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    columns = (
        "step",
        "elapsed_s",
        "rss_mb",
        "python_objects",
        "fds",
        "threads",
        "python_threads",
        "disk_bytes",
        "files",
        "trace",
    )
    rows = [[str(s[c]) for c in columns] for s in result["samples"]]
    print_table(
        f"Soak: {result['steps']} steps, save every {result['save_every']}, keep_snapshots="
        f"{result['keep_snapshots']} (first row: after {result['warmup_steps']} warm-up steps)",
        list(columns),
        rows,
        file=file,
    )
    print(f"growth after warm-up (end - start): {result['growth']}", file=file)
    print(f"peak after warm-up: {result['peak']}", file=file)
    print(f"goal: {result['goal']}", file=file)


GOAL_HISTORY_BYTES = 50


def history_fed(records: int = 1_000_000, epoch: int = EPOCH) -> dict:
    """Bytes per step a ``History`` holds, fed ``records`` training records as ``log_every(1)`` writes them."""
    import tracemalloc

    from pimm_fn.core.frozen import FrozenMap
    from pimm_fn.runtime.logs.history import History

    tracemalloc.start()
    history, before, started = History(), tracemalloc.get_traced_memory()[0], time.perf_counter()
    for step in range(1, records + 1):
        e, i = divmod(step - 1, epoch)
        values = {"epoch": e, "iter": i + 1, "of": epoch, "loss": 1.0 / step, "lr": 0.1 * (1 - step / records)}
        history.append(step, "train", FrozenMap(values))
        if i + 1 == epoch:
            history.append(step, "epoch", FrozenMap({"epoch": e, "loss": 0.5 / step}))
            history.append(step, "eval/val", FrozenMap({"score": step / records}))
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "steps": records,
        "records": len(history),
        "bytes_per_step": round(held / records, 2),
        "seconds": round(time.perf_counter() - started, 1),
    }


def history_in_a_run(steps: int = 100_000) -> dict:
    """Bytes per step ``run.history`` holds after a real ``pf.loop`` logging every step."""
    import tracemalloc

    import torch

    import pimm_fn as pf
    from pimm_fn.runtime.logs.history import History

    model, optimizer, batches, score = _workload()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(sgd, lambda s: 1 - s / steps)

    def cheap(model, optimizer, batch, *, scheduler=None, scaler=None):
        """No forward nor backward: the loop and its logging are what is measured."""
        optimizer.step()  # no gradients: nothing changes, but the scheduler follows the optimizer
        scheduler.step()
        return {"loss": 1.0 / (scheduler.last_epoch + 1), "lr": scheduler.get_last_lr()[0]}

    run = pf.loop(
        model,
        sgd,
        batches,
        hooks=[pf.evaluate_every(EPOCH, score, name="val"), pf.log_every(1)],
        max_steps=steps,
        step_fn=cheap,
        scheduler=scheduler,
        watching=pf.Watching(console=False),
    )
    tracemalloc.start()
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    gc.collect()
    with_history = tracemalloc.get_traced_memory()[0]
    records = len(run.history)
    run.ctx.logs.history = History()
    gc.collect()
    held = with_history - tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"steps": steps, "records": records, "bytes_per_step": round(held / steps, 2), "seconds": round(seconds, 1)}


def history(records: int = 1_000_000, loop_steps: int = 1_000_000) -> dict:
    """Both history measurements; prints them and writes ``results/soak_history.json``."""
    result = {"fed": history_fed(records), "loop": history_in_a_run(loop_steps), "goal_bytes": GOAL_HISTORY_BYTES}
    result["ok"] = all(result[k]["bytes_per_step"] < GOAL_HISTORY_BYTES for k in ("fed", "loop"))
    rows = [
        [name, str(r["steps"]), str(r["records"]), str(r["bytes_per_step"]), str(r["seconds"])]
        for name, r in (("History fed records", result["fed"]), ("pf.loop, log_every(1)", result["loop"]))
    ]
    print_table("run.history: bytes held a step, log_every(1)", ["how", "steps", "records", "bytes/step", "s"], rows)
    print(f"goal: < {GOAL_HISTORY_BYTES} bytes/step: {result['ok']}")
    write_result("soak_history", result)
    return result


GOAL_RUN_BYTES = 50
WHOLE_EVALUATE_EVERY, WHOLE_SAVE_EVERY, WHOLE_FILL, WHOLE_AFTER = 250, 500, 12_000, 20_000
KEEP_TRACES = ("default", 1_000, 0)  # Watching(keep_trace=): the default (10 000), fewer, none


def whole_run(steps: int = 1_000_000, keep_trace="default", *, fill: int = WHOLE_FILL, samples: int = 10) -> dict:
    """Bytes per step the whole run holds once every bounded buffer is full, under ``tracemalloc``.

    A real ``pf.loop`` (the tiny model, its real step) with ``log_every(1)``,
    an evaluation every 250 steps and ``save_every(500, snapshots=True)``
    under ``keep_last(3)``: ``fill`` steps fill the trace (``keep_trace``)
    and every other bounded buffer, the traced memory is taken (after
    ``gc.collect()``), then it trains on to ``steps``, sampling it
    ``samples`` times: (end - fill) / (steps - fill). Tracing starts before
    ``loop()`` builds the run (the module's docstring says why it must). The
    history (unbounded by design) is measured apart, by dropping it at the end.
    """
    import tracemalloc

    import pimm_fn as pf
    from pimm_fn.runtime.logs.history import History

    if not 0 < fill < steps:
        raise ValueError(f"soak: 'fill' must be > 0 and < steps={steps} (got {fill})")
    model, optimizer, batches, score = _workload()
    watching = (
        pf.Watching(console=False) if keep_trace == "default" else pf.Watching(console=False, keep_trace=keep_trace)
    )
    hooks = [
        pf.log_every(1),
        pf.evaluate_every(WHOLE_EVALUATE_EVERY, score, name="score"),
        pf.save_every(WHOLE_SAVE_EVERY, snapshots=True),
    ]

    def traced() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    with tempfile.TemporaryDirectory(prefix="pimm_fn_soak_") as save_dir:
        tracemalloc.start()
        started = time.perf_counter()
        run = pf.loop(
            model,
            optimizer,
            batches,
            hooks=hooks,
            max_steps=steps + 1,
            save_dir=save_dir,
            saving=pf.Saving(keep=pf.keep_last(KEEP)),
            watching=watching,
        )
        run.run(steps=fill)
        full, taken = traced(), []
        every = max((steps - fill) // samples, 1)
        while (done := run.state.progress.global_step) < steps:
            run.run(steps=min(every, steps - done))
            step, held = run.state.progress.global_step, traced()
            taken.append(
                {
                    "step": step,
                    "traced_mb": round(held / 1e6, 2),
                    "bytes_per_step": round((held - full) / (step - fill), 2),
                    "elapsed_s": round(time.perf_counter() - started, 1),
                }
            )
        end, trace, records = traced(), len(run.trace), len(run.history)
        run.ctx.logs.history = History()
        history = end - traced()
        run()  # the last step and the final save: the run closes what it opened
        tracemalloc.stop()
    return {
        "steps": steps,
        "fill_steps": fill,
        "keep_trace": keep_trace,
        "trace": trace,
        "records": records,
        "samples": taken,
        "traced_at_fill_mb": round(full / 1e6, 2),
        "bytes_per_step": round((end - full) / (steps - fill), 2),
        "history_bytes_per_step": round(history / steps, 2),
        "seconds": round(time.perf_counter() - started, 1),
    }


def whole(steps: int = 1_000_000, fill: int = WHOLE_FILL, keep_traces=KEEP_TRACES, name: str = "soak_whole") -> dict:
    """``whole_run`` for each ``keep_trace``; prints the table and writes ``results/<name>.json``.

    The file is written again after each configuration: a 1M-step run takes long on a busy machine.
    """
    result = {"goal_bytes": GOAL_RUN_BYTES, "runs": []}
    for keep_trace in keep_traces:
        result["runs"].append(whole_run(steps, keep_trace, fill=fill))
        result["ok"] = all(r["bytes_per_step"] < GOAL_RUN_BYTES for r in result["runs"])
        write_result(name, result)
    rows = [
        [
            str(r["keep_trace"]),
            str(r["steps"]),
            str(r["trace"]),
            str(r["bytes_per_step"]),
            str(r["history_bytes_per_step"]),
            str(r["seconds"]),
        ]
        for r in result["runs"]
    ]
    print_table(
        f"The whole run: bytes held a step after {fill} steps, log_every(1), evaluate_every"
        f"({WHOLE_EVALUATE_EVERY}), save_every({WHOLE_SAVE_EVERY}, snapshots=True), keep_last({KEEP})",
        ["keep_trace", "steps", "trace", "bytes/step", "of which history", "s"],
        rows,
    )
    print(f"goal: < {GOAL_RUN_BYTES} bytes/step: {result['ok']}")
    return result


def long_epoch(steps: int = 1_000_000, *, fill: int = 10_500) -> dict:
    """Bytes per step a run holds in one epoch of ``steps`` steps whose outputs no hook reads.

    Nothing but the step runs (``hooks=[]``): its outputs (the default step's
    loss, gradient norm and learning rate, left on the device) wait unread,
    read every ``WAIT_AT_MOST`` steps (before: only at the epoch's end). The
    step function samples the traced memory as the steps ``fill`` and
    ``steps - WAIT_AT_MOST // 2`` begin (as many outputs wait at both when
    what waits is bounded), inside the one ``run()`` (whose end reads what waits).
    """
    import itertools
    import tracemalloc

    import pimm_fn as pf
    from pimm_fn.runtime.engine.outputs import WAIT_AT_MOST

    last = steps - WAIT_AT_MOST // 2
    if not 0 < fill < last or (last - fill) % WAIT_AT_MOST:
        raise ValueError(
            f"soak: 'fill' must be < {last} and differ from it by a multiple of {WAIT_AT_MOST} (got {fill})"
        )
    model, optimizer, batches, _ = _workload()
    epoch = (batches * -(-steps // len(batches)))[:steps]  # the batches repeated: one epoch of ``steps``
    calls, held = itertools.count(1), {}

    def sampling(model, optimizer, batch, *, scheduler=None, scaler=None):
        """The default step, sampling the traced memory as the steps ``fill`` and ``last`` begin."""
        step = next(calls)
        if step in (fill, last):
            gc.collect()
            held[step] = tracemalloc.get_traced_memory()[0]
        return pf.train_step(model, optimizer, batch, scheduler=scheduler, scaler=scaler)

    tracemalloc.start()
    started = time.perf_counter()
    pf.loop(model, optimizer, epoch, hooks=[], max_epochs=1, step_fn=sampling, watching=pf.Watching(console=False))()
    tracemalloc.stop()
    result = {
        "steps": steps,
        "fill_steps": fill,
        "measured_to": last,
        "bytes_per_step": round((held[last] - held[fill]) / (last - fill), 2),
        "seconds": round(time.perf_counter() - started, 1),
        "goal_bytes": GOAL_RUN_BYTES,
    }
    print_table(
        "One epoch no hook reads the outputs of: bytes held a step",
        ["steps", "from step", "to step", "bytes/step", "s"],
        [[str(steps), str(fill), str(last), str(result["bytes_per_step"]), str(result["seconds"])]],
    )
    write_result("soak_long_epoch", result)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 steps: checks that everything runs")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--history", action="store_true", help="bytes a step run.history holds with log_every(1)")
    parser.add_argument("--records", type=int, default=1_000_000, help="--history: records fed to History")
    parser.add_argument("--loop-steps", type=int, default=1_000_000, help="--history: steps of the real run")
    parser.add_argument(
        "--whole",
        action="store_true",
        help="bytes a step the whole run holds with log_every(1), for keep_trace default, 1000, 0",
    )
    parser.add_argument("--fill", type=int, default=WHOLE_FILL, help="--whole: steps that fill the bounded buffers")
    parser.add_argument(
        "--keep-trace",
        nargs="+",
        default=list(KEEP_TRACES),
        help="--whole: the keep_trace values to measure ('default' or a count), in order",
    )
    parser.add_argument(
        "--after-fill",
        action="store_true",
        help=f"--whole: {WHOLE_AFTER} steps after the fill, not to --steps (results/soak_whole_after_fill.json)",
    )
    parser.add_argument(
        "--long-epoch",
        action="store_true",
        help="bytes a step one epoch of --steps holds when no hook reads the step's outputs",
    )
    args = parser.parse_args(argv)
    if args.long_epoch:
        long_epoch(args.steps or 1_000_000)
    elif args.whole:
        keep = [k if k == "default" else int(k) for k in args.keep_trace]
        if args.after_fill:
            whole(args.fill + WHOLE_AFTER, args.fill, keep, name="soak_whole_after_fill")
        else:
            whole(args.steps or 1_000_000, args.fill, keep)
    elif args.history:
        history(args.records, args.loop_steps)
    else:
        run(quick=args.quick, steps=args.steps)


if __name__ == "__main__":
    main()
