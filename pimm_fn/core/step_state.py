"""The state a step's hooks see: ``StepState``, a ``State`` built only when something needs one.

On every step a hook is called for, the fold hands the hooks of its
``BeforeStep`` and ``AfterStep`` a ``StepState`` rather than a ``State``. It
answers everything a ``State`` does (the same attributes, ``with_slot``,
``evolve``, equality, ``repr``), but holds only the step's own parts (its
progress, position, slots and running slot) over the last ``State`` built, which
holds the rest (rank, world size, metrics, best values, config, stop). So a
step whose hooks only read it, or change their slots, builds no ``State`` at all
(one is about a dozen field stores and validators); the loop builds one when
the state is read (``Loop.state``), saved, or folded for any other event.

It is read-only, as a ``State`` is: it changes only into another value
(``with_slot``, ``moved``; ``evolve`` gives a ``State``). ``attrs.evolve`` does
not take it: ``state.evolve(...)`` is the spelling that takes both.
"""

from typing import Any

from pimm_fn.core.state import Progress, State

__all__ = ["StepState", "built", "stepping", "unevolvable"]


class StepState:
    """A ``State`` of a step, its run-wide parts left in ``base``; see the module.

    >>> base = State(Progress(4, 1), rank=1, world_size=2, position="BeforeEpoch")
    >>> s = stepping(base).moved(base.progress.advanced(1, 8), "AfterStep", (3,), None)
    >>> s.progress.global_step, s.rank, s.position, s.slots
    (1, 1, 'AfterStep', (3,))
    >>> s == base.evolve(progress=base.progress.advanced(1, 8), position="AfterStep", slots=(3,))
    True
    """

    # Private slots behind read-only properties: a plain ``__init__`` (a third of a frozen class's), and no setter.
    __slots__ = ("_base", "_progress", "_position", "_slots", "_slot")

    def __init__(self, base: State, progress: Progress, position: str | None, slots: tuple[Any, ...], slot: Any):
        self._base, self._progress, self._position, self._slots, self._slot = base, progress, position, slots, slot

    # -- the step's own parts ---------------------------------------------------------------------
    @property
    def base(self) -> State:
        """The last ``State`` built: where the run-wide parts are read."""
        return self._base

    @property
    def progress(self) -> Progress:
        return self._progress

    @property
    def position(self) -> str | None:
        return self._position

    @property
    def slots(self) -> tuple[Any, ...]:
        return self._slots

    @property
    def slot(self) -> Any:
        return self._slot

    # -- the run-wide parts, the base's -----------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._base.rank

    @property
    def world_size(self) -> int:
        return self._base.world_size

    @property
    def metrics(self) -> Any:
        return self._base.metrics

    @property
    def best(self) -> Any:
        return self._base.best

    @property
    def config(self) -> Any:
        return self._base.config

    @property
    def stop(self) -> str | None:
        return self._base.stop

    @property
    def finished(self) -> bool:
        return self._position == "AfterTrain"

    @property
    def is_main(self) -> bool:
        return self._base.rank == 0

    # -- changing it: another value ---------------------------------------------------------------
    def with_slot(self, slot: Any) -> "StepState":
        """This state with the running hook's slot replaced."""
        return StepState(self._base, self._progress, self._position, self._slots, slot)

    def moved(self, progress: Progress, position: str | None, slots: tuple[Any, ...], slot: Any) -> "StepState":
        """This state with its per-step parts replaced (``State.moved``), still over the same base."""
        return StepState(self._base, progress, position, slots, slot)

    def evolve(self, **changes: Any) -> State:
        """The ``State`` this one stands for, with ``changes`` (``State.evolve``)."""
        return self.built().evolve(**changes)

    def built(self) -> State:
        """The ``State`` this one stands for."""
        return self._base.moved(self._progress, self._position, self._slots, self._slot)

    # -- as a value: the State it stands for ------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (State, StepState)):
            return self.built() == built(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.built())

    def __repr__(self) -> str:
        return repr(self.built())

    def __str__(self) -> str:
        return str(self.built())

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        self.built()._repr_pretty_(printer, cycle)

    def _repr_html_(self) -> str:
        return self.built()._repr_html_()

    def __reduce__(self) -> tuple[Any, ...]:
        return built, (self.built(),)  # pickled, copied: the State it stands for


def stepping(state: "State | StepState") -> StepState:
    """``state`` as a step's hooks see it: a ``StepState`` over it (itself when it is one)."""
    if state.__class__ is StepState:
        return state
    return StepState(state, state.progress, state.position, state.slots, state.slot)  # type: ignore[arg-type]


def built(state: "State | StepState") -> State:
    """``state`` as a ``State``: itself, or the one a ``StepState`` stands for."""
    if state.__class__ is State:
        return state
    return state.built()  # type: ignore[union-attr]


def unevolvable(hook: Any) -> TypeError:
    """The error for ``hook`` handing a ``StepState`` to ``attrs`` (``attrs.evolve(state, ...)``), with its fix."""
    return TypeError(
        f"hook {hook!r} handed a step's state to attrs (attrs.evolve(state, ...)), which does not take it: a "
        "step's hooks get a StepState. Write state.evolve(...), which takes a StepState and a State alike "
        "(the README's 'Changes to hooks')"
    )
