"""How fast the multi-rank simulator runs, against a bare loop over the same hooks.

Run ``python -m benchmarks.simulation`` (``--steps``/``--world-size`` for
another size, ``--quick`` for a small run that writes nothing). It prints a
table and writes ``benchmarks/results/simulation.json``.

What is measured, for the standard stack with sparse cadences
``evaluate_every(500, miou), save_every(1000), best_on("mIoU"),
log_every(100)``, world size 8, 1 000 000 steps (100 epochs of 10 000), an
mIoU published at each evaluation:

* **metrics only** (the target case): no step outputs. No hook listens to
  ``BeforeStep`` and none accumulates, so ``simulate`` crosses the 99 steps
  between two ``log_every`` steps in one jump (``skip_quiet``, the default).
  Measured three ways: ``simulate`` as it is; ``simulate(skip_quiet=False)``,
  which walks every event as before the jumps existed; and the bare loop.
  The two simulations are checked to give identical traces and states.
* **metrics + per-step losses**: every rank fed its own loss at every step.
  ``log_every`` sums every step's loss, so no step can be skipped: this is
  the walk through every event, against the bare loop.

The two kinds of run:

* **simulate** — ``pimm_fn.testing.simulate``: every rank walks the full
  lifecycle through the core (``next_event``, ``advance``, the fold with
  slots threaded through ``State``, ``process`` and a recording executor).
* **bare loop** — per rank, a plain ``for`` loop over epochs and steps that
  builds the same events (``BeforeEpoch``, ``BeforeStep``, ``AfterStep`` with
  the same outputs, ``AfterEpoch``, ``AfterTrain``) and calls each hook object
  that wants the event, ``hook(fixed_state, event)``, where ``fixed_state``
  is a constant ``State`` holding that hook's initial slot; answers each
  ``Evaluate`` by calling the hooks that want ``MetricsPublished``, and keeps
  the effects in a list. As the fold, it calls a hook for ``AfterStep``
  only on its cadence (``every``) and on the other steps only its
  ``accumulate``, on non-empty outputs. The returned states are thrown
  away: no progress, no slot or metric threading, no executor. It is the
  cost of the hooks' own work at every step and nothing else.

Times are this process's CPU seconds (``time.process_time``), best of
``--repeats`` (of at least 3 for the skipping simulation, which is short),
so other load on a shared machine skews them less. Rates
are in rank-steps per second (steps x ranks / seconds). Targets: metrics
only, ``simulate`` >= 4 000 000 rank-steps/s (2 s for the 1 000 000 steps at
world size 8); with per-step losses, ``simulate`` >= 100 000 rank-steps/s and
<= 3x the bare loop's time.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from pimm_fn.core import events as ev
from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.fold import chain
from pimm_fn.core.plan import initial_state
from pimm_fn.hooks import best_on, evaluate_every, log_every, save_every
from pimm_fn.testing import simulate

RESULTS = Path(__file__).resolve().parent / "results" / "simulation.json"
TARGET_QUIET_RATE = 4_000_000  # 1 000 000 steps x 8 ranks in 2 s
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
    # As the fold does: a hook is called for AfterStep on its cadence; on other steps only its accumulate runs.
    cadence = {id(h): (d.every, d.accumulate) for h, d in zip(hooks.hooks, map(protocol.declared, hooks.hooks))}
    effects = []
    for rank in range(world_size):
        base = initial_state(
            hooks.hooks, iters_per_epoch=iters_per_epoch, max_epochs=max_epochs, rank=rank, world_size=world_size
        )
        fixed = {id(h): base.with_slot(slot) for h, slot in zip(hooks.hooks, base.slots)}

        def call(event):
            for hook in wants[type(event)]:
                if event.__class__ is ev.AfterStep:
                    every, accumulate = cadence[id(hook)]
                    if event.step % every:
                        if accumulate is not None and event.outputs:
                            accumulate(fixed[id(hook)].slot, event.outputs)
                        continue
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


def _timed(fn, repeats: int):
    """(best CPU seconds of ``repeats`` calls, the last call's value): other work on the machine does not count."""
    best, value = None, None
    for _ in range(repeats):
        value = None  # let the previous result go before timing the next
        start = time.process_time()
        value = fn()
        elapsed = time.process_time() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, value


def _same(a, b) -> bool:
    return a.traces == b.traces and a.states == b.states


def measure(*, steps: int, world_size: int, iters_per_epoch: int, repeats: int) -> dict:
    if steps % iters_per_epoch:
        raise SystemExit(f"--steps must be a multiple of --iters-per-epoch ({iters_per_epoch})")
    schedule = dict(world_size=world_size, iters_per_epoch=iters_per_epoch, max_epochs=steps // iters_per_epoch)
    hooks = standard_stack()
    rank_steps = steps * world_size

    def rate(seconds):
        return round(rank_steps / seconds)

    # It takes about a second: best of at least 3, so a burst of other load does not decide the figure.
    sim, skipped = _timed(lambda: simulate(hooks, metrics=miou_at, **schedule), max(repeats, 3))
    walk, walked = _timed(lambda: simulate(hooks, metrics=miou_at, skip_quiet=False, **schedule), repeats)
    identical = _same(skipped, walked)
    del skipped, walked
    bare, _ = _timed(lambda: bare_loop(hooks, **schedule), repeats)
    quiet = {
        "simulate_s": round(sim, 3),
        "simulate_rank_steps_per_s": rate(sim),
        "simulate_every_event_s": round(walk, 3),
        "simulate_every_event_rank_steps_per_s": rate(walk),
        "speedup_of_skipping": round(walk / sim, 1),
        "bare_loop_s": round(bare, 3),
        "bare_loop_rank_steps_per_s": rate(bare),
        "ratio_simulate_to_bare": round(sim / bare, 3),
        "identical_to_every_event": identical,
        "meets_targets": identical and rank_steps / sim >= TARGET_QUIET_RATE,
    }
    sim, _ = _timed(lambda: simulate(hooks, metrics=miou_at, local=loss_at, **schedule), repeats)
    bare, _ = _timed(lambda: bare_loop(hooks, local=loss_at, **schedule), repeats)
    losses = {
        "simulate_s": round(sim, 3),
        "simulate_rank_steps_per_s": rate(sim),
        "bare_loop_s": round(bare, 3),
        "bare_loop_rank_steps_per_s": rate(bare),
        "ratio_simulate_to_bare": round(sim / bare, 2),
        "meets_targets": rank_steps / sim >= TARGET_RATE and sim / bare <= TARGET_RATIO,
    }
    return {
        "stack": [repr(h) for h in hooks],
        "steps": steps,
        "world_size": world_size,
        "iters_per_epoch": iters_per_epoch,
        "timer": "time.process_time, best of repeats (of at least 3 for simulate in 'metrics only')",
        "repeats": repeats,
        "variants": {"metrics only": quiet, "metrics + per-step losses": losses},
        "targets": {
            "metrics only": {"rank_steps_per_s": TARGET_QUIET_RATE},
            "metrics + per-step losses": {"rank_steps_per_s": TARGET_RATE, "max_ratio": TARGET_RATIO},
        },
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def table(result: dict, file=sys.stdout) -> None:
    print(
        f"{result['steps']:,} steps ({result['iters_per_epoch']:,} per epoch) x {result['world_size']} ranks, "
        f"stack: {', '.join(result['stack'])}",
        file=file,
    )
    q = result["variants"]["metrics only"]
    print(f"\nmetrics only (target: >= {TARGET_QUIET_RATE:,} rank-steps/s)", file=file)
    print(
        f"  {'simulate (skips quiet steps)':36} {q['simulate_s']:9.3f} s {q['simulate_rank_steps_per_s']:13,} "
        f"rank-steps/s  {'met' if q['meets_targets'] else 'MISSED'}",
        file=file,
    )
    print(
        f"  {'simulate(skip_quiet=False)':36} {q['simulate_every_event_s']:9.3f} s "
        f"{q['simulate_every_event_rank_steps_per_s']:13,} rank-steps/s  ({q['speedup_of_skipping']}x slower; "
        f"{'identical' if q['identical_to_every_event'] else 'DIFFERENT'} traces and states)",
        file=file,
    )
    print(f"  {'bare loop':36} {q['bare_loop_s']:9.3f} s {q['bare_loop_rank_steps_per_s']:13,} rank-steps/s", file=file)
    v = result["variants"]["metrics + per-step losses"]
    print(
        f"\nmetrics + per-step losses (no step can be skipped; target: >= {TARGET_RATE:,} rank-steps/s and "
        f"<= {TARGET_RATIO}x the bare loop)",
        file=file,
    )
    print(
        f"  {'simulate':36} {v['simulate_s']:9.3f} s {v['simulate_rank_steps_per_s']:13,} rank-steps/s  "
        f"{v['ratio_simulate_to_bare']}x the bare loop  {'met' if v['meets_targets'] else 'MISSED'}",
        file=file,
    )
    print(f"  {'bare loop':36} {v['bare_loop_s']:9.3f} s {v['bare_loop_rank_steps_per_s']:13,} rank-steps/s", file=file)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--iters-per-epoch", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="20 000 steps at world size 2; writes nothing")
    parser.add_argument("--no-write", action="store_true", help="print only; leave the JSON file alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.world_size, args.iters_per_epoch, args.repeats = 20_000, 2, 10_000, 1
    result = measure(
        steps=args.steps, world_size=args.world_size, iters_per_epoch=args.iters_per_epoch, repeats=args.repeats
    )
    result["quick"] = args.quick
    table(result)
    if not (args.no_write or args.quick):
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")
    return result


if __name__ == "__main__":
    done = main()
    sys.exit(0 if done["quick"] or done["variants"]["metrics only"]["meets_targets"] else 1)
