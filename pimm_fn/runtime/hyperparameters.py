"""An optimizer's hyper-parameters, as this run built them, against a checkpoint's.

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
"""

import torch

__all__ = ["hyperparameters", "differences", "apply_new", "restart_schedule", "describe", "horizon_problem"]

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
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (built, old)) or built <= old:
        return None
    taken = saved.get("last_epoch", "?")
    name = type(scheduler).__name__
    return (
        f"the scheduler in {path} ({name}) was built for {old} steps and has taken {taken}; this run built it for "
        f"{built}, but a resume restores the scheduler's state as saved, horizon included, so training past step "
        f"{old} would fail. Resume with the budget the checkpoint was written for (its {old} steps), or extend the "
        f"run as a fresh one from its weights (pf.load_weights({str(path)!r})) with a scheduler built for the new length"
    )
