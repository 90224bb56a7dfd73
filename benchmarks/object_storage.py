"""Checkpoints on object storage: pimm_fn's save and load against raw DCP with the same fsspec writer, on S3.

An S3 API server (moto's server mode, in a process of its own on loopback,
reached through s3fs) receives a checkpoint state of about 100 MB (an MLP's
weights plus Adam's two moments, ``benchmarks.checkpoint_io.make_state``).
Each paired round, in alternating order:

* *sync save*: ``pimm_fn.checkpoint.save_checkpoint("s3://...")`` (model.pth
  and the trainer's DCP directory, the marker, the publish) against
  ``dcp.save`` of the same tensors with DCP's ``FsspecWriter``;
* *async save, published*: ``save_checkpoint_async(...).wait()`` against
  ``dcp.async_save(..., storage_writer=FsspecWriter(...)).result()``;
* *load*: ``load_checkpoint`` against ``dcp.load`` with ``FsspecReader``.

Ratios are pimm_fn / raw DCP of the same round (min/median/max over rounds);
target <= 1.15x. Every checkpoint is deleted from the server after its round.

Also counted: the S3 requests of one save of a training run with snapshots
and retention (``save_every(2, snapshots=True)``, ``Saving(keep=keep_last(2))``,
the save that removes a snapshot), by API operation: on a real store each
is a round trip, so fewer is faster whatever the size.

Run: ``python -m benchmarks.object_storage [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
import warnings

from benchmarks._common import fmt_spread, free_port, machine, print_table, spread, write_result

SIZES_MB = (100,)
_SERVER = (
    "from moto.server import ThreadedMotoServer; import time, sys; "
    "s = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False); s.start(); "
    "time.sleep(10**6)"
)


@contextlib.contextmanager
def s3_server():
    """moto's S3 server in its own process; yields a fresh bucket's name, the environment pointing at it."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        import s3fs

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem().mkdir(bucket)
        yield bucket
    finally:
        server.kill()
        server.wait()


def _state(model, opt) -> dict:
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(mb: float, rounds: int, bucket: str) -> dict:
    import s3fs
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    from benchmarks.checkpoint_io import _empty_like_optim, make_state, state_bytes
    from pimm_fn import checkpoint

    torch.set_num_threads(1)
    fs = s3fs.S3FileSystem()
    model, opt = make_state(mb)
    warnings.simplefilter("ignore")
    times = {k: [] for k in ("pimm_sync", "dcp_sync", "pimm_async", "dcp_async", "pimm_load", "dcp_load")}

    def pimm_sync(url):
        return checkpoint.save_checkpoint(
            url, step=1, weights=model.state_dict(), trainer={"optimizer": opt.state_dict()}, local={}
        )

    def pimm_async(url):
        return checkpoint.save_checkpoint_async(
            url, step=2, weights=model.state_dict(), trainer={"optimizer": opt.state_dict()}, local={}
        ).wait()

    def dcp_sync(url):
        dcp.save(_state(model, opt), storage_writer=FsspecWriter(url, sync_files=True))

    def dcp_async(url):
        dcp.async_save(_state(model, opt), storage_writer=FsspecWriter(url, sync_files=True)).result()

    def dcp_load(url):
        template = {
            "model": {k: torch.empty_like(v) for k, v in model.state_dict().items()},
            "optim": _empty_like_optim(opt.state_dict()),
        }
        dcp.load(template, storage_reader=FsspecReader(url))

    for r in range(rounds + 1):  # round 0 warms up (connections, the async staging area) and is dropped
        root = f"s3://{bucket}/round{r}"
        order = ("pimm", "dcp") if r % 2 == 0 else ("dcp", "pimm")
        saved = {}
        for who in order:
            t, out = _timed(lambda: pimm_sync(f"{root}/pimm/model") if who == "pimm" else dcp_sync(f"{root}/dcp"))
            saved[who] = out
            if r:
                times[f"{who}_sync"].append(t)
        for who in order:
            t, _ = _timed(
                lambda: pimm_async(f"{root}/pimm-async/model") if who == "pimm" else dcp_async(f"{root}/dcp-async")
            )
            if r:
                times[f"{who}_async"].append(t)
        for who in order:
            t, _ = _timed(
                lambda: checkpoint.load_checkpoint(saved["pimm"]) if who == "pimm" else dcp_load(f"{root}/dcp")
            )
            if r:
                times[f"{who}_load"].append(t)
        fs.rm(f"{bucket}/round{r}", recursive=True)
    ratio = lambda kind: spread([p / d for p, d in zip(times[f"pimm_{kind}"], times[f"dcp_{kind}"])])
    return {
        "mb": round(state_bytes(model, opt) / 1e6, 1),
        "rounds": rounds,
        **{k: spread(v) for k, v in times.items()},
        **{f"{kind}_ratio": ratio(kind) for kind in ("sync", "async", "load")},
    }


@contextlib.contextmanager
def counted_requests():
    """Count the S3 API calls (every one s3fs makes, through aiobotocore) by operation while the block runs."""
    import collections

    from aiobotocore.client import AioBaseClient

    counts, call = collections.Counter(), AioBaseClient._make_api_call

    async def counting(self, operation, params):
        counts[operation] += 1
        return await call(self, operation, params)

    AioBaseClient._make_api_call = counting
    try:
        yield counts
    finally:
        AioBaseClient._make_api_call = call


def save_requests(bucket: str) -> dict:
    """The S3 requests of the step-6 save of a run saving every 2 steps with two snapshots kept, by operation."""
    import torch

    import pimm_fn as pf

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(2, 4)] * 12,
        step_fn=_sgd_step,
        hooks=[pf.save_every(2, snapshots=True)],
        max_epochs=1,
        saving=pf.Saving(keep=pf.keep_last(2)),
        save_dir=f"s3://{bucket}/requests",
        watching=pf.Watching(console=False, progress=False),
    )
    run.run(steps=4)  # iter_2 and iter_4 kept
    with counted_requests() as counts:
        run.run(steps=2)  # saves step 6, publishes it, snapshots it, removes iter_2
    return {"total": sum(counts.values()), **dict(sorted(counts.items()))}


def _sgd_step(model, optimizer, batch, *, scheduler, scaler) -> dict:
    optimizer.zero_grad()
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    return {"loss": loss.detach()}


def run(quick: bool = False, rounds: int = 4) -> dict:
    sizes, rounds = ((10,), 1) if quick else (SIZES_MB, rounds)
    with s3_server() as bucket:
        return {"sizes": [measure(mb, rounds, bucket) for mb in sizes], "save_requests": save_requests(bucket)}


def table(result: dict, file=sys.stdout) -> None:
    rows = []
    for res in result["sizes"]:
        for kind, label in (("sync", "sync save"), ("async", "async save, published"), ("load", "load")):
            rows.append(
                [
                    f"{res['mb']:.0f} MB",
                    label,
                    fmt_spread(res[f"pimm_{kind}"], " s", 3),
                    fmt_spread(res[f"dcp_{kind}"], " s", 3),
                    fmt_spread(res[f"{kind}_ratio"], "x", 3),
                ]
            )
    print_table(
        f"Object storage: pimm_fn vs raw DCP + FsspecWriter on a local S3 server ({machine()['cpu']}, "
        f"{machine()['cores']} cores)",
        ["state", "what", "pimm_fn", "raw DCP", "pimm_fn / DCP (paired)"],
        rows,
        file=file,
    )
    requests = result.get("save_requests")
    if requests:
        print_table(
            "S3 requests of one save (snapshots, keep_last(2), one removed)",
            ["operation", "requests"],
            [[op, str(n)] for op, n in requests.items()],
            file=file,
        )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 MB, 1 round: a smoke run")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    result = run(args.quick, args.rounds)
    table(result)
    write_result("object_storage", result)
    return result


if __name__ == "__main__":
    main()
