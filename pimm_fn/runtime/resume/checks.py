"""What refuses or warns on a resume, checked before anything is touched: hyper-parameters and classes against the checkpoint's.

A sound checkpoint that cannot be resumed as asked is a ``ResumeError``
(other optimizers, another class of optimizer or scheduler, a sharded model
from a replicated checkpoint); one whose contents contradict themselves (a
sharded claim its files do not hold, RNG states that do not restore) is a
``CheckpointError``. ``pimm_fn.runtime.resume.resume.restore`` asks each before it
loads anything, so a refused resume changes nothing.

An optimizer's hyper-parameters, as this run built them, against a checkpoint's.

Loading a checkpoint's optimizer state replaces every hyper-parameter of
every param group (``lr``, ``weight_decay``, ``momentum``, ``betas``...)
with the checkpoint's, so a run resumed with ``lr=0.01`` whose checkpoint
says ``lr=0.1`` would go on at 0.1 without a word. ``restore`` compares the
two, says each difference, and lets ``loop(resuming=Resuming(resume_hyperparameters=))``
choose which wins:

* ``"checkpoint"`` (the default): the checkpoint's values, as saved;
* ``"new"``: this run's values, applied to the param groups after the
  optimizer state was loaded.

With a scheduler, ``lr`` moves on its schedule, so it is compared through
``initial_lr`` (the lr the schedule started from, which the scheduler
writes into each group); ``lr`` itself is not (nor ``momentum``/``betas``
under a scheduler that cycles them, ``cycle_momentum``). A scheduler that
writes no ``initial_lr`` (``ReduceLROnPlateau``) leaves ``lr`` unchecked.
The scheduler's own state (its step count, ``base_lrs``) always comes from
the checkpoint: under ``"new"`` the groups take this run's ``initial_lr``
and ``lr``, then at its next step a scheduler that multiplies the current
lr (``StepLR``, ``ExponentialLR``) continues from the new lr, while one that
computes lr from its ``base_lrs`` (``LambdaLR``, ``CosineAnnealingLR``,
``OneCycleLR``) returns to the checkpoint's schedule. To change a schedule,
build the scheduler anew and start a fresh run with ``load_weights``.

A scheduler with a horizon (``OneCycleLR``'s ``total_steps``) cannot be
stepped past it: a run extended beyond the horizon its checkpoint's
scheduler was built for (2 epochs, resumed with ``max_epochs=3`` and a
scheduler built for 3) would fail in torch one step after the old end.
``horizon_problem`` finds that before anything is loaded, so the resume is
refused with the fix instead.

An optimizer or scheduler of another class than the one whose state the checkpoint holds.

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

from typing import Any

import attrs
import torch

from pimm_fn import dist
from pimm_fn.checkpoint.errors import CheckpointError
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.checkpoint.inspection import TRAINER
from pimm_fn.runtime.errors import ResumeError
from pimm_fn.runtime.step.rng import rng_problem

__all__ = [
    "hyperparameters",
    "differences",
    "apply_new",
    "restart_schedule",
    "describe",
    "horizon_problem",
    "Changed",
    "qualified_name",
    "recorded",
    "changes",
    "unfit_scheduler_state",
    "fresh_states",
    "refusal",
    "fresh_line",
    "check_sharding",
    "check_weights",
    "weight_differences",
    "rng_error",
    "check_optimizers",
    "changed_classes",
]


# How a group is computed, not what it computes: a change is no change of training.
_IMPLEMENTATION = frozenset({"params", "param_names", "foreach", "fused", "capturable", "differentiable"})


def hyperparameters(optimizer) -> list[dict]:
    """A copy of each param group's hyper-parameters (everything but the parameters)."""
    return [
        {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in group.items() if k != "params"}
        for group in optimizer.param_groups
    ]


def _scheduled(scheduler) -> frozenset:
    """The keys ``scheduler`` moves on its own schedule: compared through ``initial_lr`` or not at all."""
    if scheduler is None:
        return frozenset()
    if getattr(scheduler, "cycle_momentum", False):
        return frozenset({"lr", "momentum", "betas"})
    return frozenset({"lr"})


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a).cpu().double(), torch.as_tensor(b).cpu().double())
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def differences(built: list[dict], loaded: list[dict], scheduler=None) -> list[tuple]:
    """``(group, key, checkpoint value, new value)`` for each hyper-parameter that differs.

    Only keys both sides hold are compared, minus implementation switches
    (``foreach``, ``fused``...) and the keys ``scheduler`` moves.

    >>> differences([{"lr": 0.01, "momentum": 0.9}], [{"lr": 0.1, "momentum": 0.9}])
    [(0, 'lr', 0.1, 0.01)]
    """
    skipped = _IMPLEMENTATION | _scheduled(scheduler)
    found = []
    for i, (new, old) in enumerate(zip(built, loaded)):
        for key in new:
            if key in old and key not in skipped and not _same(old[key], new[key]):
                found.append((i, key, old[key], new[key]))
    return found


def apply_new(optimizer, built: list[dict], found: list[tuple]) -> None:
    """Give ``optimizer``'s groups this run's value for each difference (``resume_hyperparameters="new"``).

    A new ``initial_lr`` (the schedule's start) brings this run's ``lr`` along.
    """
    for i, key, _, new in found:
        group = optimizer.param_groups[i]
        group[key] = new
        if key == "initial_lr" and "lr" in built[i]:
            group["lr"] = built[i]["lr"]


def restart_schedule(optimizer, built: list[dict], scheduler) -> None:
    """Give ``optimizer``'s groups this run's values of the keys ``scheduler`` moves (``lr``, ``initial_lr``...).

    For a scheduler started fresh over a resumed optimizer: its schedule
    begins where this run built it, not at the checkpoint's decayed lr.
    """
    keys = _scheduled(scheduler) | {"initial_lr"}
    for group, mine in zip(optimizer.param_groups, built):
        group.update({key: value for key, value in mine.items() if key in keys})


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return repr(value)


def describe(found: list[tuple], winner: str, name: str | None = None) -> str:
    """One line naming each difference and which value the run goes on with; ``name``: the optimizer's, of several."""
    items = "; ".join(f"group {i} {key!r}: checkpoint {_show(old)}, new {_show(new)}" for i, key, old, new in found)
    if winner == "new":
        outcome = "using this run's values (resume_hyperparameters='new'); the scheduler's state is the checkpoint's"
    else:
        outcome = "keeping the checkpoint's values; pass resuming=pimm_fn.Resuming(resume_hyperparameters='new') to use this run's"
    which = "the optimizer's" if name is None else f"optimizer {name!r}'s"
    return f"{which} hyper-parameters differ from the checkpoint's: {items}; {outcome}"


def horizon_problem(scheduler, saved: dict | None, path) -> str | None:
    """Why ``scheduler``, loaded from ``saved`` (its checkpointed state), would fail this run; ``None`` when it would not.

    A scheduler whose state holds ``total_steps`` (``OneCycleLR``) raises once
    stepped past it. Loading ``saved`` replaces this run's horizon with the
    checkpoint's, so when this run built its scheduler for more steps (the
    run was extended) the resume is refused before anything is loaded.

    >>> class OneCycle:
    ...     total_steps = 30
    >>> print(horizon_problem(OneCycle(), {"total_steps": 20, "last_epoch": 20}, "run/model/last"))
    the scheduler in run/model/last (OneCycle) was built for 20 steps and has taken 20; this run built it for 30, ...
    >>> horizon_problem(OneCycle(), {"total_steps": 30, "last_epoch": 20}, "run/model/last") is None
    True
    """
    if scheduler is None or not isinstance(saved, dict):
        return None
    built, old = getattr(scheduler, "total_steps", None), saved.get("total_steps")
    if not (isinstance(built, int) and isinstance(old, int)) or isinstance(built, bool) or isinstance(old, bool):
        return None
    if built <= old:
        return None
    taken = saved.get("last_epoch", "?")
    name = type(scheduler).__name__
    return (
        f"the scheduler in {path} ({name}) was built for {old} steps and has taken {taken}; this run built it for "
        f"{built}, but a resume restores the scheduler's state as saved, horizon included, so training past step "
        f"{old} would fail. Resume with the budget the checkpoint was written for (its {old} steps), or extend the "
        f"run as a fresh one from its weights (pf.load_weights({str(path)!r})) with a scheduler built for the new length"
    )


# Keys a torch release may add or drop for the same optimizer (how a group is computed, not by which rule), and
# the initial_lr a scheduler adds.
_OPTIMIZER_SWITCHES = frozenset(
    {
        "params",
        "param_names",
        "foreach",
        "fused",
        "capturable",
        "differentiable",
        "maximize",
        "decoupled_weight_decay",
        "initial_lr",
    }
)


# A sharded optimizer's state before its first step.
_NEVER_STEPPED: dict[str, Any] = {"state": {}, "param_groups": None}


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
    'pimm_fn.runtime.resume.checks.Changed'
    """
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def recorded(ctx) -> dict:
    """What a checkpoint of ``ctx``'s run records: ``Replicated.classes``."""
    found: dict[str, str | dict[str, str]]
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
        found.append(
            _change(
                "optimizer",
                name,
                optimizer,
                _saved_class(replicated.classes, "optimizer", name),
                _group_keys(saved),
                _group_keys(optimizer.state_dict()),
                "param groups",
            )
        )
    if ctx.scheduler is not None and replicated.scheduler is not None:
        found.append(
            _change(
                "scheduler",
                None,
                ctx.scheduler,
                _saved_class(replicated.classes, "scheduler", None),
                _scheduler_keys(replicated.scheduler),
                _scheduler_keys(ctx.scheduler.state_dict()),
                "state entries",
            )
        )
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
    return (
        f"its scheduler state holds {sorted(replicated.scheduler)[:6]}, without {missing}, which every torch "
        f"scheduler's state holds: it was not written by this scheduler, or was altered"
    )


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
    kept = {
        name: ctx.optimizers[name].state_dict() if name in names else state
        for name, state in replicated.optimizers.items()
    }
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
    start = (
        "its schedule starts again from this run's lr"
        if c.what == "scheduler"
        else "its param groups are this run's and its state (moments, buffers) starts empty"
    )
    return (
        f"the {c.label} in {path} is {c.saved_text}, this run's is a {c.now}: the {c.label} starts fresh "
        f"(resume_hyperparameters='new'): {start}; the model and the rest resumed"
    )


def check_sharding(replicated, ctx, info) -> None:
    """What the checkpoint says of its model is what it holds, and fits this run: checked before anything loads.

    A sharded model resumes from shards (written by a sharded model of any
    world size), never from a weights file; a sharded checkpoint resumes into
    a replicated model too (its shards read into it). The claim itself is
    checked against the DCP metadata: shards claimed are there, as tensors.
    """
    if info.format != "standard" and replicated.sharded:
        raise CheckpointError(
            info.path,
            info.path.name,
            "says its model was sharded, but a legacy file holds no shards: its trainer part was altered",
        )
    if info.format == "standard":
        sharded.check_claim(info.path, replicated.sharded)
    if ctx.sharded and not replicated.sharded:
        raise ResumeError(
            f"cannot resume this sharded model from {info.path}: that checkpoint was written by a replicated "
            f"(unsharded) model, whose optimizer state is keyed by parameter position. Resume it with the model "
            f"unsharded, or start the sharded run from its weights (load_weights({str(info.path)!r}))"
        )
    rest = replicated.optimizer
    if replicated.sharded and not (
        isinstance(rest, dict)
        and isinstance(rest.get("state"), dict)
        and isinstance(rest.get("param_groups"), (list, type(None)))
    ):
        raise CheckpointError(
            info.path,
            TRAINER,
            "says its model was sharded, but its optimizer part is not "
            "the state and param groups a sharded save writes: its trainer part was altered",
        )


def check_weights(model, weights, info) -> None:
    """The checkpoint's weights are this model's names and shapes: else a ``ResumeError`` naming the difference.

    Asked before the optimizers load, so that a model built otherwise than
    the one that wrote the checkpoint (another layer, another width) leaves
    the run as it was built, and is said as the setup it is.
    """
    parts = weight_differences(model.state_dict(), weights)
    if not parts:
        return
    raise ResumeError(
        f"cannot resume from {info.path}: its weights do not fit this run's {type(model).__name__} "
        f"({'; '.join(parts)}). Build the model the checkpoint was written with, or start fresh from its weights "
        f"(load_weights({str(info.path)!r}, replacements=...) maps renamed keys)"
    )


def weight_differences(own: dict, weights: dict, *, dtypes: bool = False, theirs: str = "saved") -> list[str]:
    """How ``weights`` (saved, or sent by a peer) differ from ``own`` (a model's ``state_dict()``), a part per kind.

    Names missing or unexpected, other shapes and, with ``dtypes``, other
    dtypes (a load casts them: a resume takes them, a heal that must be bit
    for bit does not); at most five of each named, ``weights``' side called
    ``theirs``. ``[]`` when they fit.

    >>> import torch
    >>> weight_differences({"w": torch.zeros(2)}, {"w": torch.zeros(3), "b": torch.zeros(1)})
    ['unexpected b', 'other shapes w: [3] saved, [2] here']
    """
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    both = [k for k, v in own.items() if k in weights and hasattr(v, "shape") and hasattr(weights[k], "shape")]
    shapes = [
        f"{k}: {list(weights[k].shape)} {theirs}, {list(own[k].shape)} here"
        for k in both
        if own[k].shape != weights[k].shape
    ]
    types = [
        f"{k}: {weights[k].dtype} {theirs}, {own[k].dtype} here"
        for k in both
        if dtypes and own[k].dtype != weights[k].dtype
    ]
    return [
        f"{what} {', '.join(map(str, keys[:5]))}{' ...' if len(keys) > 5 else ''}"
        for what, keys in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("other shapes", shapes),
            ("other dtypes", types),
        )
        if keys
    ]


def rng_error(local, info) -> CheckpointError | None:
    """This rank's saved RNG states do not restore (tried on scratch generators): the error, before anything loads."""
    problem = None if local is None else rng_problem(local.rng)
    if problem is None:
        return None
    return CheckpointError(
        info.path,
        TRAINER,
        f"holds RNG states of rank {dist.rank()} that do not restore "
        f"({problem}): the checkpoint was not written by pimm_fn, or was altered",
    )


def check_optimizers(replicated, ctx, info) -> None:
    """The checkpoint holds one optimizer for a run of one, the same names for a run of several named ones."""
    saved = None if replicated.optimizers is None else sorted(replicated.optimizers)
    wanted = None if ctx.optimizers is None else sorted(ctx.optimizers)
    if saved == wanted:
        return
    said = lambda names: "one optimizer (optimizer=)" if names is None else f"optimizers {names} (optimizer={{...}})"
    raise ResumeError(
        f"cannot resume from {info.path}: it holds the state of {said(saved)}, this run has {said(wanted)}. "
        f"Build the run with the optimizers the checkpoint was written with, or start fresh from its weights "
        f"(load_weights({str(info.path)!r}))"
    )


def changed_classes(replicated, ctx, info, winner) -> tuple:
    """The optimizers and scheduler of another class than the checkpoint's: fresh under ``"new"``, else refused."""
    changed = changes(replicated, ctx)
    if changed and winner != "new":
        raise ResumeError(refusal(changed, info.path))
    unfit = None if any(c.what == "scheduler" for c in changed) else unfit_scheduler_state(replicated, ctx)
    if unfit is not None:
        raise ResumeError(f"cannot resume from {info.path}: {unfit}")
    return changed
