"""What SHA-256 digests in the marker cost a save: ``digests=True`` against ``False``, paired.

For checkpoint states of about 100 and 500 MB (an MLP's weights plus Adam's
two moments, ``benchmarks.checkpoint_io.make_state``), each round saves the
same state twice into one ``model_dir`` of the same disk, once with and once
without digests, in alternating order:

* *sync*: seconds ``save_checkpoint`` takes (the training stops that long);
* *async*: for ``save_checkpoint_async``, the seconds until staging ended
  (what the training waits for at most) and until the checkpoint was
  published (the worker thread's whole save, digests included).

The cost is the ratio with / without of the same round (min/median/max over
rounds). Also reported: the hash alone (``manifest.digest`` over the
files of the last checkpoint, read from the page cache) in MB/s.

Run: ``python -m benchmarks.digests [--quick]``.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
import time

from benchmarks._common import fmt_spread, machine, print_table, spread, write_result

SIZES_MB = (100, 500)


def _sync(model_dir, step, model, opt, digests: bool) -> float:
    from pimm_fn import checkpoint

    t = time.perf_counter()
    checkpoint.save_checkpoint(
        model_dir,
        step=step,
        weights=model.state_dict(),
        trainer={"optimizer": opt.state_dict()},
        local={},
        digests=digests,
    )
    return time.perf_counter() - t


def _async(model_dir, step, model, opt, digests: bool) -> tuple[float, float]:
    from pimm_fn import checkpoint

    pending = checkpoint.save_checkpoint_async(
        model_dir,
        step=step,
        weights=model.state_dict(),
        trainer={"optimizer": opt.state_dict()},
        local={},
        digests=digests,
    )
    pending.wait()
    return pending.staged_at - pending.requested_at, pending.done_at - pending.requested_at


def _hash_rate(directory: pathlib.Path) -> float:
    from pimm_fn.checkpoint.files import digest

    files = [p for p in directory.rglob("*") if p.is_file()]
    t = time.perf_counter()
    for f in files:
        digest(f)
    return sum(f.stat().st_size for f in files) / 1e6 / (time.perf_counter() - t)


def measure(mb: float, rounds: int, root: pathlib.Path) -> dict:
    """Paired rounds of sync and async saves of a state of about ``mb`` MB, with and without digests."""
    import torch

    from benchmarks.checkpoint_io import make_state, state_bytes

    torch.set_num_threads(1)
    model, opt = make_state(mb)
    model_dir = root / f"run{int(mb)}"
    times = {k: [] for k in ("sync_off", "sync_on", "staged_off", "staged_on", "async_off", "async_on")}
    step = 0
    for flag in (False, True):  # warm-up: the first save of each kind pays page faults and the staging area
        step += 1
        _sync(model_dir, step, model, opt, flag)
        step += 1
        _async(model_dir, step, model, opt, flag)
    for r in range(rounds):
        for flag in (False, True) if r % 2 == 0 else (True, False):
            key = "on" if flag else "off"
            step += 1
            times[f"sync_{key}"].append(_sync(model_dir, step, model, opt, flag))
            step += 1
            staged, done = _async(model_dir, step, model, opt, flag)
            times[f"staged_{key}"].append(staged)
            times[f"async_{key}"].append(done)
    rate = _hash_rate(model_dir / "last")
    shutil.rmtree(model_dir, ignore_errors=True)
    ratio = lambda kind: spread([on / off for on, off in zip(times[f"{kind}_on"], times[f"{kind}_off"])])
    return {
        "mb": round(state_bytes(model, opt) / 1e6, 1),
        "rounds": rounds,
        "hash_mb_s": round(rate),
        **{k: spread(v) for k, v in times.items()},
        "sync_ratio": ratio("sync"),
        "async_ratio": ratio("async"),
        "staged_ratio": ratio("staged"),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 MB, 2 rounds: a smoke run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dir", default=None, help="where to save (default: a temp dir on the default disk)")
    args = parser.parse_args(argv)
    sizes, rounds = ((10,), 2) if args.quick else (SIZES_MB, args.rounds)
    root = pathlib.Path(tempfile.mkdtemp(prefix="pimm_fn-digests-", dir=args.dir))
    try:
        rows, results = [], []
        for mb in sizes:
            res = measure(mb, rounds, root)
            results.append(res)
            for kind, label in (
                ("sync", "sync save"),
                ("async", "async save, published"),
                ("staged", "async save, staged"),
            ):
                rows.append(
                    [
                        f"{res['mb']:.0f} MB",
                        label,
                        fmt_spread(res[f"{kind}_off"], " s", 3),
                        fmt_spread(res[f"{kind}_on"], " s", 3),
                        fmt_spread(res[f"{kind}_ratio"], "x", 3),
                    ]
                )
        print_table(
            f"digests=True vs False ({machine()['cpu']}, {machine()['cores']} cores)",
            ["state", "what", "digests off", "digests on", "on / off (paired)"],
            rows,
        )
        print("hash alone (page cache): " + ", ".join(f"{r['mb']:.0f} MB: {r['hash_mb_s']} MB/s" for r in results))
        write_result("digests", {"sizes": results})
        return {"sizes": results}
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
