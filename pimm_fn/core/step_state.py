"""The state a step's hooks see: ``StepState``, a ``State`` built only when something needs one.

On every step a hook is called for, the fold hands the hooks of its
``BeforeStep`` and ``AfterStep`` a ``StepState`` rather than a ``State``. It
answers everything a ``State`` does (the same attributes, ``with_slot``,
``evolve``, equality, ``repr``), but holds only the step's own parts (the
steps and samples trained since the last ``State`` built, the position, the
slots and the running slot) over that ``State``, which holds the rest (rank,
world size, metrics, best values, config, stop). So a step whose hooks only
read it, or change their slots, builds no ``State`` at all (one is about a
dozen field stores and validators), and no ``Progress`` unless a hook reads
``progress``; the loop builds a ``State`` when the state is read
(``Loop.state``), saved, handed to an effect, or folded for any other event.

It is read-only, as a ``State`` is: it changes only into another value
(``with_slot``, ``stepped``; ``evolve`` gives a ``State``). ``attrs.evolve`` does
not take it: ``state.evolve(...)`` is the spelling that takes both.
"""

from typing import Any

from pimm_fn.core.state import Progress, State

__all__ = ["StepState", "built", "stepping", "step_facts", "global_step_of", "unevolvable"]


class StepState:
    """A ``State`` of a step, its run-wide parts left in ``base``; see the module.

    Its progress is counted (the steps and samples since ``base``) and built
    on first read: a step whose hooks never read ``progress`` builds no
    ``Progress`` either. The schedule reads the few facts it needs without it
    (``step_facts``).

    >>> base = State(Progress(4, 1), rank=1, world_size=2, position="BeforeEpoch")
    >>> s = stepping(base).stepped(1, 8).with_slots((3,))
    >>> s.progress.global_step, s.rank, s.position, s.slots
    (1, 1, 'AfterStep', (3,))
    >>> s == base.evolve(progress=base.progress.advanced(1, 8), position="AfterStep", slots=(3,))
    True
    """

    # Private slots behind read-only properties: a plain ``__init__`` (a third of a frozen class's), and no setter.
    # ``_progress`` is the progress once built (the base's, ``_steps`` steps and ``_samples`` samples on), else None.
    __slots__ = ("_base", "_steps", "_samples", "_position", "_slots", "_slot", "_progress")

    def __init__(
        self,
        base: State,
        steps: int,
        samples: int,
        position: str | None,
        slots: tuple[Any, ...],
        slot: Any,
        progress: Progress | None = None,
    ) -> None:
        self._base, self._steps, self._samples, self._progress = base, steps, samples, progress
        self._position, self._slots, self._slot = position, slots, slot

    # -- the step's own parts ---------------------------------------------------------------------
    @property
    def base(self) -> State:
        """The last ``State`` built: where the run-wide parts are read."""
        return self._base

    @property
    def progress(self) -> Progress:
        """The base's progress ``steps`` steps on, built on first read (and kept: the value does not change)."""
        progress = self._progress
        if progress is None:
            progress = self._base.progress
            if self._steps or self._samples:
                progress = progress.advanced(self._steps, self._samples)
            self._progress = progress
        return progress

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
        return StepState(self._base, self._steps, self._samples, self._position, self._slots, slot, self._progress)

    def with_slots(self, slots: tuple[Any, ...]) -> "StepState":
        """This state with the hooks' ``slots`` replaced and no running slot: the fold's last copy."""
        return StepState(self._base, self._steps, self._samples, self._position, slots, None, self._progress)

    def at(self, position: str) -> "StepState":
        """This state at ``position`` (``BeforeStep``), its progress as it is."""
        return StepState(self._base, self._steps, self._samples, position, self._slots, self._slot, self._progress)

    def stepped(self, step: int, batch_size: int) -> "StepState":
        """This state after ``AfterStep(step)`` of ``batch_size`` samples: one step on, no running slot.

        Raises:
            ValueError: ``step`` is not the next step.
        """
        global_step = self._base.progress.global_step + self._steps
        if step != global_step + 1:
            raise ValueError(f"AfterStep(step={step}) out of order: global_step is {global_step}")
        return StepState(self._base, self._steps + 1, self._samples + batch_size, "AfterStep", self._slots, None)

    def moved(self, progress: Progress, position: str | None, slots: tuple[Any, ...], slot: Any) -> "StepState":
        """This state with its per-step parts replaced (``State.moved``): over a base built with that progress."""
        return StepState(self._base.moved(progress, position, slots, slot), 0, 0, position, slots, slot)

    def evolve(self, **changes: Any) -> State:
        """The ``State`` this one stands for, with ``changes`` (``State.evolve``)."""
        return self.built().evolve(**changes)

    def built(self) -> State:
        """The ``State`` this one stands for."""
        return self._base.moved(self.progress, self._position, self._slots, self._slot)

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
    return StepState(state, 0, 0, state.position, state.slots, state.slot)  # type: ignore[arg-type]


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


def step_facts(state: "State | StepState") -> tuple[int, bool, int]:
    """``(global_step, at_epoch_end, epoch)`` of ``state``'s progress, read without building a ``StepState``'s.

    What the schedule asks on every step (``pimm_fn.core.schedule.next_event``).
    """
    if state.__class__ is StepState:
        p, steps = state._base.progress, state._steps
        return p.global_step + steps, p.at_epoch_end_after(steps), p.epoch
    p = state.progress
    return p.global_step, p.at_epoch_end, p.epoch


def global_step_of(state: "State | StepState") -> int:
    """``state.progress.global_step``, read without building a ``StepState``'s progress."""
    if state.__class__ is StepState:
        return state._base.progress.global_step + state._steps
    return state.progress.global_step
