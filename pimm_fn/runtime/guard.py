"""Run-time proof that every rank is about to run the same collective effects.

Before an event's effects execute, the ranks compare one 64-bit digest of
their collective effects in a single small all-reduce. Equal digests cost
nothing more. A mismatch is turned into ``CollectiveDivergenceError`` on
every rank, naming the event, the step, the hooks and what each rank
wanted, instead of a hang inside the first mismatched collective.
"""

import hashlib

import torch
import torch.distributed as td

from pimm_fn.core.effects import Scope

__all__ = ["CollectiveDivergenceError", "AgreementGuard", "collective_part"]


class CollectiveDivergenceError(RuntimeError):
    """Ranks disagree on the collective effects of an event."""


def collective_part(emitted) -> tuple:
    """The (hook index, effect) pairs every rank must execute alike."""
    return tuple((i, e) for i, e in emitted if e.scope is Scope.COLLECTIVE)


def _digest(event, step, collective) -> int:
    text = repr((type(event).__name__, step, collective)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


class AgreementGuard:
    """Compares collective effects across the default process group."""

    def __init__(self, hooks):
        self.hooks = hooks
        backend = td.get_backend()
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._buffer = torch.empty(2, dtype=torch.int64, device=self.device)

    def check(self, state, event, emitted) -> None:
        if not self.hooks.active(type(event)):
            return  # no hook can emit here, on any rank: the hook lists are identical
        collective = collective_part(emitted)
        digest = _digest(event, state.progress.global_step, collective)
        self._buffer[0], self._buffer[1] = digest, -digest
        td.all_reduce(self._buffer, op=td.ReduceOp.MAX)
        high, neg_low = self._buffer.tolist()
        if high != digest or -neg_low != digest:
            self._raise(state, event, collective)

    def _raise(self, state, event, collective):
        mine = [(i, repr(self.hooks.hooks[i]), repr(e)) for i, e in collective]
        everyone = [None] * td.get_world_size()
        td.all_gather_object(everyone, mine)
        raise CollectiveDivergenceError(describe(event, state.progress.global_step, everyone))


def describe(event, step, per_rank) -> str:
    """A report of what each rank wanted, naming the hooks whose effects differ."""
    sets = [set(wanted) for wanted in per_rank]
    common = set.intersection(*sets)
    differing = sorted({f"#{i} {hook}" for s in sets for i, hook, _ in s - common})
    lines = [
        f"ranks disagree on the collective effects of {type(event).__name__} at global step {step}; "
        f"hook(s) involved: {', '.join(differing) or '(none)'}",
    ]
    for rank, wanted in enumerate(per_rank):
        shown = "; ".join(f"{effect} from hook #{i} {hook}" for i, hook, effect in wanted) or "nothing"
        lines.append(f"  rank {rank} wanted: {shown}")
    lines.append(
        "A collective decision must depend only on rank-consistent state (progress, broadcast metrics); "
        "check the hook(s) above for rank-local inputs."
    )
    return "\n".join(lines)
