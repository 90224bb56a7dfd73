"""An optimizer or scheduler of another class than the one whose state the checkpoint holds.

torch loads one optimizer's state into another class without a word, and it
fails later (Adam's param groups in an SGD: ``KeyError: 'momentum'`` at the
next step); a scheduler's state loads into another scheduler and drives it
with fields it does not use. So a checkpoint records the class of each
optimizer and of the scheduler (``Replicated.classes``, qualified names:
:func:`recorded`), and a resume compares them with this run's
(:func:`changes`) before anything is loaded. A difference is a
``ResumeError`` naming both classes, unless ``resume_hyperparameters="new"``:
then that object starts fresh, its state not loaded (:func:`fresh_states`),
and the model and everything else resume; each is said on the console.

A checkpoint written before the record is compared by what it holds: an
optimizer's param-group keys, a scheduler's state keys, without the keys
torch adds or drops between releases (implementation switches, private
fields). A change is found only where each side holds a key the other lacks
(``betas`` against ``momentum``), so another torch release of the same
class is none; classes with the same keys (``Adam``, ``AdamW``) cannot be
told apart this way. A scheduler state of the right class that lacks what
every torch scheduler keeps (:func:`unfit_scheduler_state`) is refused too:
torch would load it, and the schedule restart, in silence.
"""

import attrs

__all__ = [
    "Changed", "qualified_name", "recorded", "changes", "unfit_scheduler_state", "fresh_states", "refusal", "fresh_line",
]

# Keys a torch release may add or drop for the same optimizer (how a group is computed, not by which rule), and
# the initial_lr a scheduler adds.
_OPTIMIZER_SWITCHES = frozenset({
    "params", "param_names", "foreach", "fused", "capturable", "differentiable", "maximize", "decoupled_weight_decay",
    "initial_lr",
})
_NEVER_STEPPED = {"state": {}, "param_groups": None}  # a sharded optimizer's state before its first step
_SCHEDULER_CORE = ("last_epoch", "base_lrs")  # what every torch scheduler's state holds (ReduceLROnPlateau: last_epoch)


@attrs.frozen
class Changed:
    """One object of this run whose class is not the checkpoint's.

    Attributes:
        what: ``"optimizer"`` or ``"scheduler"``.
        name: the optimizer's name in ``loop(optimizer={name: opt})``, else ``None``.
        saved: the checkpoint's class (qualified name); ``None`` where it was not recorded.
        now: this run's class (qualified name).
        keys: where ``saved`` is ``None``, the keys of the saved state that tell another class.
    """

    what: str
    name: str | None
    saved: str | None
    now: str
    keys: str = ""

    @property
    def label(self) -> str:
        return self.what if self.name is None else f"{self.what} {self.name!r}"

    @property
    def saved_text(self) -> str:
        if self.saved is not None:
            return f"a {self.saved}"
        return f"of a class not recorded (a checkpoint written before classes were), {self.keys}"


def qualified_name(obj) -> str:
    """``obj``'s class as ``module.QualName``.

    >>> qualified_name(Changed("optimizer", None, "a", "b"))
    'pimm_fn.runtime.class_change.Changed'
    """
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def recorded(ctx) -> dict:
    """What a checkpoint of ``ctx``'s run records: ``Replicated.classes``."""
    if ctx.optimizers is None:
        found = {"optimizer": qualified_name(ctx.optimizer)}
    else:
        found = {"optimizers": {name: qualified_name(o) for name, o in ctx.optimizers.items()}}
    if ctx.scheduler is not None:
        found["scheduler"] = qualified_name(ctx.scheduler)
    return found


def _saved_optimizer(replicated, name):
    return replicated.optimizer if name is None else (replicated.optimizers or {}).get(name)


def _saved_class(classes, what, name):
    if not isinstance(classes, dict):
        return None
    if what == "optimizer" and name is not None:
        return (classes.get("optimizers") or {}).get(name)
    return classes.get(what)


def _group_keys(state) -> set | None:
    """The keys of an optimizer state's param groups, or ``None`` where it holds none to compare."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        return None
    return {k for g in groups for k in g if isinstance(k, str)} - _OPTIMIZER_SWITCHES


def _scheduler_keys(state) -> set | None:
    if not isinstance(state, dict):
        return None
    return {k for k in state if isinstance(k, str) and not k.startswith("_") and k != "verbose"}


def _by_keys(saved_keys, now_keys, where: str) -> str | None:
    """What the saved state shows of another class, or ``None`` when each side's keys could be one class's."""
    if saved_keys is None or now_keys is None:
        return None
    extra, lacking = sorted(saved_keys - now_keys), sorted(now_keys - saved_keys)
    if not extra or not lacking:
        return None
    return f"whose {where} hold {extra} and lack {lacking}"


def _change(what, name, obj, saved_class, saved_keys, now_keys, where) -> Changed | None:
    now = qualified_name(obj)
    if saved_class is not None:
        return None if saved_class == now else Changed(what, name, saved_class, now)
    shown = _by_keys(saved_keys, now_keys, where)
    return None if shown is None else Changed(what, name, None, now, shown)


def changes(replicated, ctx) -> tuple[Changed, ...]:
    """This run's optimizers and scheduler whose class differs from the checkpoint's, in that order.

    ``replicated``: the checkpoint's replicated part, holding the optimizer names this run has.
    """
    found = []
    for name, optimizer in ctx.named_optimizers().items():
        saved = _saved_optimizer(replicated, name)
        found.append(_change("optimizer", name, optimizer, _saved_class(replicated.classes, "optimizer", name),
                             _group_keys(saved), _group_keys(optimizer.state_dict()), "param groups"))
    if ctx.scheduler is not None and replicated.scheduler is not None:
        found.append(_change("scheduler", None, ctx.scheduler, _saved_class(replicated.classes, "scheduler", None),
                             _scheduler_keys(replicated.scheduler), _scheduler_keys(ctx.scheduler.state_dict()),
                             "state entries"))
    return tuple(c for c in found if c is not None)


def unfit_scheduler_state(replicated, ctx) -> str | None:
    """Why the checkpoint's scheduler state, of this run's class, cannot be its state; ``None`` when it can be.

    torch loads any dict into a scheduler (``__dict__.update``), so a state
    without the fields this run's scheduler keeps of every torch scheduler
    (``last_epoch``, ``base_lrs``) would leave it fresh in silence.
    """
    if ctx.scheduler is None or replicated.scheduler is None:
        return None
    missing = [k for k in _SCHEDULER_CORE if k in ctx.scheduler.state_dict() and k not in replicated.scheduler]
    if not missing:
        return None
    return (f"its scheduler state holds {sorted(replicated.scheduler)[:6]}, without {missing}, which every torch "
            f"scheduler's state holds: it was not written by this scheduler, or was altered")


def fresh_states(replicated, changed, ctx):
    """``replicated`` with each changed optimizer's state replaced by what it holds now, so loading it loads nothing.

    A sharded optimizer's is its never-stepped state: the shards load the model alone.
    """
    names = {c.name for c in changed if c.what == "optimizer"}
    if not names:
        return replicated
    if ctx.optimizers is None:
        own = dict(_NEVER_STEPPED) if replicated.sharded else ctx.optimizer.state_dict()
        return attrs.evolve(replicated, optimizer=own)
    kept = {name: ctx.optimizers[name].state_dict() if name in names else state
            for name, state in replicated.optimizers.items()}
    return attrs.evolve(replicated, optimizers=kept)


def _differs(c: Changed) -> str:
    return f"its {c.label} is {c.saved_text}, this run's is a {c.now}"


def refusal(changed, path) -> str:
    """The ``ResumeError``'s text: each change, both classes, and the two fixes."""
    which = " and ".join(c.label for c in changed)
    return (
        f"cannot resume from {path}: {'; '.join(map(_differs, changed))}. Loading a state into another class fails "
        f"at a later step or trains with the wrong fields. Build the run with the checkpoint's class, or pass "
        f"resuming=pimm_fn.Resuming(...) with resume_hyperparameters='new' to start the {which} fresh (state not loaded; the model and the rest resumed)"
    )


def fresh_line(c: Changed, path) -> str:
    """The console line of one object started fresh under ``resume_hyperparameters='new'``."""
    start = ("its schedule starts again from this run's lr" if c.what == "scheduler" else
             "its param groups are this run's and its state (moments, buffers) starts empty")
    return (f"the {c.label} in {path} is {c.saved_text}, this run's is a {c.now}: the {c.label} starts fresh "
            f"(resume_hyperparameters='new'): {start}; the model and the rest resumed")
