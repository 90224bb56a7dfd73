"""Every live replica group folds the same trace: compared at each step's vote, across the groups.

Within one group the agreement guard (``pimm_fn.runtime.engine.guard``)
compares its ranks. Across the groups of a ``FaultTolerance`` job the same
promise holds (``pimm_fn.core.membership``, the simulator): each group
folds the same hooks over the same progress, so each executes the same
collective effects and the writes one group makes for all (checkpoints,
best weights). A group whose hooks, their arguments or its schedule differ,
or a hook of its own that decides from a group-local input, breaks it: the
groups would go on averaging gradients while saving, evaluating and
stopping apart.

So at each step's boundary, once the quorum formed (``Agreement.start``),
each group sends one small tensor through an all-reduce on the manager's
process group (``MAX`` of ``[d, -d]`` for each of two digests: all equal
exactly when every group reads back its own): the digest of its setup (each hook's identity and
declarations, and the schedule: ``pimm_fn.runtime.engine.implied``) and the
digest of the *window*, the collective and written effects its hooks
emitted since the last committed step (``fold``, from the interpreter's
``check``). A group healed since then took a peer's ``State`` and leaves its
window out of the comparison (its own start or earlier life is in it) until
its next committed step. The all-reduce goes on while the step trains, ahead
of the gradients' on the same group, and its answer is read after the
step's vote (``judge``): only a committed vote's is sound (a failed one's
all-reduce may have been cut); the window is then emptied, and after a
failed vote it goes on to the next. On a difference every group sends what it folded (the hooks, the
schedule, the window, as JSON: one all-reduce more, only then) and raises
``CollectiveDivergenceError`` naming the groups and what differs, before
the step's ``AfterStep``: the groups stop together instead of training on
apart. ``Parallel(check_agreement=False)`` turns it off.

Cost: one all-reduce of 4 ``int64`` a step, in flight during the forward
and backward passes, issued on the group itself: the manager's
``allreduce`` would add its own bookkeeping (a timeout watched on its
future, about 0.3 ms to issue and 0.3 ms to wait on a 2-core machine), and
an error here is the step's all the same (its gradients' all-reduce, on the
same group, fails too, and with it the vote). ``benchmarks/fault_tolerance.py``
measures it.
"""

import json

import torch
from torch.distributed import AllreduceOptions, ReduceOp

from pimm_fn.core import untrusted_json
from pimm_fn.core.effects import SaveCheckpoint, Scope, WriteBest
from pimm_fn.runtime.engine.guard import digest_of
from pimm_fn.runtime.engine.implied import HookSetup, Setup, describe_setup, hook_setups, schedule_of, stable
from pimm_fn.runtime.errors import CollectiveDivergenceError

__all__ = ["Agreement", "describe"]

_WRITES = (SaveCheckpoint, WriteBest)  # folded by every group, written by one: part of what the groups agree on
_LEFT_OUT = -(2**63)  # a healed group's window: below every digest, so the others' maximum ignores it
_ROW = 1 << 16  # bytes of one group's account of what it folded, sent only on a difference
_SHOWN = 50  # the window's last effects a group accounts for


class Agreement:
    """What one replica group folded since its last committed vote, compared with the other groups at each vote.

    Args:
        group: this group's id, named in a difference.
    """

    def __init__(self, group: str):
        self.group = group
        self.comparisons = 0  # steps whose digests were sent, for tests and benchmarks
        self._window: list[tuple[str, int, object]] = []  # (event, hook, effect) since the last committed vote
        self._healed = False  # the window holds this group's own start: left out until a committed vote
        self._setups: tuple[object, tuple, int] | None = None  # (implied, its hooks' setups, their digest)
        self._sent: tuple | None = None  # (buffer, work, setups digest, schedule, window or None) in flight

    def fold(self, event, emitted) -> None:
        """The interpreter's ``check``: keep the effects of ``event`` the groups must agree on."""
        for i, effect in emitted:
            if effect.scope is Scope.COLLECTIVE or effect.__class__ in _WRITES:
                self._window.append((type(event).__name__, i, effect))

    def healed(self) -> None:
        """This group took a peer's ``State``: what it folded before is its own; left out until a committed vote."""
        self._window.clear()
        self._healed = True

    def start(self, manager, group, run) -> None:
        """Send this group's digests (``run``'s hooks and schedule, the window), at a step's boundary; see ``judge``.

        ``group`` is ``manager``'s process group, configured by its last quorum.
        """
        self._sent = None
        if manager.num_participants() < 2:
            return
        setups, hooks = self._hooks(run)
        schedule = schedule_of(run.state)
        own = digest_of(hooks, schedule)
        window = None if self._healed else self._shown()
        folded = _LEFT_OUT if window is None else digest_of(window)
        buffer = torch.tensor([own, -own, folded, _LEFT_OUT if window is None else -folded], dtype=torch.int64)
        try:
            work = _allreduce(group, buffer, ReduceOp.MAX)
        except Exception:  # noqa: BLE001 - the group failed: so do the gradients' all-reduce and the vote
            return
        self._sent = (buffer, work, own, folded, (setups, schedule, window))
        self.comparisons += 1

    def judge(self, manager, group, step: int, committed: bool) -> None:
        """After the vote of ``step``: on a committed one, raise if the groups differ; the window then starts anew.

        Raises:
            CollectiveDivergenceError: on every group alike, naming the groups and what differs.
        """
        sent, self._sent = self._sent, None
        if not committed:
            return  # the window goes on: a failed vote's all-reduce may have been cut
        self._window.clear()
        self._healed = False
        if sent is None:
            return
        buffer, work, own, folded, compared = sent
        try:
            work.wait()
        except Exception:  # noqa: BLE001 - cut after the vote: nothing to judge from
            return
        high, neg_low, window_high, neg_window_low = buffer.tolist()
        agreed = high == own == -neg_low
        if folded == _LEFT_OUT:  # the others' windows alike, or none but this one's
            agreed = agreed and (window_high == _LEFT_OUT or window_high == -neg_window_low)
        else:
            agreed = agreed and window_high == folded == -neg_window_low
        if not agreed:
            raise CollectiveDivergenceError(describe(step, self._accounts(manager, group, *compared)))

    def _hooks(self, run) -> tuple[tuple, int]:
        """``(setups, digest)`` of ``run``'s hooks, derived once per hook list."""
        implied = run.ctx.implied
        if self._setups is None or self._setups[0] is not implied:
            setups = hook_setups(implied.hooks.hooks)
            self._setups = (implied, setups, digest_of(setups))
        return self._setups[1], self._setups[2]

    def _shown(self) -> tuple:
        """The window as compared and shown: effects by their stable text (a ``Call``'s function by name)."""
        return tuple((event, i, stable(repr(effect))) for event, i, effect in self._window)

    def _accounts(self, manager, group, setups: tuple, schedule: tuple, window: tuple | None) -> list[dict | None]:
        """Every participant's account of what it folded (``None`` where one did not arrive whole), in quorum order.

        One all-reduce (``SUM``) of a row per participant: each fills its own,
        so each holds all of them after it.
        """
        account = {
            "group": self.group,
            "hooks": [[h.key, list(h.leaves), list(h.declared)] for h in setups],
            "schedule": [[name, value] for name, value in schedule],
            "window": None if window is None else [list(e) for e in window[-_SHOWN:]],
        }
        text = json.dumps(account, default=repr).encode("utf-8")[:_ROW]
        rows = torch.zeros(manager.num_participants(), _ROW, dtype=torch.uint8)
        rows[manager.participating_rank(), : len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        try:
            _allreduce(group, rows, ReduceOp.SUM).wait()
        except Exception:  # noqa: BLE001 - said below as accounts that did not arrive
            rows.zero_()
        accounts: list[dict | None] = []
        for row in rows:
            try:
                accounts.append(untrusted_json.loads(bytes(row.numpy().tobytes()).rstrip(b"\0").decode("utf-8")))
            except (ValueError, UnicodeDecodeError):  # cut at _ROW, or the all-reduce failed: said as unknown
                accounts.append(None)
        return accounts


def _allreduce(group, tensor: torch.Tensor, op: ReduceOp.RedOpType):
    options = AllreduceOptions()
    options.reduceOp = ReduceOp(op)
    return group.allreduce([tensor], options)


def describe(step: int, accounts: list[dict | None]) -> str:
    """A report of how the replica groups' accounts (``Agreement._accounts``) differ at the vote of ``step``.

    >>> hooks = [["save_every(4)", [], ["save_every(4): events=AfterStep, every=4, rank_consistent=True"]]]
    >>> a = {"group": "0", "hooks": hooks, "schedule": [["global_step", 0]], "window": []}
    >>> b = dict(a, group="1", hooks=[["save_every(3)", [], ["save_every(3): ..."]]])
    >>> print(describe(1, [a, b]).splitlines()[1])
      hook #0: group 0: save_every(4); group 1: save_every(3)
    """
    known = [a for a in accounts if a is not None]
    names = [f"group {a['group']}" for a in known]
    lead = f"replica groups disagree at the vote of step {step}"
    if len(known) < len(accounts):
        lead += f" ({len(accounts) - len(known)} of them could not say what they folded)"
    setups = [
        Setup(
            tuple(HookSetup(key, tuple(leaves), tuple(declared)) for key, leaves, declared in a["hooks"]),
            tuple((name, value) for name, value in a["schedule"]),
        )
        for a in known
    ]
    if len(set(setups)) > 1:
        found = describe_setup(setups, names=names).split("\n", 1)
        return f"{lead}; {found[0]}\n{found[1]}"
    lines = [
        f"{lead}: they folded different collective effects since their last committed step (the writes one group "
        f"makes for all included):"
    ]
    hooks = setups[0].hooks if setups else ()
    for name, a in zip(names, known, strict=True):
        if a["window"] is None:
            continue  # healed since: its own start is not compared
        shown = "; ".join(
            f"{effect} from hook #{i} {hooks[i].key if i < len(hooks) else '?'} ({event})"
            for event, i, effect in a["window"]
        )
        lines.append(f"  {name}: {shown or 'nothing'}")
    lines.append(
        "A collective decision must depend only on what every replica group holds alike (the progress, the "
        "hooks' arguments, metrics of the averaged model); check the hook(s) above for a group-local input."
    )
    return "\n".join(lines)
