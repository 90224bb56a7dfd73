"""Altered DDP and FSDP2 checkpoints on 2 ranks: resumed identically or refused on every rank, never running code.

One launch (``_mutation_workers.mutated``) covers a fixed representative set
of mutations of a genuine DDP and a genuine FSDP2 checkpoint, each resumed
into a DDP and an FSDP2 model; the hypothesis-drawn mutations run in-process
(``tests/checkpoint/test_mutated_checkpoints.py``).
"""

import pytest

from _launch import results, run_ranks

pytestmark = pytest.mark.distributed


def test_mutated_checkpoints_resume_or_are_refused_on_every_rank_and_never_run_code(tmp_path):
    """Genuine checkpoints resume (an FSDP2 one into DDP too: resharding stays supported); each mutation is refused
    by CheckpointError or ResumeError alike on both ranks, with no hang; no payload's marker file ever appears."""
    run_ranks("_mutation_workers:mutated", 2, tmp_path, timeout=240, root=str(tmp_path / "runs")).check()
    ranks = results(tmp_path, "mutated", 2)
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) == 30
    for case, (outcome, ran) in ranks[0].items():
        other, ran_there = ranks[1][case]
        assert not ran and not ran_there, f"{case}: the payload ran"
        assert (outcome == "ok") == (other == "ok"), f"{case}: rank 0 {outcome!r}, rank 1 {other!r}"
        if case.split("/")[1].startswith("genuine"):
            refused = case == "ddp/genuine->fsdp"  # a replicated model's optimizer state is keyed by position
            assert outcome.startswith("ResumeError") if refused else outcome == "ok", f"{case}: {outcome}"
        else:
            assert outcome.split(":")[0] in ("CheckpointError", "ResumeError"), f"{case}: {outcome}"
    assert "pickled object" in ranks[0]["fsdp/shard-entry->ddp"][0]
    assert "pickled object" in ranks[0]["ddp/claim->ddp"][0]
