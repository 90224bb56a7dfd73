"""Retention policies: which ``iter_<step>`` snapshots a run keeps, as values.

A policy is a frozen value called with the complete snapshots on disk
(``Snapshot(step, metrics)``, oldest first) and returning the steps it keeps,
as Orbax's ``LatestN`` / ``BestN`` / ``AnyPreservationPolicy``. Policies
compose with ``any_of`` (or ``|``); :func:`decide` applies one and always
keeps the steps the caller protects. Deleting is the save path's job
(``pimm_fn.checkpoint``): it runs after each publish, never touches ``last``
or the ``model_best`` files, and protects the newest complete checkpoint.

>>> policy = keep_last(2) | keep_best(1, "mIoU")
>>> policy
any_of(keep_last(2), keep_best(1, 'mIoU'))
>>> snaps = [Snapshot(10, {"mIoU": 0.7}), Snapshot(20, {"mIoU": 0.5}), Snapshot(30, {"mIoU": 0.6})]
>>> sorted(policy(snaps)), [s.step for s in decide(policy, snaps).remove]
([10, 20, 30], [])
>>> [s.step for s in decide(keep_last(1), snaps).remove]
[10, 20]
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.validate import finite, int_at_least, is_callable, non_empty_str, one_of, optional

__all__ = [
    "Snapshot",
    "Policy",
    "Decision",
    "keep_last",
    "keep_every",
    "keep_best",
    "any_of",
    "decide",
    "resolve",
    "recordable",
]


def recordable(metrics: Mapping[Any, Any] | None) -> dict[str, float]:
    """The finite real values of ``metrics``, as floats: what a checkpoint records for retention.

    >>> recordable({"mIoU": 0.5, "loss": float("nan"), "epoch": 3, "done": True})
    {'mIoU': 0.5, 'epoch': 3.0}
    """
    return {str(k): float(v) for k, v in dict(metrics or {}).items() if finite(v)}


def _recorded(metrics: Mapping[Any, Any] | None) -> FrozenMap:
    return FrozenMap(recordable(metrics))


@attrs.frozen
class Snapshot:
    """A complete snapshot as retention sees it: its step and the run's metrics at that save."""

    step: int = attrs.field(validator=int_at_least(0))
    metrics: FrozenMap = attrs.field(default=FrozenMap(), converter=_recorded)


Policy = Callable[[Sequence[Snapshot]], Iterable[int]]
"""A retention policy: one below, or a callable of one's own taking the complete snapshots (oldest first) and
returning the steps to keep."""


class _Policy:
    """Gives every policy ``a | b`` for ``any_of(a, b)``."""

    def __call__(self, snapshots: Sequence[Snapshot]) -> frozenset[int]:
        raise NotImplementedError

    def __or__(self, other: Policy) -> "_AnyOf":
        return any_of(self, other)


@attrs.frozen(repr=False)
class _KeepLast(_Policy):
    factory_name: ClassVar[str] = "keep_last"
    n: int = attrs.field(validator=int_at_least(0))

    def __call__(self, snapshots: Sequence[Snapshot]) -> frozenset[int]:
        steps = sorted(s.step for s in snapshots)
        # Never steps[len(steps) - n:]: with fewer than n snapshots that start is negative and slices from the end.
        return frozenset(steps[max(0, len(steps) - self.n) :] if self.n else ())

    def __repr__(self) -> str:
        return f"keep_last({self.n})"


@attrs.frozen(repr=False)
class _KeepEvery(_Policy):
    factory_name: ClassVar[str] = "keep_every"
    k: int = attrs.field(validator=int_at_least(1))

    def __call__(self, snapshots: Sequence[Snapshot]) -> frozenset[int]:
        return frozenset(s.step for s in snapshots if s.step % self.k == 0)

    def __repr__(self) -> str:
        return f"keep_every({self.k})"


@attrs.frozen(repr=False)
class _KeepBest(_Policy):
    factory_name: ClassVar[str] = "keep_best"
    k: int = attrs.field(validator=int_at_least(1))
    metric: str = attrs.field(validator=non_empty_str)
    mode: str = attrs.field(default="max", validator=one_of("max", "min"))

    def __call__(self, snapshots: Sequence[Snapshot]) -> frozenset[int]:
        rated = [s for s in snapshots if self.metric in s.metrics]
        sign = -1.0 if self.mode == "max" else 1.0
        # Ties go to the older snapshot: the first to reach a value is the best, as best_on decides.
        ranked = sorted(rated, key=lambda s: (sign * s.metrics[self.metric], s.step))
        return frozenset(s.step for s in ranked[: self.k])

    def __repr__(self) -> str:
        mode = "" if self.mode == "max" else f", mode={self.mode!r}"
        return f"keep_best({self.k}, {self.metric!r}{mode})"


_A_POLICY = is_callable.with_hint("pass a retention policy: keep_last(3), keep_best(2, 'mIoU') or any_of(...)")


def _policies(instance: object, attribute: "attrs.Attribute[Any]", value: tuple[Policy, ...]) -> None:
    if not value:
        raise ValueError("any_of: give at least one policy, e.g. any_of(keep_last(3), keep_best(1, 'mIoU'))")
    for policy in value:
        _A_POLICY.check(policy, "policies", owner="any_of")


@attrs.frozen(repr=False)
class _AnyOf(_Policy):
    factory_name: ClassVar[str] = "any_of"
    policies: tuple[Policy, ...] = attrs.field(validator=_policies)

    def __call__(self, snapshots: Sequence[Snapshot]) -> frozenset[int]:
        return frozenset().union(*(_kept(p, snapshots) for p in self.policies))

    def __repr__(self) -> str:
        return f"any_of({', '.join(map(repr, self.policies))})"


def keep_last(n: int) -> _KeepLast:
    """Keep the ``n`` newest snapshots, all of them while there are fewer (``n=0``: none; ``last`` always stays).

    >>> sorted(keep_last(2)([Snapshot(s) for s in (4, 8, 12)]))
    [8, 12]
    >>> sorted(keep_last(5)([Snapshot(s) for s in (4, 8)]))
    [4, 8]
    """
    return _KeepLast(n)


def keep_every(k: int) -> _KeepEvery:
    """Keep the snapshots whose step is a multiple of ``k``: a sparse history of the run.

    >>> sorted(keep_every(100)([Snapshot(s) for s in (50, 100, 150, 200)]))
    [100, 200]
    """
    return _KeepEvery(k)


def keep_best(k: int, metric: str, *, mode: str = "max") -> _KeepBest:
    """Keep the ``k`` snapshots with the best ``metric`` (``mode`` ``"max"`` or ``"min"``).

    A snapshot's metric is the value the run last published before that save
    (an evaluation at the save's step included: the save runs after it). Snapshots
    without a finite value of ``metric`` are never among the best; combine
    with ``keep_last`` to keep those too. Ties keep the older snapshot.

    >>> snaps = [Snapshot(1, {"loss": 0.3}), Snapshot(2, {"loss": 0.1}), Snapshot(3)]
    >>> sorted(keep_best(1, "loss", mode="min")(snaps))
    [2]
    """
    return _KeepBest(k, metric, mode)


def any_of(*policies: Policy) -> _AnyOf:
    """Keep what any of ``policies`` keeps; ``a | b`` is ``any_of(a, b)``.

    >>> any_of(keep_last(1), keep_every(10)) == (keep_last(1) | keep_every(10))
    True
    """
    flat: list[Policy] = []
    for policy in policies:  # any_of is associative: nest-free, so equal compositions compare equal
        flat.extend(policy.policies if isinstance(policy, _AnyOf) else (policy,))
    return _AnyOf(tuple(flat))


def _kept(policy: Policy, snapshots: Sequence[Snapshot]) -> frozenset[int]:
    """What ``policy`` keeps, checked: a policy of one's own must return steps."""
    kept = policy(snapshots)
    try:
        return frozenset(int(step) for step in kept)
    except (TypeError, ValueError):
        raise TypeError(
            f"retention policy {policy!r:.80} must return the steps to keep (a set of ints), got {kept!r:.80}"
        ) from None


@attrs.frozen
class Decision:
    """What :func:`decide` chose: the snapshots to ``keep`` and to ``remove``, oldest first."""

    keep: tuple[Snapshot, ...]
    remove: tuple[Snapshot, ...]


def decide(policy: Policy, snapshots: Iterable[Snapshot], *, protect: Iterable[int] = ()) -> Decision:
    """Apply ``policy`` to ``snapshots``; the steps in ``protect`` are kept whatever it says.

    Args:
        policy: a retention policy (``keep_last(3)``, ``any_of(...)``, or a
            callable of one's own taking the snapshots and returning steps).
        snapshots: the complete snapshots, one per step.
        protect: steps never removed (the save path passes the newest
            complete checkpoint's when it is a snapshot).

    Returns:
        A :class:`Decision`; the same inputs always give the same one.

    Raises:
        ValueError: two snapshots share a step.
    """
    ordered = tuple(sorted(snapshots, key=lambda s: s.step))
    steps = [s.step for s in ordered]
    if len(set(steps)) != len(steps):
        raise ValueError(f"decide: snapshots must have distinct steps (got steps {steps})")
    kept = _kept(policy, ordered) | frozenset(protect)
    return Decision(tuple(s for s in ordered if s.step in kept), tuple(s for s in ordered if s.step not in kept))


def resolve(keep: Policy | None, keep_snapshots: int | None, *, caller: str) -> Policy | None:
    """The one policy a ``keep=`` and a legacy ``keep_snapshots=`` stand for, or ``None`` (keep all).

    >>> resolve(None, 3, caller="loop")
    keep_last(3)

    Raises:
        TypeError: ``keep`` is not a policy.
        ValueError: both are given, or ``keep_snapshots`` is not an int >= 0.
    """
    if keep is not None and keep_snapshots is not None:
        raise ValueError(
            f"{caller}: give 'keep' or 'keep_snapshots', not both; keep_snapshots={keep_snapshots} is "
            f"keep=keep_last({keep_snapshots}), and any_of(keep_last({keep_snapshots}), ...) combines it"
        )
    if keep_snapshots is not None:
        return keep_last(int_at_least(0).check(keep_snapshots, "keep_snapshots", owner=caller))
    return optional(_A_POLICY).check(keep, "keep", owner=caller)
