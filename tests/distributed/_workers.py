"""Worker functions the distributed tests run on every rank (see ``_launch``).

    python _workers.py <function> <rank> <world> <out_dir> <json kwargs>

``<function>`` names a function of this module, or ``module:function`` for
one of another worker module beside it (``_fsdp_workers:train``).

A world of 2 or more joins a gloo group from the torchrun-style environment;
a world of 1 runs without a process group, as a plain script would. Results
go to ``out_dir`` as ``<tag>-rank<r>.pkl`` files the tests read back.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import pathlib
import pickle
import signal
import sys
import traceback
import warnings

import attrs
import torch
import torch.distributed as td
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import pimm_fn as pf
from pimm_fn import dist
from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.runtime.handlers import checkpointing as handlers
from pimm_fn.runtime.handlers import checkpointing as save_contents
from pimm_fn.runtime.engine.interpreter import unwrap

NUM_SAMPLES = 48
BATCH = 4
MAX_EPOCHS = 3


class Net(nn.Module):
    """A 2-layer MLP with dropout (so resume must restore the RNG), returning its loss."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": F.mse_loss(self.body(x).squeeze(-1), y)}


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(NUM_SAMPLES, 8, generator=g)
    return TensorDataset(x, x.sum(1) + 0.1 * torch.randn(NUM_SAMPLES, generator=g))


def loader(rank: int, world: int) -> StatefulDataLoader:
    sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=True, seed=7)
    return StatefulDataLoader(dataset(), batch_size=BATCH, sampler=sampler)


@attrs.define(eq=False)
class ValLoss:
    """Sharded validation loss: each rank sums its shard, then all-reduce."""

    def __call__(self, model):
        net = unwrap(model)
        was = net.training
        net.eval()
        x, y = dataset().tensors
        mine = slice(dist.rank(), None, dist.world_size())
        with torch.no_grad():
            sums = torch.stack(
                [F.mse_loss(net.body(x[mine]).squeeze(-1), y[mine], reduction="sum"), torch.tensor(float(len(y[mine])))]
            ).double()
        net.train(was)
        if dist.is_initialized():
            td.all_reduce(sums)
        return {"val_loss": float(sums[0] / sums[1])}


@attrs.define(eq=False)
class Scores:
    """The n-th call returns ``scores[rank][n]`` as ``score`` (``None`` entries: nothing computed)."""

    scores: dict
    calls: int = 0

    def __call__(self, model):
        mine = self.scores.get(str(dist.rank()))
        value = mine[self.calls] if mine is not None and self.calls < len(mine) else None
        self.calls += 1
        return None if value is None else {"score": value}


@attrs.frozen
class _SaveOnLocalImprovement:
    """BROKEN on purpose: a collective save decided from rank-local metrics."""

    events = (ev.MetricsPublished,)

    def init(self):
        return None

    def __call__(self, state, event):
        value = event.values.get("score")
        if value is None or (state.slot is not None and value <= state.slot):
            return state, ()
        return state.with_slot(value), (SaveCheckpoint(state.progress.global_step),)

    def __repr__(self):
        return "save_on_local_improvement('score')"


@attrs.frozen
class _SnapshotOnRank1:
    """BROKEN on purpose: every rank saves at step 2, but only rank 1 asks for a snapshot."""

    events = (ev.AfterStep,)

    def __call__(self, state, event):
        if event.step != 2:
            return state, ()
        return state, (SaveCheckpoint(2, snapshot=state.rank == 1),)

    def __repr__(self):
        return "snapshot_on_rank1()"


@attrs.frozen
class _SaveAtMultiplesOf5:
    """A correct hook of the user's own (not built in): the guard watches it at every step."""

    events = (ev.AfterStep,)

    def __call__(self, state, event):
        return state, ((SaveCheckpoint(event.step),) if event.step % 5 == 0 else ())

    def __repr__(self):
        return "save_at_multiples_of_5()"


def hooks_for(kind: str, scores=None, rank: int = 0) -> list:
    if kind == "standard":
        return [
            pf.evaluate_every(4, ValLoss(), name="val"),
            pf.save_every(4),
            pf.best_on("val_loss", mode="min"),
            pf.log_every(5),
        ]
    if kind == "scores":
        return [pf.evaluate_every(3, Scores(scores), name="scores"), pf.save_every(4), pf.best_on("score")]
    if kind == "rank0_scores":
        return [
            pf.evaluate_every(3, Scores(scores), name="scores", broadcast=False),
            pf.save_every(4),
            pf.best_on("score"),
            _SaveAtMultiplesOf5(),
        ]
    if kind == "broken":
        return [pf.evaluate_every(3, Scores(scores), name="scores", broadcast=False), _SaveOnLocalImprovement()]
    if kind == "broken_both":
        return [pf.save_every(4), _SnapshotOnRank1()]
    if kind == "rank1_extra":
        return [pf.save_every(4)] + ([pf.log_every(7)] if rank == 1 else [])
    if kind == "rank_config":  # the same hooks, configured from the rank: three differences
        return [
            pf.save_every(2 + rank),
            pf.evaluate_every(4 + rank, ValLoss(), name="val"),
            pf.save_every(5, async_save=rank == 0),
            pf.log_every(5),
        ]
    if kind == "rank_chain":  # a named chain whose leaves differ: the chain's own identity is the same
        return [pf.save_every(4), pf.chain(pf.log_every(5), pf.save_every(6 if rank == 0 else 7), name="extras")]
    raise ValueError(kind)


def _dying_save(step: int, victim: int):
    """A SaveCheckpoint handler whose ``victim`` rank is SIGKILLed inside the DCP write of ``step``."""
    import torch.distributed.checkpoint as dcp

    from pimm_fn.checkpoint import publish as _publish
    from pimm_fn.checkpoint.formats import standard as _standard

    class DyingWriter(dcp.FileSystemWriter):
        def write_data(self, plan, planner):
            future = super().write_data(plan, planner)
            future.wait()  # this rank's files are on disk; the others wait to finish the save
            print(f"rank {dist.rank()} dies inside the DCP write of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def handler(effect, state, ctx):
        if effect.step != step:
            return handlers.save_checkpoint(effect, state, ctx)
        replicated, local = save_contents.trainer_state(ctx, state)
        staging = dist.run_on_main(lambda: _publish.fresh_staging(ctx.model_dir, effect.step))
        flat = {**_standard._flatten("trainer", replicated), **_standard._flatten(f"local/rank{dist.rank()}", local)}
        writer = DyingWriter if dist.rank() == victim else dcp.FileSystemWriter
        dcp.save(flat, storage_writer=writer(staging / "trainer"))
        raise AssertionError("unreachable: the save of the dying step completed")

    return handler


def train(
    rank,
    world,
    out,
    *,
    save_dir,
    tag,
    hooks="standard",
    scores=None,
    resume=None,
    strict=False,
    steps=None,
    kill_after=None,
    kill_rank=0,
    die_in_save=None,
    check_agreement=None,
    max_epochs=MAX_EPOCHS,
    strict_first=False,
):
    """Build the tiny run, train it (or part of it) and dump what the tests check."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    data = loader(rank, world)
    extra = {}
    if die_in_save is not None:
        extra["handlers"] = {SaveCheckpoint: _dying_save(*die_in_save)}
    result = {"rank": rank, "world": world}
    if strict_first:  # the same resume under strict_resume=True must refuse and leave the objects untouched
        before = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            pf.loop(
                model,
                optimizer,
                loader(rank, world),
                hooks=hooks_for(hooks, scores, rank),
                max_epochs=max_epochs,
                save_dir=save_dir,
                resume=resume,
                resuming=pf.Resuming(strict_resume=True),
                watching=pf.Watching(console=False),
            )
            result["strict"] = None
        except pf.ResumeError as exc:
            result["strict"] = str(exc)
        result["strict_untouched"] = (
            all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
            and not (optimizer.state_dict()["state"])
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = pf.loop(
                model,
                optimizer,
                data,
                hooks=hooks_for(hooks, scores, rank),
                max_epochs=max_epochs,
                save_dir=save_dir,
                resume=resume,
                resuming=pf.Resuming(strict_resume=strict),
                watching=pf.Watching(console=False),
                parallel=pf.Parallel(check_agreement=check_agreement, ddp=True),
                **extra,
            )
        except pf.ResumeError as exc:
            result["error"] = ("ResumeError", str(exc))
            return _dump(out, tag, rank, result)
        result["restored"] = _snapshot(run)
        try:
            if kill_after is not None:
                run.run(steps=kill_after)
                if rank == kill_rank:
                    print(f"rank {rank} kills itself after step {run.state.progress.global_step}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            run.run(steps=steps)
        except pf.CollectiveDivergenceError as exc:
            print(f"CollectiveDivergenceError: {exc}", flush=True)  # in the rank's log too
            result["error"] = ("CollectiveDivergenceError", str(exc))
            result["step"] = run.state.progress.global_step
    result["warnings"] = [(w.category.__name__, str(w.message)) for w in caught]
    result["final"] = _snapshot(run)
    result["trace"] = run.trace
    return _dump(out, tag, rank, result)


def resume_differently(rank, world, out, *, save_dir, tag, steps=4):
    """Train ``steps`` steps with ``rank_chain``'s rank-0 hooks on every rank, then resume with each rank's own."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    run = pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks_for("rank_chain", rank=0),
        max_epochs=MAX_EPOCHS,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
    )
    run.run(steps=steps)
    result = {"rank": rank, "error": None}
    try:
        pf.loop(
            model,
            optimizer,
            loader(rank, world),
            hooks=hooks_for("rank_chain", rank=rank),
            max_epochs=MAX_EPOCHS,
            save_dir=save_dir,
            resume="auto",
            watching=pf.Watching(console=False),
            parallel=pf.Parallel(ddp=True),
        )
    except pf.CollectiveDivergenceError as exc:
        result["error"] = ("CollectiveDivergenceError", str(exc))
    return _dump(out, tag, rank, result)


def _snapshot(run) -> dict:
    state = run.state
    return {
        "weights": {k: v.clone() for k, v in unwrap(run.ctx.model).state_dict().items()},
        "optimizer": copy.deepcopy(run.ctx.optimizer.state_dict()),  # training updates it in place
        "progress": state.progress,
        "position": state.position,
        "best": dict(state.best),
        "metrics": dict(state.metrics),
    }


def _dump(out, tag, rank, result):
    with open(pathlib.Path(out) / f"{tag}-rank{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


# -- a step that raises on every rank alike, or on one rank only (test_interruption_ranks) ---------------

_FIRED = set()  # the injected failures already raised in this process: each raises once


@attrs.frozen
class _RaiseAt:
    """A hook of the user's own that raises once, at ``AfterStep(step)``, on the ranks in ``ranks``."""

    step: int
    ranks: tuple = ()
    events = (ev.AfterStep,)

    def __call__(self, state, event):
        if event.step == self.step and state.rank in self.ranks and self not in _FIRED:
            _FIRED.add(self)
            raise ValueError(f"injected hook failure at step {event.step} on rank {state.rank}")
        return state, ()

    def __repr__(self):  # the same on every rank: the ranks that fail are the bug, not the configuration
        return f"raise_at({self.step})"


@attrs.define(eq=False)
class _FlakyValLoss(ValLoss):
    """``ValLoss`` whose ``fail_call``-th call raises on ``ranks``, once, before its all-reduce."""

    fail_call: int = 0
    ranks: tuple = ()
    calls: int = 0

    def __call__(self, model):
        self.calls += 1
        if self.calls == self.fail_call and dist.rank() in self.ranks:
            raise ValueError(f"injected evaluator failure at call {self.calls} on rank {dist.rank()}")
        return super().__call__(model)


class _FlakyNet(Net):
    """``Net`` whose training forward number ``fail_call`` raises once, on ``ranks``."""

    def __init__(self, fail_call=0, ranks=()):
        super().__init__()
        self.fail_call, self.ranks, self.calls = fail_call, tuple(ranks), 0

    def forward(self, batch):
        self.calls += self.training
        if self.training and self.calls == self.fail_call and dist.rank() in self.ranks:
            raise ValueError(f"injected forward failure at call {self.calls} on rank {dist.rank()}")
        return super().forward(batch)


def _flaky_save(step, ranks):
    """The real save handler, raising once before the save of ``step`` on ``ranks``."""
    from pimm_fn.runtime.handlers.checkpointing import save_checkpoint

    fired = []

    def handler(effect, state, ctx):
        if effect.step == step and dist.rank() in ranks and not fired:
            fired.append(step)
            raise ValueError(f"injected save failure at step {step} on rank {dist.rank()}")
        return save_checkpoint(effect, state, ctx)

    return handler


def _interrupt_run(rank, world, save_dir, raise_at=(0, ()), fail_eval=(0, ()), fail_forward=(0, ()), fail_save=(0, ())):
    torch.manual_seed(0)
    model = _FlakyNet(*fail_forward)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    hooks = [
        pf.evaluate_every(4, _FlakyValLoss(*fail_eval), name="val"),
        pf.save_every(4),
        pf.best_on("val_loss", mode="min"),
        pf.log_every(5),
        _RaiseAt(*raise_at),
    ]
    return pf.loop(
        model,
        optimizer,
        loader(rank, world),
        hooks=hooks,
        max_epochs=2,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
        parallel=pf.Parallel(ddp=True),
        handlers={SaveCheckpoint: _flaky_save(*fail_save)},
    )


def _failure(exc) -> dict:
    return {"type": type(exc).__name__, "message": "\n".join([str(exc), *getattr(exc, "__notes__", ())])}


def interrupt_alike(rank, world, out, *, save_dir, tag):
    """An uninterrupted run, then runs whose hook (step 5), evaluator (step 8), forward (step 6) or save
    (step 4) raises on every rank, each continued with run(): what each ended with."""
    result = {"rank": rank}
    reference = _interrupt_run(rank, world, f"{save_dir}/ref")
    reference.run()
    result["ref"] = {**_snapshot(reference), "trace": reference.trace}
    every = (0, 1)
    for kind, arguments in (
        ("hook", dict(raise_at=(5, every))),
        ("effect", dict(fail_eval=(2, every))),
        ("forward", dict(fail_forward=(6, every))),
        ("save", dict(fail_save=(4, every))),
    ):
        run = _interrupt_run(rank, world, f"{save_dir}/{kind}", **arguments)
        try:
            run.run()
            raise AssertionError("the injected failure did not raise")
        except ValueError as exc:
            found = {"error": _failure(exc), "interrupted": run.interrupted}
        run.run()
        result[kind] = {**found, **_snapshot(run), "trace": run.trace}
    return _dump(out, tag, rank, result)


def interrupt_one_rank(rank, world, out, *, save_dir, tag, where):
    """A run whose evaluator (``where="effect"``) or hook (``where="hook"``) raises on rank 1 only."""
    import time

    arguments = dict(fail_eval=(2, (1,))) if where == "effect" else dict(raise_at=(5, (1,)))
    run = _interrupt_run(rank, world, save_dir, **arguments)
    start = time.monotonic()
    result = {"rank": rank}
    try:
        run.run()
        result["error"] = None
    except Exception as exc:
        result["error"] = _failure(exc)
    result["seconds"] = time.monotonic() - start
    result["interrupted"] = run.interrupted
    try:
        run.run()
        result["again"] = None
    except Exception as exc:
        result["again"] = _failure(exc)
    _dump(out, tag, rank, result)
    sys.stdout.flush()
    os._exit(0)  # the process group is shut down: main()'s destroy_process_group has nothing to destroy


def main(argv) -> int:
    function, rank, world, out, kwargs = argv[1], int(argv[2]), int(argv[3]), argv[4], json.loads(argv[5])
    torch.set_num_threads(1)
    if world > 1:
        td.init_process_group(backend="gloo")
    try:
        if ":" in function:
            module, name = function.split(":")
            target = getattr(importlib.import_module(module), name)
        else:
            target = globals()[function]
        target(rank, world, out, **kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # no destroy: a peer may be gone
    if world > 1:
        td.barrier()  # no rank tears its group down while a peer still uses it
        td.destroy_process_group()
    # Straight out, without interpreter finalization: a worker has nothing to clean up there, and once
    # (1 run in 7) rank 0, which hosts the group's store, aborted at exit with "terminate called
    # without an active exception" after its result was written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
