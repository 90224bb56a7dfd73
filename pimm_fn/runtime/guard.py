"""Run-time proof that every rank is about to run the same collective effects.

What is compared:

* once, at ``BeforeTrain``: the hook list (by type), the progress and the
  schedule, so that every rank starts from the same place with the same hooks;
* at every event a *watched* hook listens to: a 63-bit digest of the watched
  hooks' collective effects (and whether there are any), in one small
  all-reduce.

A mismatch becomes ``CollectiveDivergenceError`` on every rank, naming the
event, the step, the hooks and what each rank wanted, instead of a hang
inside the first mismatched collective.

Watched hooks are those not *verified*. The built-in hooks are verified:
their collective effects are functions of the progress alone (a property the
test suite's simulator checks under fuzzed rank-local inputs), so comparing
them at every step would cost a collective per step and could never fail.
A hook of your own can declare ``rank_consistent = True`` to be trusted the
same way; declare it only when its collective decisions read nothing
rank-local, and check the claim with ``pimm_fn.testing``'s simulator.

Cost. A blocking all-reduce per step is a network round trip: on a tiny gloo
DDP step it cost as much as the step itself. So a watched comparison is
asynchronous and only waited for when it matters:

* a rank with collective effects for the event waits at once and runs them
  only if every rank agrees;
* a rank with none does not wait: its comparison completes while it trains,
  and it reads the answer at the next guarded event (or when the run ends).

On a divergence every rank that waited learns whether all ranks waited. If
so, all raise at once. If not (some rank had nothing to run and went on), the
ranks that know skip the event's effects, so no rank enters a collective the
others skip; everyone then raises at the next guarded event, where all ranks
read the answer at the same point of their collective sequence. Nothing
collective runs between the divergence and the error except what every rank
runs anyway (the next training step).

``loop(check_agreement=None)`` turns the guard on whenever a process group
is initialized. With verified hooks only it costs one all-reduce per run;
each event a watched hook listens to costs one tiny asynchronous all-reduce.
Measured by ``benchmarks/guard.py`` on a tiny 2-rank gloo DDP step (about
1.2 ms on 2 CPU cores): built-in hooks, 2 us per step inside the guard (0.2%);
one hook of your own listening to every step, about 300 us inside the guard
and 35-60% of that tiny step end to end, i.e. about one small collective's
latency, which is under 1% of a 100 ms step. Where that matters, declare the
hook ``rank_consistent`` or pass ``check_agreement=False``.
"""

import hashlib

import attrs
import torch
import torch.distributed as td

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Scope
from pimm_fn.core import hook as protocol

__all__ = ["CollectiveDivergenceError", "AgreementGuard", "collective_part", "describe", "verified"]

class CollectiveDivergenceError(RuntimeError):
    """Ranks disagree on the collective effects of an event."""


def collective_part(emitted) -> tuple:
    """The (hook index, effect) pairs every rank must execute alike."""
    return tuple((i, e) for i, e in emitted if e.scope is Scope.COLLECTIVE)


def verified(hook) -> bool:
    """Whether ``hook``'s collective effects are known to be identical on every rank."""
    return protocol.declared(hook).rank_consistent


def _digest(event, step, collective) -> int:
    text = repr((type(event).__name__, step, collective)).encode()
    # 63 bits, so that -digest fits an int64 too.
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@attrs.define
class _Comparison:
    """One event's all-reduce in flight, and what this rank wanted."""

    work: object
    buffer: torch.Tensor
    digest: int
    event: object
    step: int
    collective: tuple

    def outcome(self) -> tuple[bool, bool]:
        """(every rank agrees, every rank is waiting for this answer now)."""
        self.work.wait()
        high, neg_low, waiting, neg_not_waiting = self.buffer.tolist()
        agreed = high == self.digest and -neg_low == self.digest
        return agreed, -neg_not_waiting == 1


class AgreementGuard:
    """Compares collective effects across the default process group."""

    def __init__(self, hooks):
        self.hooks = hooks
        backend = td.get_backend()
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.watched = frozenset(i for i, h in enumerate(hooks.hooks) if not verified(h))
        self._guarded: dict = {}  # event type -> whether a watched hook listens to it
        self._pending: _Comparison | None = None  # not waited for yet: this rank had nothing to run
        self._diverged: _Comparison | None = None  # known bad, to be raised at the next sync point

    def skips(self, entry) -> bool:
        """Whether an effect of an event found divergent must not run: a watched hook's."""
        return entry.hook in self.watched

    def check(self, state, event, emitted) -> bool:
        """Compare ``event``'s collective effects; False: skip the watched ones (a divergence is being reported).

        Raises:
            CollectiveDivergenceError: on every rank, when the ranks disagree.
        """
        if isinstance(event, ev.BeforeTrain):
            self._start(state)
        guarded = self._guarded.get(type(event))
        if guarded is None:
            guarded = self._guarded[type(event)] = any(i in self.watched for i in self.hooks.active(type(event)))
        if not guarded:
            return True  # no watched hook can emit here, on any rank: the hook lists are identical
        self.settle()
        collective = tuple((i, e) for i, e in collective_part(emitted) if i in self.watched)
        digest = _digest(event, state.progress.global_step, collective)
        has = 1 if collective else 0
        buffer = torch.tensor([digest, -digest, has, -has], dtype=torch.int64).to(self.device)
        work = td.all_reduce(buffer, op=td.ReduceOp.MAX, async_op=True)
        comparison = _Comparison(work, buffer, digest, event, state.progress.global_step, collective)
        if not collective:
            self._pending = comparison
            return True
        agreed, everyone_waiting = comparison.outcome()
        if agreed:
            return True
        if everyone_waiting:
            self._raise(comparison)
        self._diverged = comparison
        return False

    def _start(self, state) -> None:
        """One blocking comparison of the hook list and the schedule, at the start of every run."""
        self.settle()
        p = state.progress
        setup = (
            tuple(f"{type(h).__module__}.{type(h).__qualname__}" for h in self.hooks.hooks),
            (p.iters_per_epoch, p.max_epochs, p.epoch, p.iter_in_epoch, p.global_step, state.position),
        )
        digest = _digest(ev.BeforeTrain(), p.global_step, setup)
        buffer = torch.tensor([digest, -digest], dtype=torch.int64).to(self.device)
        td.all_reduce(buffer, op=td.ReduceOp.MAX)
        high, neg_low = buffer.tolist()
        if high == digest and -neg_low == digest:
            return
        everyone = [None] * td.get_world_size()
        td.all_gather_object(everyone, setup)
        lines = [f"ranks start training differently (at global step {p.global_step}):"]
        lines += [f"  rank {r}: hooks {list(hooks)}, (iters_per_epoch, max_epochs, epoch, iter_in_epoch, "
                  f"global_step, position) = {where}" for r, (hooks, where) in enumerate(everyone)]
        lines.append("Every rank must build the same hook list and see the same number of batches per epoch "
                     "(a DistributedSampler pads the shards to equal length).")
        raise CollectiveDivergenceError("\n".join(lines))

    def settle(self) -> None:
        """Read the answer still in flight; raise on every rank if some event diverged.

        Every rank calls it at the same point: at each guarded event, and when
        the run ends.
        """
        diverged, pending = self._diverged, self._pending
        self._diverged = self._pending = None
        if diverged is not None:
            self._raise(diverged)
        if pending is not None and not pending.outcome()[0]:
            self._raise(pending)

    def _raise(self, comparison: _Comparison):
        mine = [(i, repr(self.hooks.hooks[i]), repr(e)) for i, e in comparison.collective]
        everyone = [None] * td.get_world_size()
        td.all_gather_object(everyone, mine)
        raise CollectiveDivergenceError(describe(comparison.event, comparison.step, everyone))


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
