"""Run-time proof that every rank is about to run the same collective effects.

What is compared:

* once, at the first event of a run (``ModifyConfig`` when fresh,
  ``BeforeTrain`` when resumed), before any step: the *setup*. For each hook,
  in order, its identity (``pimm_fn.core.hook.key``: the factory call for a
  built-in, ``save_every(2)``, ``evaluate_every(4, acc)``,
  ``save_every(5, async_save=True)``), the identities of the leaves of a
  ``chain``, and what each declares (events, ``every``, ``rank_consistent``);
  then the schedule (``iters_per_epoch``, ``max_epochs``, the progress and the
  lifecycle position). One 63-bit digest in one all-reduce; only when the
  digests differ are the details gathered, to say which hook, at which
  position, differs and what each rank has. A rank-consistent hook's (every
  built-in's) collective effects are a function of its arguments and the
  progress alone, so equal setups make them equal on every rank for the
  whole run;
* then, only where a *watched* hook is called: a digest of the watched hooks'
  collective effects (and whether there are any), in one small asynchronous
  all-reduce. A watched hook is a top-level hook that does not declare
  ``rank_consistent = True``. For ``AfterStep`` the guard honours its
  cadence: a watched hook with ``every = 100`` costs one comparison per 100
  steps; for other events, one per event of a type it listens to.

A mismatch becomes ``CollectiveDivergenceError`` on every rank, naming the
hook and what each rank has or wanted, instead of a hang inside the first
mismatched collective. ``comparisons`` counts the per-event comparisons
started, for tests and benchmarks.

Cost. A blocking all-reduce is a network round trip: on a tiny gloo DDP step
it costs as much as the step itself. So a per-event comparison is
asynchronous and only waited for when it matters:

* a rank with collective effects for the event waits at once and runs them
  only if every rank agrees;
* a rank with none does not wait: its comparison completes while it trains,
  and it reads the answer at the next guarded event (or when the run ends).

On a divergence every rank that waited learns whether all ranks waited. If
so, all raise at once. If not (some rank had nothing to run and went on), the
ranks that know skip the event's watched effects, so no rank enters a
collective the others skip; everyone then raises at the next guarded event,
where all ranks read the answer at the same point of their collective
sequence. Nothing collective runs between the divergence and the error
except what every rank runs anyway (training steps, built-in hooks' effects).

Measured by ``benchmarks/guard.py`` on a tiny 2-rank gloo DDP step (1.3 to
2.2 ms on 2 shared CPU cores; ``benchmarks/RESULTS.md``), time inside the
guard per step: built-in hooks only, about 5 us (0.3%); a hook of your own
called every step, about one small collective's latency, 600 us (a quarter
of that tiny step, under 1% of a 100 ms one); the same hook with
``every = 100``, about 12 us. Where it matters, declare the hook
``rank_consistent`` (checking the claim with ``pimm_fn.testing``'s
simulator), give it a cadence (``every``), or pass ``check_agreement=False``.
"""

import hashlib

import attrs
import torch
import torch.distributed as td

from pimm_fn import dist
from pimm_fn.core import events as ev
from pimm_fn.core.effects import Scope
from pimm_fn.runtime.engine.implied import Implied, Setup, describe_setup, schedule_of
from pimm_fn.runtime.errors import CollectiveDivergenceError

__all__ = [
    "AgreementGuard",
    "collective_part",
    "describe",
    "digest_of",
]


def collective_part(emitted) -> tuple:
    """The (hook index, effect) pairs every rank must execute alike."""
    return tuple((i, e) for i, e in emitted if e.scope is Scope.COLLECTIVE)


def digest_of(*parts) -> int:
    """A 63-bit digest of ``parts``' ``repr``: what ranks and replica groups all-reduce to compare what they folded.

    Equal values give equal digests in every process, and ``-digest`` fits an
    ``int64`` too: the ``MAX`` of ``[d, -d]`` is every process's own exactly
    when all are equal.
    """
    text = repr(parts).encode()
    # 63 bits, so that -digest fits an int64 too.
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


@attrs.define
class _Comparison:
    """One event's all-reduce in flight, and what this rank wanted."""

    work: td.Work
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
    """Compares the setup, then the watched hooks' collective effects, across the default process group."""

    def __init__(self, implied):
        """``implied``: what the run's hooks imply (``pimm_fn.runtime.engine.implied``), or their ``Chain``, read into one."""
        self.implied = implied if isinstance(implied, Implied) else Implied.of(implied, guarded=True)
        self.hooks = self.implied.hooks
        self.device = dist.collective_device()
        self.watched = self.implied.watched
        self._cadences = self.implied.watched_cadences
        self.comparisons = 0  # per-event comparisons started (the setup's is not counted)
        self._started = False
        self._guarded: dict = {}  # event type other than AfterStep -> whether a watched hook listens to it
        self._pending: _Comparison | None = None  # not waited for yet: this rank had nothing to run
        self._diverged: _Comparison | None = None  # known bad, to be raised at the next sync point

    def skips(self, entry) -> bool:
        """Whether an effect of an event found divergent must not run: a watched hook's."""
        return entry.hook in self.watched

    def watches(self, event_type) -> bool:
        """Whether the loop must hand this guard events of ``event_type``.

        The events a run starts with (where the setup is compared, at the
        same point on every rank), and those a watched hook may be called for.
        """
        return self.implied.compared(event_type)

    def guards(self, event) -> bool:
        """Whether a watched hook is called for ``event``: the same answer on every rank once setups agree."""
        cls = event.__class__
        if cls is ev.AfterStep:
            step = event.step
            for every in self._cadences:
                if not step % every:
                    return True
            return False
        guarded = self._guarded.get(cls)
        if guarded is None:
            guarded = self._guarded[cls] = any(i in self.watched for i in self.hooks.active(cls))
        return guarded

    def check(self, state, event, emitted) -> bool:
        """Compare ``event``'s collective effects; False: skip the watched ones (a divergence is being reported).

        Raises:
            CollectiveDivergenceError: on every rank, when the ranks' setups or collective effects differ.
        """
        if not self._started:
            self._start(state)
        if not self.guards(event):
            return True  # no watched hook is called here, on any rank: the setups are identical
        self.settle()
        self.comparisons += 1
        step = state.progress.global_step
        collective = tuple((i, e) for i, e in collective_part(emitted) if i in self.watched)
        digest = digest_of(type(event).__name__, step, collective)
        has = 1 if collective else 0
        buffer = torch.tensor([digest, -digest, has, -has], dtype=torch.int64).to(self.device)
        work = td.all_reduce(buffer, op=td.ReduceOp.MAX, async_op=True)
        comparison = _Comparison(work, buffer, digest, event, step, collective)
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
        """One blocking comparison of the setup, at the first event of the run, before any step.

        Every rank reaches it at its first event whatever its hooks, so even
        ranks with different hook lists meet in this all-reduce.
        """
        self._started = True
        setup = Setup(self.implied.setups, schedule_of(state))  # the hooks' part derived once, with the rest
        digest = digest_of(setup)
        buffer = torch.tensor([digest, -digest], dtype=torch.int64).to(self.device)
        td.all_reduce(buffer, op=td.ReduceOp.MAX)
        high, neg_low = buffer.tolist()
        if high == digest and -neg_low == digest:
            return
        everyone = [None] * td.get_world_size()
        td.all_gather_object(everyone, setup)
        raise CollectiveDivergenceError(describe_setup(everyone))

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
        setups = self.implied.setups
        mine = [(i, setups[i].key, repr(e)) for i, e in comparison.collective]  # identities without addresses
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
