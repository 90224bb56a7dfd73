"""What a failed step means for the other ranks: either all continue exactly, or all stop; none hangs.

A step that raises on one rank leaves the others running: they enter the
next collective (DDP's gradient all-reduce, an evaluation's broadcast, a
checkpoint save) and would wait there for the failed rank until the process
group's timeout. So when a step fails in a process group of two or more
ranks, the loop asks ``across_ranks`` what to do, and only then (never on a
step that succeeds: the common path costs nothing) the ranks talk, through
the group's key-value store rather than a collective, since a rank that did
not fail is inside some other collective that a new one would pair with:

* every failed rank writes where it stopped (global step and phase) and
  waits up to ``AGREE_SECONDS`` for every other rank's;
* every rank stopped at the same step in the same phase (a deterministic
  bug in a hook or a handler, raised alike everywhere): no rank is inside a
  collective, the run is intact, and ``run()`` on every rank continues it
  exactly, as in one process. The phase compared is rank-independent
  (``place``): an effect's ``values`` (a ``Log`` record's numbers, each
  rank's own) are left out, so the same record failing on every rank is alike;
* otherwise (a rank did not report in time, or ranks stopped in different
  places): the first rank to decide shuts the default process group down
  (``torch.distributed.destroy_process_group``), so that the ranks waiting
  in a collective get an error at once. Each of those raises
  ``PeerFailureError`` naming the rank that failed, its step, phase and
  error; a rank that failed itself re-raises its own error with a note.
  The run cannot continue in these processes: rebuild it on every rank in a
  fresh process group (restart the job) with ``resume="auto"``.

The decision is one atomic ``compare_set`` in the store, so all ranks act on
the same one. The store of a group shut down is kept alive, for the ranks
still reading the failure reports from it.

The reports go through the default group's store, read with
``torch.distributed.distributed_c10d._get_default_store`` (no public API
gives it); without it every failure shuts the group down. Ranks that fail
alike but more than ``AGREE_SECONDS`` apart (one spends longer in work of
its own before the failing point) count as not alike: every rank still
stops, none hangs, but the run is not continued in process.

Not covered: a rank that fails outside a step (in the user's code between
``run()`` calls) or never reaches the loop's error path (killed, hung in
code of its own) leaves the others to the process group's own timeout.
"""

import datetime
import re
from typing import Any

import attrs
import torch.distributed as td

from pimm_fn.runtime.errors import PeerFailureError

__all__ = ["across_ranks", "place", "AGREE_SECONDS"]

AGREE_SECONDS = 5.0  # how long a failed rank waits to learn whether every rank failed alike
_PREFIX = "pimm_fn/failed"
_CONTINUE, _ABORT = "continue", "abort"


_round: list[Any] = [None, 0]  # [the process group, failures handled in it]: every rank counts alike until a shutdown
_kept = []  # the stores of groups shut down: their reports stay readable for the other ranks


def _store():
    try:
        return td.distributed_c10d._get_default_store()
    except Exception:  # no store to agree through: stop everyone
        return None


_RANK_LOCAL = re.compile(r", values=.*$")  # an effect's last field holding rank-local numbers (Log's), to the end


def place(phase: str) -> str:
    """``phase`` as every rank failing at the same point writes it: an effect's rank-local ``values`` left out.

    A ``Log`` record's numbers are each rank's own (its losses), so its repr
    differs by rank; its step and kind do not.

    >>> place("effect Log(step=5, kind='train', values=FrozenMap({'loss': 0.25}))")
    "effect Log(step=5, kind='train'"
    >>> place("effect Evaluate(evaluator='val', step=8, broadcast=True)")
    "effect Evaluate(evaluator='val', step=8, broadcast=True)"
    """
    return _RANK_LOCAL.sub("", phase) if phase.startswith("effect ") else phase


def across_ranks(stopped, error: BaseException):
    """Agree with the other ranks on a failed step; returns ``(interruption, error to raise instead or None)``.

    Args:
        stopped: this rank's ``Interruption``.
        error: the exception this rank's step raised.

    Returns:
        ``(stopped, None)`` when there are no other ranks or every rank
        failed alike: the run continues exactly. Else ``stopped`` marked
        ``continues=False`` and, on a rank whose failure came from the
        shutdown, the ``PeerFailureError`` to raise instead of ``error``.
    """
    if not td.is_available() or not td.is_initialized() or td.get_world_size() < 2:
        return stopped, None
    group, rank, world = td.group.WORLD, td.get_rank(), td.get_world_size()
    if _round[0] is not group:
        _round[:] = [group, 0]
    n = _round[1]
    _round[1] += 1
    store = _store()
    where = f"{stopped.step}\n{place(stopped.phase)}"  # compared: rank-independent
    keys = [f"{_PREFIX}/{n}/{r}" for r in range(world)]
    decision = f"{_PREFIX}/{n}/decision"
    reports = {}
    try:
        store.set(keys[rank], f"{where}\n{type(error).__name__}: {str(error)[:300]}")
        late = store.check([decision])  # decided already: this rank's error came from the shutdown
        want = _ABORT
        if not late:
            try:
                store.wait(keys, datetime.timedelta(seconds=AGREE_SECONDS))
                want = _CONTINUE
            except Exception:  # a rank did not fail: it is inside a collective, waiting for this one
                pass
        reports = {r: store.get(k).decode() for r, k in enumerate(keys) if store.check([k])}
        if want is _CONTINUE and any(not v.startswith(where + "\n") for v in reports.values()):
            want = _ABORT
        decided = store.compare_set(decision, "", want).decode()
    except Exception:  # no store, or it is gone: stop everyone
        late, decided = False, _ABORT
    if decided == _CONTINUE:
        return stopped, None
    _shut_down(store)
    stopped = attrs.evolve(stopped, continues=False)
    others = {r: v for r, v in reports.items() if r != rank}
    if late and others:
        peer = PeerFailureError(
            f"{_describe(others)}; so rank {rank} stopped too, at step {stopped.step} during {stopped.phase} "
            f"({type(error).__name__}: {str(error)[:200]}). The process group is shut down: rebuild the run on "
            f'every rank in a fresh process group (restart the job) with resume="auto"'
        )
        peer.__cause__ = error
        return stopped, peer
    alike = [r for r, v in others.items() if v.startswith(where + "\n")]
    missing = sorted(set(range(world)) - set(reports) - {rank})
    note = (
        f"rank {rank}: "
        + (
            f"rank(s) {', '.join(map(str, missing))} did not fail here (they went on, into a collective that waits for this rank)"
            if missing
            else f"the ranks failed in different places ({_describe(others)})"
            if len(alike) < len(others)
            else "the other ranks stopped on this failure"
        )
        + (
            ", so the process group was shut down to stop every rank; run() cannot continue this run: rebuild it "
            'on every rank in a fresh process group (restart the job) with resume="auto"'
        )
    )
    if hasattr(error, "add_note"):
        error.add_note(note)
    return stopped, None


def _shut_down(store) -> None:
    if store is not None:
        _kept.append(store)
    try:
        td.destroy_process_group()  # closes the group's connections: a peer's collective fails at once
    except Exception:
        pass


def _describe(reports: dict) -> str:
    parts = []
    for r, report in sorted(reports.items()):
        step, phase, what = (report.split("\n", 2) + ["", ""])[:3]
        parts.append(f"rank {r} failed at step {step} during {phase} ({what})")
    return "; ".join(parts)
