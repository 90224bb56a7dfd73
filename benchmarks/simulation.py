"""How fast the multi-rank simulator runs, against a bare loop over the same hooks.

Run ``python -m benchmarks.simulation`` (``--steps``/``--world-size`` for a
quicker run). It prints a table and writes ``benchmarks/results/simulation.json``.

What is measured, for the standard stack ``evaluate_every(500, miou),
save_every(1000), best_on("mIoU"), log_every(100)``, world size 8, 100 000
steps (1 000 per epoch), an mIoU published at each evaluation; once without
step outputs ("metrics only", the configuration the targets are set for) and
once with every rank fed its own loss at every step:

* **simulate** — ``pimm_fn.testing.simulate``: every rank walks the full
  lifecycle through the core (``next_event``, ``advance``, the fold with
  slots threaded through ``State``, ``process`` and a recording executor).
* **bare loop** — per rank, a plain ``for`` loop over epochs and steps that
  builds the same events (``BeforeEpoch``, ``BeforeStep``, ``AfterStep`` with
  the same outputs, ``AfterEpoch``, ``AfterTrain``) and calls each hook object
  that wants the event, ``hook(fixed_state, event)``, where ``fixed_state``
  is a constant ``State`` holding that hook's initial slot; answers each
  ``Evaluate`` by calling the hooks that want ``MetricsPublished``, and keeps
  the effects in a list. The returned states are thrown away: no progress,
  no slot or metric threading, no executor. It is the cost of the hooks'
  own decision logic and nothing else.

Times are this process's CPU seconds (``time.process_time``), best of
``--repeats``, so other load on a shared machine does not skew them. The
result is in rank-steps per second (steps x ranks / seconds). Targets:
simulate >= 100 000 rank-steps/s and <= 3x the bare loop's time.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import initial_state
from pimm_fn.hooks import best_on, evaluate_every, log_every, save_every
from pimm_fn.testing import simulate

RESULTS = Path(__file__).resolve().parent / "results" / "simulation.json"
TARGET_RATE = 100_000
TARGET_RATIO = 3.0


def miou(model):
    """The evaluator's name in effects; the simulation supplies its values."""
    return None


def miou_at(step, rank):
    """A non-monotone mIoU stream, so ``best_on`` sometimes improves."""
    return {"mIoU": ((step * 7919) % 1000) / 1000}


def loss_at(step, rank):
    """Each rank's own loss at ``step`` (rank-local)."""
    return {"loss": 1.0 / (1 + step + rank)}


def standard_stack():
    return [evaluate_every(500, miou), save_every(1000), best_on("mIoU"), log_every(100)]


def bare_loop(hooks, *, world_size, iters_per_epoch, max_epochs, local=None) -> list:
    """The hooks' decision logic alone: same events and calls, no state threading."""
    hooks = chain(*hooks)
    wants = {t: [hooks.hooks[i] for i in hooks.active(t)] for t in ev.LIFECYCLE + (ev.MetricsPublished,)}
    effects = []
    for rank in range(world_size):
        base = initial_state(hooks.hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs,
                             rank=rank, world_size=world_size)
        fixed = {id(h): base.with_slot(slot) for h, slot in zip(hooks.hooks, base.slots)}

        def call(event):
            for hook in wants[type(event)]:
                for effect in hook(fixed[id(hook)], event)[1]:
                    effects.append(effect)
                    if isinstance(effect, Evaluate):
                        published = ev.MetricsPublished(miou_at(effect.step, 0), effect.evaluator, effect.step)
                        for other in wants[ev.MetricsPublished]:
                            effects.extend(other(fixed[id(other)], published)[1])

        step = 0
        for epoch in range(max_epochs):
            call(ev.BeforeEpoch(epoch))
            for _ in range(iters_per_epoch):
                step += 1
                call(ev.BeforeStep(step))
                call(ev.AfterStep(step, local(step, rank) if local is not None else {}))
            call(ev.AfterEpoch(epoch))
        call(ev.AfterTrain())
    return effects


def _timed(fn):
    # CPU time of this process: other work on a shared machine does not count.
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(*, steps: int, world_size: int, iters_per_epoch: int, repeats: int) -> dict:
    if steps % iters_per_epoch:
        raise SystemExit(f"--steps must be a multiple of --iters-per-epoch ({iters_per_epoch})")
    schedule = dict(world_size=world_size, iters_per_epoch=iters_per_epoch, max_epochs=steps // iters_per_epoch)
    hooks = standard_stack()
    rank_steps = steps * world_size
    variants = {}
    for name, local in (("metrics only", None), ("metrics + per-step losses", loss_at)):
        sim = min(_timed(lambda: simulate(hooks, metrics=miou_at, local=local, **schedule)) for _ in range(repeats))
        bare = min(_timed(lambda: bare_loop(hooks, local=local, **schedule)) for _ in range(repeats))
        variants[name] = {
            "simulate_s": round(sim, 3),
            "simulate_rank_steps_per_s": round(rank_steps / sim),
            "bare_loop_s": round(bare, 3),
            "bare_loop_rank_steps_per_s": round(rank_steps / bare),
            "ratio_simulate_to_bare": round(sim / bare, 2),
            "meets_targets": rank_steps / sim >= TARGET_RATE and sim / bare <= TARGET_RATIO,
        }
    return {
        "stack": [repr(h) for h in hooks],
        "steps": steps,
        "world_size": world_size,
        "iters_per_epoch": iters_per_epoch,
        "timer": "time.process_time, best of repeats",
        "repeats": repeats,
        "variants": variants,
        "targets": {"rank_steps_per_s": TARGET_RATE, "max_ratio": TARGET_RATIO},
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--iters-per-epoch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only; leave the JSON file alone")
    args = parser.parse_args(argv)
    result = measure(steps=args.steps, world_size=args.world_size, iters_per_epoch=args.iters_per_epoch,
                     repeats=args.repeats)
    print(f"{result['steps']} steps x {result['world_size']} ranks, stack: {', '.join(result['stack'])}")
    print(f"{'':28} {'simulate s':>11} {'rank-steps/s':>13} {'bare loop s':>12} {'rank-steps/s':>13} {'ratio':>6}  targets")
    for name, v in result["variants"].items():
        print(f"{name:28} {v['simulate_s']:11.3f} {v['simulate_rank_steps_per_s']:13,} {v['bare_loop_s']:12.3f} "
              f"{v['bare_loop_rank_steps_per_s']:13,} {v['ratio_simulate_to_bare']:5}x  "
              f"{'met' if v['meets_targets'] else 'MISSED'}")
    print(f"targets: simulate >= {TARGET_RATE:,} rank-steps/s and <= {TARGET_RATIO}x the bare loop")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["variants"]["metrics only"]["meets_targets"] else 1)
