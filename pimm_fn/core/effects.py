"""Requests hooks make, as plain frozen values; the interpreter carries them out.

Every effect has a ``scope``:

* ``COLLECTIVE``: every rank executes it, in the same order (a checkpoint
  save, an evaluation over a sharded validation set);
* ``MAIN``: only the main rank executes it (a best-model write, a log line);
* ``LOCAL``: each rank executes its own (loading warm-start weights).

Effects hold numbers, strings and tuples only, so they compare, hash, pickle
and digest identically on every rank. A callable is named, never carried:
``Call`` asks for a function of yours by its ``"module:qualname"``.

The order the effects of one event run in is ``pimm_fn.core.processing``'s:
an effect says only which group it belongs to (``runs_first``, ``runs_last``).

A log record's own fields, and the names its values may take.

A ``Log`` record is one line of ``save_dir/log.jsonl`` (and one row of
``log.csv``, one record of ``run.history``): its own fields first, then the
values it carries::

    {"step": 10, "kind": "train", "epoch": 0, "iter": 10, "of": 50, "over": "rank 0", "loss": 0.38}

``step`` and ``kind`` (``FIELDS``) say where the record belongs: a resume
keeps the lines up to its checkpoint's step. ``epoch``, ``of_epochs``,
``iter``, ``of`` and ``over`` (``POSITION``) say where a training record
was taken and whose outputs it holds. A measured value (a train step's
output, an evaluator's metric) under one of these names would overwrite
the field and lose the record, so :func:`named` refuses it where the values
come in, with the fix. So it does two names that read alike once written
(``1`` and ``"1"``: JSON's keys are strings), which would lose one value.
"""

import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from pimm_fn.core.frozen import FrozenMap, freeze, repr_unless_none

__all__ = [
    "FIELDS",
    "POSITION",
    "RESERVED",
    "fits",
    "named",
    "row",
    "unrow",
    "Scope",
    "Effect",
    "SaveCheckpoint",
    "WriteBest",
    "Evaluate",
    "Log",
    "LoadWeights",
    "Stop",
    "StepScheduler",
    "UpdateEma",
    "Call",
]


FIELDS = ("step", "kind")  # every record's own fields, in the order a line begins with them


POSITION = ("epoch", "of_epochs", "iter", "of", "over")  # where a training record was taken, whose outputs


RESERVED = FIELDS + POSITION  # what a measured value may not be named

_V = TypeVar("_V")


def named(
    values: Mapping[Any, _V], who: str, prefix: str = "my", reserved: Collection[str] = RESERVED
) -> dict[str, _V]:
    """``values`` under ``str`` names; a ``ValueError`` naming ``who`` for a reserved name or two alike.

    ``who`` says whose values they are (``"evaluator 'val' returned metric"``);
    the error names the value and the fix: rename it (``'<prefix>_step'``).

    >>> named({"acc": 0.9, 1: 0.5}, "evaluator 'val' returned metric", "val")
    {'acc': 0.9, '1': 0.5}
    >>> named({"step": 3.0}, "evaluator 'val' returned metric", "val")
    Traceback (most recent call last):
    ...
    ValueError: evaluator 'val' returned metric 'step', but log records (log.jsonl, run.history) carry a field ...
    """
    if fits(values, reserved):  # the common case, every logged step: no message built
        return {key if key.__class__ is str else str(key): value for key, value in values.items()}
    found: dict[str, object] = {}
    for key in values:
        name = str(key)
        if name in reserved:
            raise ValueError(
                f"{who} {key!r}, but log records (log.jsonl, run.history) carry a field of that name "
                f"({', '.join(reserved)}), which it would overwrite: rename it (e.g. '{prefix}_{name}')"
            )
        if name in found:
            raise ValueError(
                f"{who} {found[name]!r} and {key!r}, which are one name once written (log.jsonl's names are "
                f"strings): one value would be lost; give each a distinct string name"
            )
        found[name] = key
    raise AssertionError("fits() and named() disagree")  # unreachable: fits() said a name was wrong


def fits(values: Mapping[Any, object], reserved: Collection[str] = RESERVED) -> bool:
    """No name of ``values`` is ``reserved`` and no two read alike once written: what :func:`named` checks.

    >>> fits({"acc": 0.9, 1: 0.5}), fits({"step": 1}), fits({1: 0.5, "1": 0.5}), fits({"step": 1}, reserved=())
    (True, False, False, True)
    """
    keys = values.keys()
    if all(key.__class__ is str for key in keys):  # the common case: names as they are written
        return keys.isdisjoint(reserved)
    names = set(map(str, keys))
    return len(names) == len(keys) and names.isdisjoint(reserved)


def row(step: int, kind: str, values: Mapping[str, object]) -> dict[str, object]:
    """The line a record is written as: ``FIELDS`` first, then its values.

    >>> row(4, "eval/val", {"acc": 0.9})
    {'step': 4, 'kind': 'eval/val', 'acc': 0.9}
    """
    return {"step": step, "kind": kind, **values}


def unrow(line: Mapping[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """``(step, kind, values)`` of a line read back; a ``KeyError`` when it lacks a field.

    >>> unrow({"step": 4, "kind": "eval/val", "acc": 0.9})
    (4, 'eval/val', {'acc': 0.9})
    """
    values = dict(line)
    return values.pop("step"), values.pop("kind"), values


class Scope(enum.Enum):
    COLLECTIVE = "collective"
    MAIN = "main"
    LOCAL = "local"

    def __repr__(self) -> str:
        return f"Scope.{self.name}"


@attrs.frozen
class Effect:
    """Base class; a subclass sets ``scope``."""

    # A subclass sets its scope as a class variable, but Call's is a field (a scope per call), which a ClassVar
    # declared here would forbid: the type checker reads it as a property of an effect; at run time the
    # base's is a class variable, as every other effect's is.
    if TYPE_CHECKING:

        @property
        def scope(self) -> Scope:
            return Scope.LOCAL

    else:
        scope = Scope.LOCAL

    @property
    def runs_first(self) -> bool:
        """True for a record of the event (a ``Log``): it runs before the event's other effects."""
        return False

    @property
    def runs_last(self) -> bool:
        """True for an effect that closes its event: it waits until the event's other effects ran."""
        return False

    @property
    def runs_after_saves(self) -> bool:
        """True for an effect that must find its event's checkpoint written: it runs after everything else."""
        return False


@attrs.frozen(repr=False)
class SaveCheckpoint(Effect):
    """Save the full training state as of ``step``; collective.

    ``snapshot`` also keeps an ``iter_<step>`` copy; ``final`` marks the save
    after training; ``async_save`` lets the write overlap training (the
    interpreter still waits for the in-memory copy before parameters change).
    ``deferred`` marks a save that fell on an epoch's last step and waits for
    its end. Every save runs after the other effects of its event
    (``runs_last``), wherever its hook stands: the checkpoint of a step holds
    all that step did (its evaluation and new best, a scheduler or EMA step,
    a stop), so a run resumed from it goes on as the saving run did.
    ``saved_for`` says why a save no hook asked for was made (``"SIGTERM"``,
    ``"max_time"``: the runtime's preemption save,
    ``pimm_fn.runtime.engine.preemption``); its marker records it.
    """

    scope: ClassVar[Scope] = Scope.COLLECTIVE
    step: int
    snapshot: bool = False
    final: bool = False
    async_save: bool = False
    deferred: bool = False
    saved_for: str | None = None

    __repr__ = repr_unless_none("saved_for")

    @property
    def runs_last(self) -> bool:
        return True


@attrs.frozen(repr=False)
class WriteBest(Effect):
    """Write the current weights as ``model_best`` (``metric`` improved).

    ``weights`` names the average (``pimm_fn.ema``) whose weights were
    evaluated, so the file holds what earned the metric; ``None``: the model's own.
    It runs in its hook's place; the evaluation's log line (``log_every``
    reacts to the same ``MetricsPublished``) is a record, which runs first,
    so it comes before the "new best" line wherever the two hooks stand.
    """

    scope: ClassVar[Scope] = Scope.MAIN
    metric: str
    value: float
    step: int
    weights: str | None = None

    __repr__ = repr_unless_none("weights")


@attrs.frozen(repr=False)
class Evaluate(Effect):
    """Run the evaluator registered as ``evaluator`` on every rank.

    With ``broadcast`` the main rank's result is sent to every rank, so the
    published metrics are rank-consistent; without it each rank keeps its own.
    ``weights`` names an average (``pimm_fn.ema``) swapped into the model for
    the evaluation; ``None``: the model's own weights.
    """

    scope: ClassVar[Scope] = Scope.COLLECTIVE
    evaluator: str
    step: int
    broadcast: bool = True
    weights: str | None = None

    __repr__ = repr_unless_none("weights")


def _keeps_its_fields(log: "Log", attribute: "attrs.Attribute[Any]", values: FrozenMap) -> None:
    """A value named ``step`` or ``kind`` (or two names alike, ``1`` and ``"1"``) would overwrite one in the line."""
    if not fits(values, FIELDS):
        named(values, f"Log({log.step!r}, {log.kind!r}) holds value", reserved=FIELDS)


@attrs.frozen
class Log(Effect):
    """A record for the console and the run's JSON-lines log; no value under its own ``step`` or ``kind``.

    It runs before the other effects of its event (``runs_first``): it holds
    only what its hook knew when it saw the event, so it reports what has
    happened, ahead of what the event causes (a new best, a stop, a save).
    """

    scope: ClassVar[Scope] = Scope.MAIN
    step: int
    kind: str
    values: FrozenMap = attrs.field(converter=freeze, validator=_keeps_its_fields)

    @property
    def runs_first(self) -> bool:
        return True


@attrs.frozen
class LoadWeights(Effect):
    """Warm-start the model from a weights file before training: the one warm-start request.

    ``dialect`` says how ``path`` is found and ``replacements`` are read:
    ``"pimm_fn"`` (``load_weights``: ``(old_prefix, new_prefix)`` pairs), or
    a plug-in's, carried out by the handlers the plug-in provides (``"pimm"``:
    pimm's ``CheckpointLoader`` keywords, ``pimm_fn.compat.HANDLERS``).
    """

    scope: ClassVar[Scope] = Scope.LOCAL
    path: str
    replacements: tuple[tuple[str, str], ...] = ()
    strict: bool = False
    dialect: str = "pimm_fn"


@attrs.frozen
class Stop(Effect):
    """End training early: the epoch in progress closes and training ends; collective.

    Every executor answers it with ``StopRequested(step, reason)``, which
    records ``reason`` in ``State.stop``; from then on the lifecycle
    (``pimm_fn.core.schedule.next_event``) runs only the closing events,
    ``AfterEpoch`` of the epoch in progress and ``AfterTrain``, so the final
    save and the epoch's logs still happen. Collective because every rank
    must stop at the same step, so the decision may read only
    rank-consistent state (broadcast metrics, progress).
    """

    scope: ClassVar[Scope] = Scope.COLLECTIVE
    step: int
    reason: str = "stop requested"


@attrs.frozen
class StepScheduler(Effect):
    """Step the run's learning-rate scheduler once; each rank steps its own.

    ``scheduler.step()``, or ``scheduler.step(value)`` when ``metric`` names
    the published metric ``value`` comes from (``ReduceLROnPlateau``). A run
    whose hooks declare that they emit it (``emits``) no longer has the
    default train step step the scheduler.
    """

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    metric: str | None = None
    value: float | None = None


@attrs.frozen
class UpdateEma(Effect):
    """Fold the model's weights into the moving average ``name`` (``pimm_fn.ema``); each rank its own copy.

    ``average = decay * average + (1 - decay) * weights`` for the parameters;
    buffers are copied. Every rank holds the same weights, so every rank's
    average is the same.
    """

    scope: ClassVar[Scope] = Scope.LOCAL
    name: str
    step: int
    decay: float


_PLAIN = (type(None), bool, int, float, str)


def _plain(value: object, where: str) -> object:
    """``value`` as a plain value: lists become tuples, mappings ``FrozenMap``s; anything else is refused."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        return _plain_items(value, where)
    if isinstance(value, Mapping):
        return _plain_map(value, where)
    raise TypeError(
        f"Call: {where} is a {type(value).__name__} ({value!r:.80}), not a plain value: pass numbers, strings, "
        f"None, and tuples or dicts of them (an effect compares, pickles and digests alike on every rank); "
        f"let the function read what it needs from the run (ctx.model, state.metrics) itself"
    )


def _plain_items(values: Iterable[object], where: str) -> tuple[object, ...]:
    return tuple(_plain(v, f"{where}[{i}]") for i, v in enumerate(values))


def _plain_map(values: Mapping[Any, object], where: str) -> FrozenMap:
    return FrozenMap({_plain(k, f"{where} key"): _plain(v, f"{where}[{k!r}]") for k, v in values.items()})


def _plain_args(args: Iterable[object]) -> tuple[object, ...]:
    return _plain_items(args, "args")


def _plain_kwargs(kwargs: Mapping[Any, object] | None) -> FrozenMap:
    kwargs = _plain_map(freeze(kwargs), "kwargs")
    for name in kwargs:
        if not (isinstance(name, str) and name.isidentifier()):
            raise TypeError(f"Call: kwargs names must be identifiers, as a call's keywords are (got {name!r})")
    return kwargs


def _function_name(call: "Call", attribute: "attrs.Attribute[Any]", name: object) -> None:
    """``"module:qualname"``: a module path, then a path of names inside it, neither made by a call."""
    module, colon, qualname = name.partition(":") if isinstance(name, str) else ("", "", "")
    parts = [*module.split("."), *qualname.split(".")]
    if not colon or not all(part.isidentifier() for part in parts):
        raise ValueError(
            f"Call: 'function' must name a function defined at the top level of a module (or a class in it) as "
            f"'module:qualname', e.g. 'mylib.viz:show_samples' (got {name!r}); Call.of(fn, step) writes it for you"
        )


def _a_bool(call: "Call", attribute: "attrs.Attribute[Any]", value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"Call: '{attribute.name}' must be a bool (got {value!r:.80})")


def _a_scope(call: "Call", attribute: "attrs.Attribute[Any]", scope: object) -> None:
    if not isinstance(scope, Scope):
        raise TypeError(f"Call: 'scope' must be Scope.MAIN, Scope.LOCAL or Scope.COLLECTIVE (got {scope!r})")


@attrs.frozen(repr=False)
class Call(Effect):
    """Call a function of yours, named, with plain arguments: a side effect without an effect class of its own.

    The handler imports ``function`` (``"module:qualname"``) and calls it as
    ``fn(state, ctx, *args, **kwargs)``, as Ignite calls an event handler with
    its engine: ``state`` is the run's ``State``, ``ctx`` the handler's context
    (``docs/hooks.md`` lists what it holds). What it returns is not used, so
    ``plan`` stays the run's. A name that does not resolve to a callable is a
    ``LookupError`` naming it. The function is named, never carried, and
    ``args``/``kwargs`` are plain values (lists arrive as tuples, dicts as
    read-only mappings), so the effect compares, pickles and digests alike on
    every rank. ``scope``: ``Scope.MAIN`` (rank 0, the default: a console
    line, a tracker's image), ``Scope.LOCAL`` (every rank, each its own), or
    ``Scope.COLLECTIVE`` (every rank, in the same order, compared by the
    agreement guard: a function that communicates across ranks).
    ``after_saves``: call it after every other effect of its event, the
    checkpoint saves included, so it finds that step's checkpoint written
    (a save runs after the event's other effects, wherever its hook stands).

    >>> Call("mylib.viz:show", 4, ("hello",))
    Call('mylib.viz:show', 4, args=('hello',))
    >>> Call("show", 4)
    Traceback (most recent call last):
    ...
    ValueError: Call: 'function' must name a function defined at the top level of a module (or a class in it) as ...
    """

    function: str = attrs.field(validator=_function_name)
    step: int
    args: tuple[object, ...] = attrs.field(default=(), converter=_plain_args)
    kwargs: FrozenMap = attrs.field(factory=FrozenMap, converter=_plain_kwargs)
    scope: Scope = attrs.field(default=Scope.MAIN, validator=_a_scope)
    after_saves: bool = attrs.field(default=False, validator=_a_bool)

    @property
    def runs_after_saves(self) -> bool:
        return self.after_saves

    @classmethod
    def of(
        cls,
        fn: Callable[..., object],
        step: int,
        *,
        args: Iterable[object] = (),
        kwargs: Mapping[str, object] | None = None,
        scope: Scope = Scope.MAIN,
        after_saves: bool = False,
    ) -> "Call":
        """A ``Call`` of ``fn``, named by its module and qualified name; see the class.

        Raises:
            ValueError: ``fn`` has no name another process can find: a
                lambda, a function defined inside another, a bound method.

        >>> import math
        >>> Call.of(math.hypot, 7, args=(3, 4), scope=Scope.LOCAL)
        Call('math:hypot', 7, args=(3, 4), scope=Scope.LOCAL)
        """
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        bound = getattr(fn, "__self__", None)
        if (
            not (isinstance(module, str) and isinstance(qualname, str))
            or "<" in qualname
            or (bound is not None and type(bound).__name__ != "module")
        ):
            raise ValueError(
                f"Call.of: {fn!r:.80} has no name another process can find it by (a lambda, a function defined "
                f"inside another, a bound method or a callable object): define a function at the top level of a "
                f"module and pass what varies in args= or kwargs="
            )
        return cls(f"{module}:{qualname}", step, args, kwargs or {}, scope, after_saves)

    def __repr__(self) -> str:
        extra = (f", args={self.args!r}" if self.args else "") + (f", kwargs={self.kwargs!r}" if self.kwargs else "")
        extra += f", scope={self.scope!r}" if self.scope is not Scope.MAIN else ""
        extra += ", after_saves=True" if self.after_saves else ""
        return f"Call({self.function!r}, {self.step!r}{extra})"
