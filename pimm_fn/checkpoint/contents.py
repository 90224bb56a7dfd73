"""What a trainer checkpoint holds, as one value, checked as it is read, and the one code that writes and reads it.

A checkpoint is the model's weights file beside the trainer state this
module describes. The trainer state has three parts, by who holds them:

* **replicated**, identical on every rank and written once: the optimizer,
  scheduler and scaler state dicts (a run of several named optimizers keeps
  each one's under its name, in ``optimizers``), the extra state
  (``loop(training=Training(extra_state=))``, the ``ema`` averages: each object's
  ``state_dict()`` by name, rank 0's written, every rank's must agree in
  structure), the *agreed* ``State`` (the main rank's), which a resume
  on another world size starts from, and the class of each optimizer and
  of the scheduler (``classes``, qualified names: a resume into another
  class is refused before anything is loaded);
* **per-rank**, each rank's own: its ``State`` (with its rank-local metrics
  and the per-rank sums hooks keep in their slots), its RNG states and its
  data cursor;
* **sharded**, each rank's shards of a model and optimizer no rank holds
  whole (FSDP2): ``sharded.state(model, optimizer)``, written by DCP beside
  the other parts and read back into the model and optimizer as they are
  sharded then (``sharded.load_into``), on any world size. The replicated
  part then keeps only what is not a tensor of the optimizer state (its
  param groups), and says so (``Replicated.sharded``). ``None`` for a
  replicated model: its weights go in the weights file, its optimizer in
  the replicated part.

Each ``State`` is kept as a ``SavedState``: the state without its slots, and
the slots by hook identity (``pimm_fn.core.slots``), never by position, so a
resume may reorder, add or remove hooks.

``to_parts`` turns a ``TrainerContents`` into the ``trainer`` and ``local``
dicts ``save_checkpoint`` writes; ``from_parts`` reads them back, including
those written before slots were keyed (layout 1), whose slots come back by
position.

>>> from pimm_fn.core.state import Progress, State
>>> from pimm_fn.hooks import SaveEveryState, log_every, save_every
>>> state = State(Progress(10, 2), slots=(SaveEveryState(4),))
>>> own = saved_state(state, [save_every(4)])
>>> held = TrainerContents(Replicated({"state": {}}, None, None, own), PerRank(own, {}, {}))
>>> back = from_parts(*to_parts(held))
>>> back.local.state.restored([log_every(5), save_every(4)])[0].slots
(LogState(sums=FrozenMap({}), count=0, counts=FrozenMap({})), SaveEveryState(last_saved=4, deferred=None))

What each part of a trainer checkpoint must hold, checked as it is read: a checkpoint is untrusted input.

The validators of ``pimm_fn.checkpoint.contents``' values: a state dict
where pimm_fn writes one, the recorded optimizer and scheduler classes
matching the states held, shards only where the replicated part says the
model is sharded. Each refusal says the checkpoint was not written by
pimm_fn, or was altered.
"""

from collections.abc import Sequence
from typing import Any, TypeGuard

import attrs

from pimm_fn.core import codec, slots
from pimm_fn.core.state import State

__all__ = [
    "holding",
    "recorded_classes",
    "shards_given",
    "LAYOUT",
    "SavedState",
    "Replicated",
    "PerRank",
    "TrainerContents",
    "saved_state",
    "to_parts",
    "from_parts",
]


def _names(value: object) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def recorded_classes(instance, attribute, value) -> None:
    """``Replicated.classes`` holds qualified class names, one for each state held: a checkpoint is untrusted input."""
    if value is None:
        return
    plain = {k: v for k, v in value.items() if k != "optimizers"} if isinstance(value, dict) else None
    if not (_names(plain) and set(plain) <= {"optimizer", "scheduler"} and _names(value.get("optimizers", {}))):
        raise ValueError(
            f"the checkpoint's record of its optimizer and scheduler classes is malformed (got {value!r:.120}); "
            f"expected {{'optimizer': name}} or {{'optimizers': {{name: name}}}}, and 'scheduler': name, qualified names"
        )
    recorded = ("optimizer" in value, "scheduler" in value, sorted(value.get("optimizers", {})))
    held = (instance.optimizer is not None, instance.scheduler is not None, sorted(instance.optimizers or {}))
    if recorded != held:  # the writer records a class for each state it writes, and only then
        raise ValueError(
            f"the checkpoint records the classes of {_objects(*recorded)}, but holds the states of "
            f"{_objects(*held)}: it was not written by pimm_fn, or was altered"
        )


def _objects(optimizer: bool, scheduler: bool, named: list) -> str:
    optimizers = f"optimizers {named}" if named else ("an optimizer" if optimizer else "no optimizer")
    return f"{optimizers} and {'a scheduler' if scheduler else 'no scheduler'}"


def holding(kind: type, *, optional: bool = True):
    """A validator: a part read from a checkpoint holds a ``kind`` (or ``None``); a checkpoint is untrusted input."""

    def check(instance, attribute, value) -> None:
        if isinstance(value, kind) or (optional and value is None):
            return
        raise ValueError(
            f"the checkpoint's {attribute.name!r} is a {type(value).__name__}, where pimm_fn writes a "
            f"{kind.__name__}{' or None' if optional else ''}: it was not written by pimm_fn, or was altered"
        )

    return check


def shards_given(instance, attribute, value):
    if value is not None and not isinstance(value, dict):
        raise TypeError(
            "TrainerContents: 'sharded' holds a sharded model's and optimizer's shards as "
            f"pimm_fn.checkpoint.formats.sharded.state gives them (a dict), or None (got {type(value).__name__})"
        )
    if value is not None and not instance.replicated.sharded:
        raise ValueError("TrainerContents: shards given, but the replicated part does not say so (Replicated.sharded)")


LAYOUT = 2  # 1: the State as one JSON, slots by position; 2: slots by hook identity


@attrs.frozen
class SavedState:
    """A ``State`` as a checkpoint keeps it: without its slots, and the slots apart.

    Attributes:
        state: the state, with ``slots=()``.
        slots: a ``pimm_fn.core.slots.Keyed`` value; a tuple (by position)
            for a checkpoint written before slots were keyed, or by a run
            whose hooks the save did not know.
    """

    state: State
    slots: Any

    def restored(self, hooks: Sequence[Any]) -> tuple[State, tuple[str, ...]]:
        """``(state, dropped)``: the state with the slots of ``hooks``, and the saved keys no hook claimed.

        Raises:
            pimm_fn.core.slots.SlotMismatch: a slot cannot be handed back.
        """
        if isinstance(self.slots, slots.Keyed):
            found, dropped = slots.unkeyed(hooks, self.slots)
        else:
            found, dropped = slots.by_position(hooks, self.slots), ()
        return attrs.evolve(self.state, slots=found), dropped


def saved_state(state: State, hooks: Sequence[Any] | None = None) -> SavedState:
    """``state`` as a checkpoint keeps it: its slots keyed by the identities of ``hooks``.

    ``hooks`` are the run's top-level hooks, one per slot. Without them
    (``None``) the slots are kept by position, and a resume needs the same
    hook list.
    """
    found = state.slots if hooks is None else slots.keyed(hooks, state.slots)
    return SavedState(attrs.evolve(state, slots=(), slot=None), found)


@attrs.frozen(eq=False)
class Replicated:
    """The part identical on every rank, written once.

    ``state`` is ``None`` only in a template whose tensors' shapes are read
    ahead of a save (the staging prewarm): states hold no tensors.
    """

    optimizer: dict | None = attrs.field(validator=holding(dict))  # None when the run has several named optimizers
    scheduler: dict | None = attrs.field(validator=holding(dict))
    scaler: dict | None = attrs.field(validator=holding(dict))
    state: SavedState | None
    sharded: bool = attrs.field(default=False, validator=holding(bool, optional=False))  # the model is in the shards
    optimizers: dict | None = attrs.field(
        default=None, validator=holding(dict)
    )  # name -> state dict, loop(optimizer={name: opt})
    extra: dict | None = attrs.field(default=None, validator=holding(dict))  # name -> state dict: extra_state=, ema()
    # The classes whose states these are, by qualified name: {"optimizer": name} or {"optimizers": {name: name}},
    # and "scheduler" when there is one. None in a checkpoint written before they were recorded.
    classes: dict | None = attrs.field(default=None, validator=recorded_classes)


@attrs.frozen(eq=False)
class PerRank:
    """One rank's own part: its state, RNG states (``runtime.rng``) and data cursor (``Feed.state_dict``)."""

    state: SavedState
    rng: dict = attrs.field(validator=holding(dict, optional=False))
    cursor: Any = attrs.field(validator=holding(dict))


@attrs.frozen(eq=False)
class TrainerContents:
    """Everything a trainer checkpoint holds beside the weights file (see the module docstring).

    ``local`` is ``None`` when read on a rank the checkpoint has no entry
    for (it was written by fewer ranks), and in a template. ``sharded`` is
    what this rank writes of a sharded model; a read leaves it ``None`` (the
    shards load into the model, not into a value).
    """

    replicated: Replicated
    local: PerRank | None
    sharded: dict | None = attrs.field(default=None, validator=shards_given)


# -- writing --------------------------------------------------------------------------------------
def to_parts(contents: TrainerContents) -> tuple[dict, dict]:
    """``(trainer, local)``: the dicts ``save_checkpoint`` writes, plain values and tensors only.

    The shards, if any, are not in them: ``save_checkpoint(sharded=contents.sharded)``.

    Raises:
        TypeError: a slot or state value the codec cannot store, naming it.
    """
    r = contents.replicated
    # Tensors first, in a fixed order: a prewarm's template numbers them as the save does.
    trainer: dict[str, Any] = {"optimizer": r.optimizer, "scheduler": r.scheduler, "scaler": r.scaler}
    if r.optimizers is not None:
        trainer["optimizers"] = r.optimizers
    if r.extra:
        trainer["extra"] = r.extra
    if r.classes:
        trainer["classes"] = r.classes
    trainer.update(_state_part(r.state))
    trainer["layout"] = LAYOUT
    if r.sharded:
        trainer["sharded"] = True
    local = contents.local
    if local is None:
        return trainer, {}
    return trainer, {**_state_part(local.state), "rng": local.rng, "cursor": local.cursor}


def _state_part(saved: SavedState | None) -> dict:
    if saved is None:
        return {"state": "", "slots": ""}
    if isinstance(saved.slots, slots.Keyed):
        return {"state": codec.dumps(saved.state), "slots": slots.dumps(saved.slots)}
    return {"state": codec.dumps(saved.state), "positional_slots": codec.dumps(saved.slots)}


# -- reading --------------------------------------------------------------------------------------
def from_parts(trainer: dict, local: dict | None) -> TrainerContents:
    """The contents ``to_parts`` wrote, from a loaded checkpoint's ``trainer`` and ``local``.

    Raises:
        ValueError: the parts were not written by pimm_fn, or by a newer
            layout; or a state (not a slot) does not decode.
    """
    layout = trainer.get("layout", 1)
    if layout not in (1, LAYOUT) or "state" not in trainer or "optimizer" not in trainer:
        raise ValueError(
            f"the checkpoint's trainer state has layout {layout!r} and entries {sorted(trainer)[:8]}; this "
            f"version of pimm_fn reads layouts 1 to {LAYOUT}: resume it with the version that wrote it"
        )
    replicated = Replicated(
        trainer["optimizer"],
        trainer.get("scheduler"),
        trainer.get("scaler"),
        _read_state(trainer, layout),
        trainer.get("sharded", False),
        trainer.get("optimizers"),
        trainer.get("extra"),
        trainer.get("classes"),
    )
    if local is None:
        return TrainerContents(replicated, None)
    if not isinstance(local.get("cursor"), dict):  # every run saves its data cursor; only a template has none
        raise ValueError(
            f"the checkpoint's per-rank 'cursor' is a {type(local.get('cursor')).__name__}, where "
            f"pimm_fn writes a dict: it was not written by pimm_fn, or was altered"
        )
    rng: Any = local.get("rng")  # as the checkpoint has it: PerRank refuses what is not a dict
    return TrainerContents(replicated, PerRank(_read_state(local, layout), rng, local["cursor"]))


def _read_state(part: dict, layout: int) -> SavedState:
    try:
        return _decoded_state(part, layout)
    except (KeyError, TypeError, AttributeError) as exc:  # a part altered or not pimm_fn's: no field, another type
        raise ValueError(
            f"the checkpoint's saved state does not decode ({type(exc).__name__}: {str(exc)[:120]}): it was not "
            f"written by pimm_fn, or was altered"
        ) from None


def _decoded_state(part: dict, layout: int) -> SavedState:
    state = codec.loads(part["state"])
    if layout == 1:  # the whole State as one JSON, its slots by position
        return SavedState(attrs.evolve(state, slots=()), state.slots)
    if "positional_slots" in part:  # saved by a run whose hooks the save did not know
        return SavedState(state, codec.loads(part["positional_slots"]))
    return SavedState(state, slots.loads(part["slots"]))
