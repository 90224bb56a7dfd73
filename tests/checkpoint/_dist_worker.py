"""One rank of the multi-process checkpoint test (run by test_distributed_save.py).

Usage: python _dist_worker.py RANK WORLD ROOT   (MASTER_ADDR/MASTER_PORT in env)
Asserts inside the rank; exits non-zero with a traceback on any failure, and
writes what the parent compares across ranks to ROOT/result-<rank>.json.
"""

import datetime
import json
import pathlib
import sys


def local_state(rank):
    """The rank-local state rank `rank` saves (recomputable by the parent)."""
    import torch

    torch.manual_seed(100 + rank)
    return {
        "rng": torch.get_rng_state(),
        "rank": rank,
        "cursor": {"index": 10 * rank},
        "state": json.dumps({"rank": rank}),
        "noise": torch.randn(3),
    }


def replicated_state():
    """Model weights and trainer state, identical on every rank."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model.state_dict(), {"optimizer": opt.state_dict(), "epoch": 2}


def main(rank, world, root):
    import torch.distributed as td

    from conftest import assert_same
    from pimm_fn import dist
    from pimm_fn.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    td.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    assert (dist.rank(), dist.world_size()) == (rank, world)
    model_dir = root / "model"
    assert latest_checkpoint(model_dir) is None
    weights, trainer = replicated_state()
    local = local_state(rank)

    save_checkpoint(model_dir, step=10, weights=weights, trainer=trainer, local=local, snapshot=True)
    info = save_checkpoint(
        model_dir, step=20, weights=weights, trainer=trainer, local=local, snapshot=True, keep_snapshots=1
    )
    assert (info.path, info.step, info.world_size) == (model_dir / "last", 20, world)
    latest = latest_checkpoint(model_dir)
    loaded = load_checkpoint(latest)
    assert_same(local, loaded.local)
    assert_same(trainer, loaded.trainer)
    assert_same(dict(weights), dict(loaded.weights))

    legacy = save_checkpoint(root / "legacy", step=5, weights=weights, trainer=trainer, local=local, format="legacy")
    assert_same(local, load_checkpoint(legacy).local)

    # Fewer ranks wrote this one: ranks beyond them get local None.
    single = load_checkpoint(latest_checkpoint(root / "single"))
    assert (single.info.world_size, single.local is None) == (1, rank >= 1)

    # Rank-dependent 'replicated' state, or unsavable state on one rank only,
    # fails on every rank instead of hanging in a collective.
    errors = []
    for bad_trainer, bad_local in (({"epoch": rank}, {}), ({}, {"f": print} if rank == 1 else {})):
        try:
            save_checkpoint(root / "bad", step=1, weights={}, trainer=bad_trainer, local=bad_local)
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__)
    assert len(errors) == 2, errors
    assert latest_checkpoint(root / "bad") is None

    names = sorted(p.name for p in model_dir.iterdir())
    result = {"latest": [str(latest.path), latest.step, latest.format, latest.world_size], "names": names}
    (root / f"result-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    td.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]))
