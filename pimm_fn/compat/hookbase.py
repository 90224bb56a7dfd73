"""pimm's class-based hooks (``HookBase`` subclasses) running inside pimm_fn.

``adapt(hook_obj)`` turns an object with pimm's hook methods into a pimm_fn
hook. A ``HookBase`` carries its adapter itself (``as_hook()``, the hook
protocol's stand-in, ``pimm_fn.core.hook``), so ``pf.loop``, ``plan`` and
``chain`` take one directly; ``build_hooks`` adapts any object with pimm's
methods (a duck-typed hook, or pimm's own ``HookBase``). At each lifecycle
event it sets ``hook_obj.trainer`` to a read-only ``TrainerView`` of the
state, calls the matching method, and restores the previous ``trainer``. A
method returns ``None`` (nothing to do) or a tuple of effects, e.g.
``(SaveCheckpoint(view.global_step),)``.

``adapt`` is for migration, not a pure hook: the object may keep state on
itself, which pimm_fn neither checkpoints nor resets, so ``plan``, the
simulator and resume are exact only when the methods are deterministic
functions of the view. What does not carry over:

* mutating the trainer (``self.trainer.epoch = ...``, ``self.trainer.model``,
  ``self.trainer.optimizer``, ``self.trainer.storage``, writing to
  ``comm_info``): the view is read-only and raises ``AttributeError`` or
  ``TypeError``. Return effects instead, or rewrite the hook as a pure
  function ``(state, event) -> (state, effects)``; a model may take part
  through ``model_hook()``;
* file writes, logging or evaluation inside a method: request them as
  effects (``Log``, ``Evaluate``) so the interpreter performs them;
* ``comm_info["model_output_dict"][k]`` is ``comm_info[k]``: the view's
  ``comm_info`` holds the step's scalar outputs directly.

What an adapted pimm hook sees as ``self.trainer``: a read-only ``TrainerView`` of the state.

Progress, metrics and the step's scalar outputs, no model, optimizer or
config: setting or deleting anything raises with what to do instead
(return effects). ``pimm_fn.compat.hookbase`` sets it while a method runs.
"""

import copy
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Effect
from pimm_fn.core.events import Event
from pimm_fn.core.frozen import FrozenMap, freeze
from pimm_fn.core.state import State

__all__ = [
    "TrainerView",
    "HookBase",
    "adapt",
    "is_pimm_hook",
    "adapted",
]


_READ_ONLY = (
    "an adapted hook cannot change training through self.trainer: return a tuple of effects from the method "
    "(e.g. (SaveCheckpoint(self.trainer.global_step),)) or rewrite it as a pure hook (state, event) -> (state, effects)"
)


@attrs.frozen
class TrainerView:
    """What an adapted hook sees as ``self.trainer``: a read-only view of the state.

    Attributes:
        epoch, max_epoch: the current epoch (0-based) and the number of epochs.
        iter: pimm's ``comm_info["iter"]``: the 0-based index in the epoch of
            the step running (``before_step``/``after_step``) or last run.
        global_step: optimizer steps completed (``after_step`` of the first
            step sees 1, its ``before_step`` 0).
        iters_per_epoch, rank, world_size: the schedule and this process.
        metrics, best: the latest published metrics and the best values.
        comm_info: the step's scalar outputs at ``after_step``, else empty.
    """

    epoch: int
    max_epoch: int
    iter: int
    global_step: int
    iters_per_epoch: int
    rank: int
    world_size: int
    metrics: FrozenMap = attrs.field(converter=freeze)
    best: FrozenMap = attrs.field(converter=freeze)
    comm_info: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)

    def __getattr__(self, name):
        # Only reached for names the view lacks (model, optimizer, cfg, storage ...).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"TrainerView has no {name!r}: an adapted hook sees progress, metrics and step outputs only; "
            f"request work on the model as effects (Evaluate, SaveCheckpoint, Log), or let the model "
            f"take part itself with model_hook()"
        )

    @classmethod
    def of(cls, state: State, event: Event) -> "TrainerView":
        """The view of ``state`` while ``event`` is handled."""
        p = state.progress
        # pimm's iter is the index of the step in hand: before it runs, the steps done so far.
        index = p.iter_in_epoch if isinstance(event, ev.BeforeStep) else max(p.iter_in_epoch - 1, 0)
        outputs = event.outputs if isinstance(event, ev.AfterStep) else FrozenMap()
        return cls(
            p.epoch,
            p.max_epochs,
            index,
            p.global_step,
            p.iters_per_epoch,
            state.rank,
            state.world_size,
            state.metrics,
            state.best,
            outputs,
        )


def _refuse(self, name, value):
    raise AttributeError(f"TrainerView is read-only: cannot set {name!r}; {_READ_ONLY}")


def _refuse_delete(self, name):
    raise AttributeError(f"TrainerView is read-only: cannot delete {name!r}; {_READ_ONLY}")


# Replaces attrs' generic FrozenInstanceError with a message that says what to do instead.
setattr(TrainerView, "__setattr__", _refuse)


setattr(TrainerView, "__delattr__", _refuse_delete)


_METHODS = {
    ev.ModifyConfig: "modify_config",
    ev.BeforeTrain: "before_train",
    ev.BeforeEpoch: "before_epoch",
    ev.BeforeStep: "before_step",
    ev.AfterStep: "after_step",
    ev.AfterEpoch: "after_epoch",
    ev.AfterTrain: "after_train",
}


class HookBase:
    """pimm's hook base class: every method is a no-op; subclass and override some.

    ``self.trainer`` is a ``TrainerView`` while a method runs (``None``
    otherwise). Methods other than ``modify_config`` return ``None`` or a
    tuple of effects; ``modify_config(cfg)`` gets a copy of the config as a
    dict and may change it in place or return a new dict. Put it in a hook
    list as it is (``as_hook()`` adapts it), or adapt it with ``adapt(hook)``.
    """

    trainer = None

    def as_hook(self) -> "_Adapted":
        """The pimm_fn hook that runs this object's methods: ``adapt(self)`` (how ``pf.loop`` takes it directly)."""
        return adapt(self)

    def modify_config(self, cfg: dict[str, Any]) -> Mapping[str, Any] | None:
        return None

    def before_train(self) -> Sequence[Effect] | None:
        return None

    def before_epoch(self) -> Sequence[Effect] | None:
        return None

    def before_step(self) -> Sequence[Effect] | None:
        return None

    def after_step(self) -> Sequence[Effect] | None:
        return None

    def after_epoch(self) -> Sequence[Effect] | None:
        return None

    def after_train(self) -> Sequence[Effect] | None:
        return None


_MISSING = object()


def _call(obj, method, view, *args):
    """``method(*args)`` with ``obj.trainer`` set to ``view``, restored afterwards."""
    # The instance's own value only: deleting it afterwards re-exposes HookBase.trainer (None).
    previous = vars(obj).get("trainer", _MISSING) if hasattr(obj, "__dict__") else getattr(obj, "trainer", _MISSING)
    obj.trainer = view
    try:
        return method(*args)
    finally:
        if previous is _MISSING:
            del obj.trainer
        else:
            obj.trainer = previous


def _effects(result, obj, name) -> tuple:
    if result is None:
        return ()
    if isinstance(result, (tuple, list)) and all(isinstance(e, Effect) for e in result):
        return tuple(result)
    raise TypeError(
        f"{type(obj).__name__}.{name}() must return None or a tuple of pimm_fn effects (got {result!r:.100})"
    )


@attrs.frozen(repr=False)
class _Adapted:
    factory_name: ClassVar[str] = "adapt"
    events: ClassVar[tuple] = tuple(_METHODS)
    obj: Any

    def _modify_config(self, state, method, view):
        config = copy.deepcopy(dict(state.config))
        result = _call(self.obj, method, view, config)
        if result is not None and not isinstance(result, Mapping):
            raise TypeError(
                f"{type(self.obj).__name__}.modify_config(cfg) must return None or a dict "
                f"(got {type(result).__name__}: {result!r:.100})"
            )
        config = config if result is None else result  # None: changed in place, or not at all
        return state if config == state.config else state.evolve(config=config)

    def __call__(self, state, event):
        name = _METHODS.get(type(event))
        method = getattr(self.obj, name, None) if name else None
        if method is None:
            return state, ()
        view = TrainerView.of(state, event)
        if name == "modify_config":
            return self._modify_config(state, method, view), ()
        return state, _effects(_call(self.obj, method, view), self.obj, name)

    def __repr__(self):
        return f"adapt({self.obj!r})"


def adapt(hook_obj: Any) -> _Adapted:
    """A pimm_fn hook that runs a pimm class-based hook's methods at their events.

    ``modify_config(cfg)`` runs at ``ModifyConfig`` (fresh runs only) with a
    dict copy of ``state.config``; a returned dict (or the copy, changed in
    place) becomes the new config. The other methods run at their events
    with ``hook_obj.trainer`` set to a ``TrainerView`` and return ``None`` or
    a tuple of effects. Missing methods are no-ops.

    Not pure: the object's own attributes are neither checkpointed nor reset
    (see the module docstring for what to rewrite).

    Raises:
        TypeError: ``hook_obj`` has none of pimm's hook methods.

    >>> from pimm_fn.core.effects import SaveCheckpoint
    >>> class SaveAtEpochTwo(HookBase):
    ...     def after_epoch(self):
    ...         if self.trainer.epoch == 2:
    ...             return (SaveCheckpoint(self.trainer.global_step),)
    ...     def __repr__(self):
    ...         return "SaveAtEpochTwo()"
    >>> adapt(SaveAtEpochTwo())
    adapt(SaveAtEpochTwo())
    >>> import pimm_fn as pf
    >>> [e.effect for e in pf.plan([adapt(SaveAtEpochTwo())], iters_per_epoch=5, max_epochs=4)]
    [SaveCheckpoint(step=15, snapshot=False, final=False...)]
    """
    if not any(callable(getattr(hook_obj, name, None)) for name in _METHODS.values()):
        raise TypeError(
            f"adapt() takes an object with pimm hook methods ({', '.join(_METHODS.values())}), "
            f"e.g. a HookBase subclass (got {hook_obj!r:.80}); a pimm_fn hook needs no adapter"
        )
    return _Adapted(hook_obj)


def is_pimm_hook(obj) -> bool:
    """Whether ``obj`` is a class-based pimm hook: not a pimm_fn hook (not callable), not a config dict,
    with at least one of pimm's hook methods (a ``HookBase`` of pimm_fn or of pimm itself).

    >>> is_pimm_hook(HookBase()), is_pimm_hook(dict(type="CheckpointSaver")), is_pimm_hook(len)
    (True, False, False)
    """
    if callable(obj) or isinstance(obj, (Mapping, type)):
        return False
    return any(callable(getattr(obj, name, None)) for name in _METHODS.values())


def adapted(obj: Any) -> Any:
    """``adapt(obj)`` for a class-based pimm hook, else ``obj`` unchanged: how ``build_hooks`` takes one.

    >>> adapted(HookBase()).__class__.__name__, adapted(len) is len
    ('_Adapted', True)
    """
    return adapt(obj) if is_pimm_hook(obj) else obj
