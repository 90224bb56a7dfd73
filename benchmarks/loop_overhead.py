"""Per-step overhead of the training loop, against a raw loop and peer libraries.

Every row trains the same tiny workload (a 2-layer MLP, batch 32, SGD, data
in memory, one torch thread). The model stamps the clock as its forward
starts, so a *step interval* is the time from one forward to the next: the
backward, the optimizer step, and whatever the loop does between steps.

The machine is noisy (raw steps wander by 2x), so each worker process runs
every variant once per round, in an order that rotates between rounds, and
the statistic is the 10th percentile of the step intervals: the steps the
scheduler left alone. The table pools the intervals of every round of every
process; min/median/max are over the per-round figures.

Also measured: the hook dispatch alone (pimm_fn folding 10 trivial hooks
over one event vs a Python list of 10 callbacks), the extra cost of a
step on which a save cadence fires, with saving routed to a no-op handler,
and the driver alone: the CPU time per step of ``Loop.run`` with a step
function that returns a ready loss tensor and does no torch work, without
hooks and with the standard stack (what the loop's own Python costs).

Run: ``python -m benchmarks.loop_overhead [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings

import attrs

from benchmarks._common import fmt_spread, percentile, print_table, spread, write_result
from pimm_fn.core import events as ev

BATCH, WIDTH, HIDDEN = 32, 64, 128
Q = 10  # the percentile compared


def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def _model():
    torch = _torch()

    class MLP(torch.nn.Module):
        """Two linear layers; stamps the clock as each forward starts."""

        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(WIDTH, HIDDEN)
            self.l2 = torch.nn.Linear(HIDDEN, 1)
            self.stamps = []

        def forward(self, batch):
            self.stamps.append(time.perf_counter_ns())
            x, y = batch
            return {"loss": torch.nn.functional.mse_loss(self.l2(torch.relu(self.l1(x))), y)}

    torch.manual_seed(0)
    return MLP()


class Batches:
    """Pre-made batches in memory; a re-iterable with ``len`` (a list would
    read as several loaders to Lightning)."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def _batches(steps):
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    return Batches([(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(steps)])


def _sgd(model):
    return _torch().optim.SGD(model.parameters(), lr=0.01)


# -- the variants: each trains `steps` steps and returns the forward stamps ----


def raw(steps):
    model, data = _model(), _batches(steps)
    opt = _sgd(model)
    for batch in data:
        opt.zero_grad(set_to_none=True)
        model(batch)["loss"].backward()
        opt.step()
    return model.stamps


@attrs.frozen
class _Trivial:
    """A hook that does nothing; ``i`` gives each of the ten its own identity."""

    i: int

    def __call__(self, state, event):
        return state, ()


TEN_TRIVIAL = [_Trivial(i) for i in range(10)]


@attrs.frozen
class _Slotted:
    """A hook with a slot of its own that changes nothing, called as ``hook(state, event)`` on every step."""

    i: int
    events = (ev.AfterStep,)

    def init(self):
        return (self.i,)  # its own object: no two hooks share a slot

    def __call__(self, state, event):
        return state, ()


@attrs.frozen
class _SlottedUpdate(_Slotted):
    """The same, declaring ``update(slot, state, event)``: its slot handed apart, no ``State`` built."""

    def update(self, slot, state, event):
        return slot, state, ()


def _evaluator(model):
    return {"acc": 0.0}


def _pimm(steps, hooks, save_dir=None, handlers=None):
    import pimm_fn as pf

    model, data = _model(), _batches(steps)
    pf.loop(
        model,
        _sgd(model),
        data,
        hooks=hooks,
        max_epochs=1,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
        handlers=handlers,
    )()
    return model.stamps


def pimm_bare(steps):
    return _pimm(steps, [])


def pimm_standard(steps):
    import pimm_fn as pf

    never = 10**9  # no cadence fires inside the timed steps; the final save comes after them
    hooks = [
        pf.evaluate_every(never, _evaluator, name="val"),
        pf.save_every(never),
        pf.best_on("acc"),
        pf.log_every(never),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        return _pimm(steps, hooks, save_dir=tmp)


def pimm_hooks10(steps):
    return _pimm(steps, TEN_TRIVIAL)


def _noop_handler(effect, state, ctx):
    return ()


def pimm_save_fires(steps):
    """save_every(1): a SaveCheckpoint on every step, run by a no-op handler."""
    import pimm_fn as pf
    from pimm_fn.core.effects import SaveCheckpoint

    with tempfile.TemporaryDirectory() as tmp:
        return _pimm(steps, [pf.save_every(1)], save_dir=tmp, handlers={SaveCheckpoint: _noop_handler})


def pimm_save_quiet(steps):
    """The same hook whose cadence never fires: the baseline of pimm_save_fires."""
    import pimm_fn as pf
    from pimm_fn.core.effects import SaveCheckpoint

    with tempfile.TemporaryDirectory() as tmp:
        return _pimm(steps, [pf.save_every(10**9)], save_dir=tmp, handlers={SaveCheckpoint: _noop_handler})


def lightning10(steps):
    import lightning as L

    model, data = _model(), _batches(steps)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            return self.net(batch)["loss"]

        def configure_optimizers(self):
            return _sgd(self.net)

    callbacks = [L.Callback() for _ in range(10)]
    trainer = L.Trainer(
        max_steps=steps,
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )
    with _quiet():
        trainer.fit(Module(), train_dataloaders=data)
    return model.stamps


def ignite10(steps):
    from ignite.engine import Engine, Events

    model, data = _model(), _batches(steps)
    opt = _sgd(model)

    def update(engine, batch):
        opt.zero_grad(set_to_none=True)
        loss = model(batch)["loss"]
        loss.backward()
        opt.step()
        return loss

    engine = Engine(update)
    for _ in range(10):
        engine.add_event_handler(Events.ITERATION_COMPLETED, lambda e: None)
    engine.run(data, max_epochs=1)
    return model.stamps


def tnt10(steps):
    with _quiet():
        from torchtnt.framework import train
        from torchtnt.framework.callback import Callback
        from torchtnt.framework.unit import TrainUnit

    model, data = _model(), _batches(steps)
    opt = _sgd(model)

    class Unit(TrainUnit):
        def train_step(self, state, batch):
            opt.zero_grad(set_to_none=True)
            loss = model(batch)["loss"]
            loss.backward()
            opt.step()
            return loss

    with _quiet():
        train(Unit(), data, max_epochs=1, callbacks=[Callback() for _ in range(10)])
    return model.stamps


@contextlib.contextmanager
def _quiet():
    logging.disable(logging.WARNING)
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


VARIANTS = {
    "raw PyTorch loop": (raw, None),
    "pimm_fn, no hooks": (pimm_bare, None),
    "pimm_fn, standard stack": (pimm_standard, None),
    "pimm_fn, 10 trivial hooks": (pimm_hooks10, None),
    "pimm_fn, save cadence fires every step (no-op save)": (pimm_save_fires, None),
    "pimm_fn, save cadence never fires": (pimm_save_quiet, None),
    "Lightning, 10 no-op callbacks": (lightning10, "lightning"),
    "Ignite Engine, 10 handlers": (ignite10, "ignite"),
    "torchtnt, 10 callbacks": (tnt10, "torchtnt"),
}


def available() -> dict:
    """The variants whose library is importable here."""
    found = {}
    for name, (fn, module) in VARIANTS.items():
        if module is not None:
            try:
                with _quiet():
                    __import__(module)
            except Exception:  # noqa: BLE001 - a peer that fails to import is skipped
                continue
        found[name] = fn
    return found


def intervals_us(stamps, warmup: int) -> list[float]:
    """Step intervals in microseconds, after dropping ``warmup`` steps."""
    kept = stamps[warmup:]
    return [(b - a) / 1e3 for a, b in zip(kept, kept[1:])]


def measure(rounds: int, steps: int, warmup: int, names=None) -> dict:
    """In this process: ``rounds`` paired rounds of every variant; returns intervals per round."""
    variants = available()
    names = [n for n in (names or variants) if n in variants]
    for name in names:  # warm-up: imports, allocator, first-call caches
        variants[name](max(warmup, 8) + 4)
    out = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            out[name].append(intervals_us(variants[name](steps + warmup), warmup))
    return out


def dispatch(repeats: int = 20000) -> dict:
    """µs per event: pimm_fn's process() of 10 trivial hooks vs a list of 10 callbacks."""
    from pimm_fn.core import events as ev
    from pimm_fn.core.fold import chain
    from pimm_fn.core.plan import initial_state
    from pimm_fn.core.processing import process

    hooks = chain(*TEN_TRIVIAL)
    state = initial_state(hooks.hooks, iters_per_epoch=10**9, max_epochs=1)

    class Null:
        def check(self, state, event, emitted):
            pass

        def execute(self, state, entry):
            return ()

    null = Null()
    callbacks = TEN_TRIVIAL
    event = ev.BeforeStep(1)
    rounds = {"pimm_fn process(), 10 hooks": [], "Python list of 10 callbacks": []}
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(repeats):
            process(hooks, state, event, null)
        t1 = time.perf_counter_ns()
        for _ in range(repeats):
            for cb in callbacks:
                cb(state, event)
        t2 = time.perf_counter_ns()
        rounds["pimm_fn process(), 10 hooks"].append((t1 - t0) / repeats / 1e3)
        rounds["Python list of 10 callbacks"].append((t2 - t1) / repeats / 1e3)
    return {name: spread(v[2:]) for name, v in rounds.items()}


def _ready_loss_step(loss):
    def step_fn(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {"loss": loss}

    return step_fn


_NEVER = 10**9  # no cadence fires inside the timed steps


def _standard_stack():
    import pimm_fn as pf

    return [
        pf.evaluate_every(_NEVER, _evaluator, name="val"),
        pf.save_every(_NEVER),
        pf.best_on("acc"),
        pf.log_every(_NEVER),
    ]


DRIVER_STACKS = {"no hooks": lambda: [], "standard stack": _standard_stack}

# One hook walks every step (a State per event); each further one adds only its calls: the two apart.
TEN_HOOK_STACKS = {
    "one no-op hook (every event)": lambda: TEN_TRIVIAL[:1],
    "ten no-op hooks (every event)": lambda: list(TEN_TRIVIAL),
    "ten slotted hooks, hook(state, event)": lambda: [_Slotted(i) for i in range(10)],
    "ten slotted hooks, update(slot, state, event)": lambda: [_SlottedUpdate(i) for i in range(10)],
}


def driver(steps: int = 20000, repeats: int = 3, stacks: dict = DRIVER_STACKS) -> dict:
    """µs of CPU per step of the driver alone (best of ``repeats``), for each of ``stacks`` (by name)."""
    import pimm_fn as pf

    torch = _torch()
    model = torch.nn.Linear(2, 1)
    step_fn = _ready_loss_step(torch.tensor(0.5))
    out = {}
    for name, hooks in stacks.items():
        best = float("inf")
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                run = pf.loop(
                    model,
                    _sgd(model),
                    [0] * (steps + 10),
                    hooks=hooks(),
                    max_epochs=1,
                    save_dir=tmp,
                    watching=pf.Watching(console=False),
                    step_fn=step_fn,
                )
                run.run(steps=10)  # past the first epoch's opening
                t0 = time.process_time()
                run.run(steps=steps)
                best = min(best, (time.process_time() - t0) / steps * 1e6)
        out[name] = best
    return out


def _worker(args) -> None:
    result = measure(args.rounds, args.steps, args.warmup)
    json.dump(result, sys.stdout)


def summarize(per_process: list[dict]) -> dict:
    """Pool the intervals and compare every variant to the raw loop."""
    names = list(per_process[0])
    pooled = {n: [x for proc in per_process for rnd in proc[n] for x in rnd] for n in names}
    per_round = {n: [percentile(rnd, Q) for proc in per_process for rnd in proc[n]] for n in names}
    base = "raw PyTorch loop"
    rows = {}
    for n in names:
        p = percentile(pooled[n], Q)
        rows[n] = {
            "step_us_p10": p,
            "step_us_median": percentile(pooled[n], 50),
            "overhead_us": p - percentile(pooled[base], Q),
            "ratio": p / percentile(pooled[base], Q),
            "overhead_us_rounds": spread(a - b for a, b in zip(per_round[n], per_round[base])),
            "ratio_rounds": spread(a / b for a, b in zip(per_round[n], per_round[base])),
            "intervals": len(pooled[n]),
        }
    return rows


def run(quick: bool = False, processes: int = 3, rounds: int = 5, steps: int = 600, warmup: int = 50) -> dict:
    """Measure, print the table and write ``results/loop_overhead.json``.

    ``quick`` runs one small round in this process (for smoke tests).
    """
    if quick:
        per_process = [measure(rounds=1, steps=30, warmup=5)]
        disp = dispatch(repeats=200)
        alone = driver(steps=200, repeats=1)
        ten = driver(steps=200, repeats=1, stacks=TEN_HOOK_STACKS)
    else:
        per_process = []
        for _ in range(processes):
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.loop_overhead",
                "--worker",
                "--rounds",
                str(rounds),
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=_root(), env=_env())
            per_process.append(json.loads(done.stdout.strip().splitlines()[-1]))
        disp = dispatch()
        alone = driver()
        ten = driver(steps=5000, stacks=TEN_HOOK_STACKS)
    rows = summarize(per_process)
    fired, quiet = (
        rows.get("pimm_fn, save cadence fires every step (no-op save)"),
        rows.get("pimm_fn, save cadence never fires"),
    )
    cadence_us = fired["step_us_p10"] - quiet["step_us_p10"] if fired and quiet else None
    peers = {k: rows[k]["overhead_us"] for k in rows if k.startswith(("Lightning", "Ignite"))}
    std = rows["pimm_fn, standard stack"]["overhead_us"]
    result = {
        "workload": f"MLP {WIDTH}-{HIDDEN}-1, batch {BATCH}, SGD, data in memory, torch threads 1",
        "statistic": f"p{Q} of per-step intervals, pooled over {len(per_process)} process(es) x rounds",
        "quick": quick,
        "variants": rows,
        "dispatch_us_per_event": disp,
        "driver_alone_us_per_step": alone,
        "driver_alone_ten_hooks_us_per_step": ten,
        "cadence_fire_extra_us": cadence_us,
        "target": {
            "standard_overhead_us": std,
            "ignite_overhead_us": peers.get("Ignite Engine, 10 handlers"),
            "lightning_overhead_us": peers.get("Lightning, 10 no-op callbacks"),
        },
    }
    table(result)
    write_result("loop_overhead", result)
    return result


def table(result: dict, file=sys.stdout) -> None:
    rows = []
    for name, r in result["variants"].items():
        rows.append(
            [
                name,
                f"{r['step_us_p10']:.0f}",
                f"{r['overhead_us']:+.1f}",
                f"{r['ratio']:.3f}",
                fmt_spread(r["overhead_us_rounds"], digits=1),
                fmt_spread(r["ratio_rounds"], digits=3),
            ]
        )
    print_table(
        "Loop overhead per step (" + result["statistic"] + ")",
        ["variant", "step µs", "overhead µs", "ratio", "overhead/round med [min..max]", "ratio/round"],
        rows,
        file=file,
    )
    d = result["dispatch_us_per_event"]
    print_table(
        "Hook dispatch per event (no training step)",
        ["dispatch", "µs med [min..max]"],
        [[k, fmt_spread(v, digits=2)] for k, v in d.items()],
        file=file,
    )
    alone = {**result.get("driver_alone_us_per_step", {}), **result.get("driver_alone_ten_hooks_us_per_step", {})}
    if alone:
        print_table(
            "Driver alone (CPU µs per step, step function returns a ready loss)",
            ["hooks", "µs"],
            [[k, f"{v:.2f}"] for k, v in alone.items()],
            file=file,
        )
    if result["cadence_fire_extra_us"] is not None:
        print(
            f"\nextra cost of a step on which save_every fires (no-op save handler): "
            f"{result['cadence_fire_extra_us']:+.1f} µs",
            file=file,
        )


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = _root() + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
    else:
        run(quick=args.quick, processes=args.processes, rounds=args.rounds, steps=args.steps, warmup=args.warmup)


if __name__ == "__main__":
    main()
