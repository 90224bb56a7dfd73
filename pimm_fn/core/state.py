"""The training state every hook sees: progress, metrics, best values, slots.

``State`` is a frozen value. Its parts are either *rank-consistent* (identical
on every rank: ``progress``, ``position``, ``config``, ``world_size`` and the
``best`` values of broadcast metrics) or *rank-local* (``rank``, metrics that
only one rank computed, per-rank step outputs a hook accumulates in its slot).
A collective decision may only read rank-consistent parts.
"""

from typing import Any

import attrs

from pimm_fn import notebook
from pimm_fn.core import summary
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.frozen import FrozenMap, freeze

__all__ = ["Progress", "State"]


# The validators run on every copy the fold makes: an exact ``int`` (the common case) passes in one
# test; anything else (a bool, another subclass) takes the full check.
def _non_negative(instance: Any, attribute: Any, value: Any) -> None:
    if value.__class__ is not int or value < 0:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"'{attribute.name}' must be an int >= 0 (got {value!r})")


def _positive(instance: Any, attribute: Any, value: Any) -> None:
    if value.__class__ is not int or value < 1:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"'{attribute.name}' must be an int >= 1 (got {value!r})")


def _optional_positive(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None:
        _positive(instance, attribute, value)


def _progress(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Progress):
        raise TypeError(f"'{attribute.name}' must be a Progress (got {value!r:.80})")


def _rank(instance: Any, attribute: Any, value: Any) -> None:
    _non_negative(instance, attribute, value)
    if isinstance(instance.world_size, int) and 0 < instance.world_size <= value:
        raise ValueError(f"'{attribute.name}' must be < world_size={instance.world_size} (got {value!r})")


def _tuple(instance: Any, attribute: Any, value: Any) -> None:
    if value.__class__ is not tuple and not isinstance(value, tuple):
        raise TypeError(f"'{attribute.name}' must be a tuple (got {value!r:.80})")


# The lifecycle event names (see ``events.LIFECYCLE``) a position may hold.
_POSITIONS = ("ModifyConfig", "BeforeTrain", "BeforeEpoch", "BeforeStep", "AfterStep", "AfterEpoch", "AfterTrain")
_POSITION_SET = frozenset(_POSITIONS)


def _position(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not (value.__class__ is str and value in _POSITION_SET) and value not in _POSITIONS:
        raise ValueError(f"'{attribute.name}' must be None or one of {list(_POSITIONS)} (got {value!r})")


def _optional_str(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"'{attribute.name}' must be None or a str (got {value!r:.80})")


@register_slot_type
@attrs.frozen
class Progress:
    """Where training stands; identical on every rank.

    ``global_step`` counts completed optimizer steps (the first step is 1),
    ``iter_in_epoch`` the steps completed in the current ``epoch`` (0-based),
    ``samples_seen`` the samples this rank trained on (every rank's alike:
    a state's summary shows the run's, times the world size).

    The budget is ``max_epochs`` epochs, or, with ``step_limit`` (from
    ``loop(max_steps=N)``), ``N`` global steps: the epoch in progress at
    step ``N`` ends there (``at_epoch_end``), as at a stop, and training
    ends. ``max_epochs`` then only says how many epochs reach step ``N``
    (``pimm_fn.core.budget`` keeps it so). Checkpoints written before
    ``step_limit`` existed decode with ``None``.

    >>> Progress(iters_per_epoch=10, max_epochs=3).max_steps
    30
    >>> Progress(iters_per_epoch=10, max_epochs=3, step_limit=25).max_steps
    25
    """

    iters_per_epoch: int = attrs.field(validator=_positive)
    max_epochs: int = attrs.field(validator=_non_negative)
    epoch: int = attrs.field(default=0, validator=_non_negative)
    iter_in_epoch: int = attrs.field(default=0, validator=_non_negative)
    global_step: int = attrs.field(default=0, validator=_non_negative)
    samples_seen: int = attrs.field(default=0, validator=_non_negative)
    step_limit: int | None = attrs.field(default=None, validator=_optional_positive)

    # repr stays every field (attrs'); these are for reading (pimm_fn.core.summary).
    def __str__(self) -> str:
        return summary.progress_line(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        notebook.pretty(printer, str(self), cycle)

    def _repr_html_(self) -> str:
        return notebook.render_html("Progress", [("progress", str(self))], self)

    def advanced(self, steps: int, samples: int) -> "Progress":
        """This progress ``steps`` steps on in its epoch, ``samples`` more samples seen.

        The copy made on each step a hook is called on: ``__init__``, its
        validators included, with every field named (``attrs.evolve`` walks
        the fields generically, at twice the cost).

        >>> Progress(10, 2, iter_in_epoch=3, global_step=3).advanced(2, 64).global_step
        5
        """
        return type(self)(
            iters_per_epoch=self.iters_per_epoch,
            max_epochs=self.max_epochs,
            epoch=self.epoch,
            iter_in_epoch=self.iter_in_epoch + steps,
            global_step=self.global_step + steps,
            samples_seen=self.samples_seen + samples,
            step_limit=self.step_limit,
        )

    @property
    def max_steps(self) -> int:
        """The global step training ends at, when the epochs keep their length."""
        return self.step_limit if self.step_limit is not None else self.iters_per_epoch * self.max_epochs

    @property
    def steps_left(self) -> int:
        """Steps still to train: the rest of this epoch and the later ones.

        Not ``max_steps - global_step``: a resume that changed the epoch's
        length (another world size or batch size) keeps ``global_step``.

        >>> Progress(iters_per_epoch=10, max_epochs=3, epoch=1, iter_in_epoch=4, global_step=9).steps_left
        16
        """
        if self.step_limit is not None:
            return max(self.step_limit - self.global_step, 0)
        if self.completed_epochs >= self.max_epochs:
            return 0
        return self.iters_per_epoch - self.iter_in_epoch + (self.max_epochs - self.epoch - 1) * self.iters_per_epoch

    @property
    def at_epoch_end(self) -> bool:
        """True once the last step of the current epoch has run: its length, or the step budget, reached."""
        return self.at_epoch_end_after(0)

    def at_epoch_end_after(self, steps: int) -> bool:
        """``at_epoch_end`` of this progress ``steps`` steps on in its epoch, without building that progress.

        >>> Progress(iters_per_epoch=10, max_epochs=3, iter_in_epoch=8, global_step=8).at_epoch_end_after(2)
        True
        """
        return self.iter_in_epoch + steps == self.iters_per_epoch or self.global_step + steps == self.step_limit

    @property
    def epoch_end_step(self) -> int:
        """The global step the current epoch ends at (its last step, or the step budget)."""
        end = self.global_step + self.iters_per_epoch - self.iter_in_epoch
        return end if self.step_limit is None else min(end, max(self.step_limit, self.global_step))

    @property
    def completed_epochs(self) -> int:
        """Epochs whose every step has run."""
        return self.epoch + (1 if self.at_epoch_end else 0)


@register_slot_type
@attrs.frozen
class State:
    """Everything the hooks know, threaded through the fold as a value.

    Attributes:
        progress: the rank-consistent position in training.
        rank, world_size: this process's place in the job.
        metrics: the latest published value of each metric.
        best: the best value of each metric tracked by ``best_on``.
        config: run configuration; hooks may change it at ``ModifyConfig``.
        slots: one private value per hook, in hook-list order.
        slot: while a hook runs, its own slot (``slots[i]``); ``None`` outside.
        position: the name of the last lifecycle event dispatched, which is
            where a resumed run continues from.
        stop: ``None`` while training goes on; once a ``Stop`` effect ran,
            its reason (rank-consistent: ``Stop`` is collective). The epoch
            in progress then closes and training ends. Checkpoints written
            before this field existed decode with ``None``.
    """

    progress: Progress = attrs.field(validator=_progress)
    rank: int = attrs.field(default=0, validator=_rank)
    world_size: int = attrs.field(default=1, validator=_positive)
    metrics: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)
    best: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)
    config: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)
    slots: tuple[Any, ...] = attrs.field(default=(), validator=_tuple)
    slot: Any = None
    position: str | None = attrs.field(default=None, validator=_position)
    stop: str | None = attrs.field(default=None, validator=_optional_str)

    # repr stays every field, exact for debugging and for comparing runs, one field a line (the slots
    # one a line); ``str`` and the notebook displays summarise (pimm_fn.core.summary): a cell ending
    # in run.run() shows this.
    def __repr__(self) -> str:
        return summary.fields_repr(self)

    def __str__(self) -> str:
        return summary.render_text("State", summary.state_rows(self))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        notebook.pretty(printer, str(self), cycle)

    def _repr_html_(self) -> str:
        return notebook.render_html("State", summary.state_rows(self), self.progress)

    @property
    def finished(self) -> bool:
        return self.position == "AfterTrain"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def evolve(self, **changes: Any) -> "State":
        """This state with ``changes``: ``attrs.evolve(state, **changes)``, which a step's state does not take.

        A hook writes ``state.evolve(best=...)``: on a step's events it is
        handed a ``StepState`` (``pimm_fn.core.step_state``), which takes
        this spelling too.

        >>> State(Progress(2, 1)).evolve(config={"lr": 0.1}).config["lr"]
        0.1
        """
        return attrs.evolve(self, **changes)

    def with_slot(self, slot: Any) -> "State":
        """This state with the running hook's slot replaced."""
        return self.moved(self.progress, self.position, self.slots, slot)

    def with_slots(self, slots: tuple[Any, ...]) -> "State":
        """This state with the hooks' ``slots`` replaced and no running slot: the fold's last copy."""
        return self.moved(self.progress, self.position, slots, None)

    def moved(self, progress: Progress, position: str | None, slots: tuple[Any, ...], slot: Any) -> "State":
        """This state with its per-step parts replaced: ``progress``, ``position``, ``slots`` and the running ``slot``.

        The fold's copy, made a few times on each step a hook is called on:
        ``__init__``, its validators included, with every field named
        (``attrs.evolve`` walks the fields generically, at twice the cost).
        """
        return type(self)(
            progress=progress,
            rank=self.rank,
            world_size=self.world_size,
            metrics=self.metrics,
            best=self.best,
            config=self.config,
            slots=slots,
            slot=slot,
            position=position,
            stop=self.stop,
        )
