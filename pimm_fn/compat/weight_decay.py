"""pimm's weight decay hooks, as pure hooks with effects: ``WeightDecayExclusion``, ``WeightDecayScheduler``.

The decay is a function of the global step (pimm's cosine, computed, not
tabled), so a resumed run sets the same values as the uninterrupted one.
The effects are carried out on the optimizer's param groups by
``pimm_fn.compat.weight_decay``.

``WeightDecayExclusion`` changes the optimizer's param groups, which must
happen before the scheduler is built and before a checkpoint's optimizer
state is loaded (pimm splits them after loading, ``PIMM.md`` 6.7): call
``pimm_fn.compat.split_weight_decay(model, optimizer, ...)`` where the
optimizer is built; the hook checks at ``BeforeTrain`` that it was.

>>> import pimm_fn as pf
>>> [round(e.effect.value, 4) for e in pf.plan([weight_decay_scheduler(0.04, 0.2)], iters_per_epoch=2, max_epochs=2)]
[0.04, 0.0634, 0.12, 0.1766]

Weight decay on the optimizer's param groups, pimm's way: which parameters go undecayed, and the split.

``split_weight_decay`` is pimm's ``WeightDecayExclusion`` split, called
where the optimizer is built; the handlers of ``ExcludeWeightDecay`` (it
checks the split was made) and ``SetWeightDecay`` (the scheduled decay on
every decayed group) carry out what ``pimm_fn.compat.weight_decay`` asks.
"""

import math
from typing import ClassVar, TypeVar

import attrs
import torch

from pimm_fn.compat.effects import ExcludeWeightDecay, SetWeightDecay
from pimm_fn.core import events as ev
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import is_bool, number
from pimm_fn.runtime.engine.interpreter import unwrap

__all__ = [
    "weight_decay_exclusion",
    "weight_decay_scheduler",
    "cosine_value",
    "split_weight_decay",
    "excluded_from_weight_decay",
    "exclude_weight_decay",
    "set_weight_decay",
]


@attrs.frozen(repr=False)
class _WeightDecayExclusion:
    factory_name: ClassVar[str] = "weight_decay_exclusion"
    events: ClassVar[tuple] = (ev.BeforeTrain,)
    emits: ClassVar[tuple] = (ExcludeWeightDecay,)
    rank_consistent: ClassVar[bool] = True
    exclude_bias_from_wd: bool = attrs.field(default=True, validator=is_bool)
    exclude_norm_from_wd: bool = attrs.field(default=True, validator=is_bool)
    exclude_gamma_from_wd: bool = attrs.field(default=True, validator=is_bool)
    exclude_token_from_wd: bool = attrs.field(default=True, validator=is_bool)
    exclude_ndim_1_from_wd: bool = attrs.field(default=True, validator=is_bool)

    @property
    def flags(self) -> dict:
        """The exclusion rules as ``split_weight_decay`` takes them."""
        return {
            n.removeprefix("exclude_").removesuffix("_from_wd"): getattr(self, n)
            for n in (
                "exclude_bias_from_wd",
                "exclude_norm_from_wd",
                "exclude_gamma_from_wd",
                "exclude_token_from_wd",
                "exclude_ndim_1_from_wd",
            )
        }

    def __call__(self, state, event):
        return state, (ExcludeWeightDecay(**self.flags),)

    def __repr__(self):
        args = [f"exclude_{k}_from_wd=False" for k, v in self.flags.items() if not v]
        return f"weight_decay_exclusion({', '.join(args)})"


@hook_factory
def weight_decay_exclusion(
    exclude_bias_from_wd: bool = True,
    exclude_norm_from_wd: bool = True,
    exclude_gamma_from_wd: bool = True,
    exclude_token_from_wd: bool = True,
    exclude_ndim_1_from_wd: bool = True,
) -> _WeightDecayExclusion:
    """pimm's ``WeightDecayExclusion``: biases, norms, ``gamma``, tokens and 1-D parameters without weight decay.

    The split is ``pimm_fn.compat.split_weight_decay(model, optimizer,
    **hook.flags)``, done where the optimizer is built (before its scheduler
    and before a resume loads its state). This hook checks at ``BeforeTrain``
    that the optimizer's groups are split so, and refuses to train otherwise.

    Emits:
        ``ExcludeWeightDecay(bias, norm, gamma, token, ndim_1)`` at ``BeforeTrain`` (each rank).

    >>> weight_decay_exclusion(exclude_token_from_wd=False)
    weight_decay_exclusion(exclude_token_from_wd=False)
    """
    return _WeightDecayExclusion(
        exclude_bias_from_wd, exclude_norm_from_wd, exclude_gamma_from_wd, exclude_token_from_wd, exclude_ndim_1_from_wd
    )


def cosine_value(index: int, base: float, final: float, total: float) -> float:
    """pimm's ``CosineScheduler.get(index)`` over ``total`` iterations, computed instead of tabled.

    >>> [round(cosine_value(i, 0.04, 0.2, 4), 4) for i in (0, 2, 9)]
    [0.04, 0.12, 0.2]
    """
    if index >= total:
        return final
    length = math.ceil(total)  # len(np.arange(total))
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * index / length))


@attrs.frozen(repr=False)
class _WeightDecayScheduler:
    factory_name: ClassVar[str] = "weight_decay_scheduler"
    events: ClassVar[tuple] = (ev.BeforeStep,)
    emits: ClassVar[tuple] = (SetWeightDecay,)
    rank_consistent: ClassVar[bool] = True
    base_value: float = attrs.field(default=0.04, validator=number(at_least=0))
    final_value: float = attrs.field(default=0.2, validator=number(at_least=0))
    warmup_ratio: float = attrs.field(default=1.0, validator=number(above=0))

    def __call__(self, state, event):
        total = state.progress.max_steps * self.warmup_ratio  # pimm: cfg.scheduler.total_steps * warmup_ratio
        value = cosine_value(event.step - 1, self.base_value, self.final_value, total)
        return state, (SetWeightDecay(event.step, value),)

    def __repr__(self):
        return f"weight_decay_scheduler({self.base_value!r}, {self.final_value!r}, warmup_ratio={self.warmup_ratio!r})"


@hook_factory
def weight_decay_scheduler(
    base_value: float = 0.04, final_value: float = 0.2, warmup_ratio: float = 1.0
) -> _WeightDecayScheduler:
    """pimm's ``WeightDecayScheduler``: weight decay on a cosine from ``base_value`` to ``final_value``.

    Before global step ``s`` the decay is pimm's cosine at index ``s - 1``
    over ``max_steps * warmup_ratio`` steps (pimm's ``cfg.scheduler.total_steps
    * warmup_ratio``), then ``final_value``; it is set on every param group
    not excluded by ``WeightDecayExclusion`` (``apply_wd``).

    Emits:
        ``SetWeightDecay(step, value)`` before every step (each rank).

    >>> weight_decay_scheduler()
    weight_decay_scheduler(0.04, 0.2, warmup_ratio=1.0)
    """
    return _WeightDecayScheduler(base_value, final_value, warmup_ratio)


def excluded_from_weight_decay(name: str, param, *, bias=True, norm=True, gamma=True, token=True, ndim_1=True) -> bool:
    """pimm's rule: a ``.bias``, a name holding ``norm``/``gamma``/``token`` (any case), or a 1-D parameter."""
    lowered = name.lower()
    return (
        (bias and name.endswith(".bias"))
        or (norm and "norm" in lowered)
        or (gamma and "gamma" in lowered)
        or (token and "token" in lowered)
        or (ndim_1 and param.ndim == 1)
    )


_Optimizer = TypeVar("_Optimizer", bound=torch.optim.Optimizer)


def split_weight_decay(
    model: torch.nn.Module,
    optimizer: _Optimizer,
    *,
    bias: bool = True,
    norm: bool = True,
    gamma: bool = True,
    token: bool = True,
    ndim_1: bool = True,
) -> _Optimizer:
    """Split each param group into a decayed (``apply_wd=True``) and an undecayed (``weight_decay=0``) group.

    pimm's ``WeightDecayExclusion`` split, done where the optimizer is built:
    before its scheduler (which keeps one entry per group) and before
    ``pf.loop`` loads a checkpoint's optimizer state (which needs the same
    groups). A group already split (holding ``apply_wd``) is left as it is,
    so calling it twice changes nothing. Returns ``optimizer``. The five
    exclusions, ``bias`` to ``ndim_1``, are those of ``WeightDecayExclusion``
    (``hook.flags`` of a built ``weight_decay_exclusion``).

    Args:
        model: the model (its names decide; unwrapped from DDP).
        optimizer: a torch optimizer over ``model``'s parameters.
        bias: exclude each ``.bias``.
        norm: exclude each parameter whose name holds ``norm`` (any case).
        gamma: exclude each parameter whose name holds ``gamma`` (any case).
        token: exclude each parameter whose name holds ``token`` (any case).
        ndim_1: exclude each 1-D parameter.
    """
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    rules = dict(bias=bias, norm=norm, gamma=gamma, token=token, ndim_1=ndim_1)
    groups = []
    for group in optimizer.param_groups:
        if "apply_wd" in group:
            groups.append(group)
            continue
        keep: list[tuple[torch.Tensor, str | None]] = []  # (parameter, its name in the group, if named)
        drop: list[tuple[torch.Tensor, str | None]] = []
        labels = group.get("param_names") or [None] * len(group["params"])  # torch's named groups keep names in step
        for p, label in zip(group["params"], labels):
            name = names.get(id(p))
            (drop if name and excluded_from_weight_decay(name, p, **rules) else keep).append((p, label))
        for part, extra in ((keep, {"apply_wd": True}), (drop, {"weight_decay": 0.0, "apply_wd": False})):
            if part:
                named = {"param_names": [label for _, label in part]} if "param_names" in group else {}
                groups.append({**group, "params": [p for p, _ in part], **named, **extra})
    optimizer.param_groups = []
    for group in groups:
        optimizer.add_param_group(group)
    return optimizer


def exclude_weight_decay(effect: ExcludeWeightDecay, state, ctx) -> tuple:
    """Refuse to train when the optimizer is not split as ``WeightDecayExclusion`` asks (see ``split_weight_decay``)."""
    rules = dict(bias=effect.bias, norm=effect.norm, gamma=effect.gamma, token=effect.token, ndim_1=effect.ndim_1)
    names = {id(p): n for n, p in unwrap(ctx.model).named_parameters()}
    fix = (
        f"call pimm_fn.compat.split_weight_decay(model, optimizer, **{rules!r}) after building the optimizer, "
        f"before its scheduler and pf.loop"
    )
    for optimizer in ctx.named_optimizers().values():
        for i, group in enumerate(optimizer.param_groups):
            if "apply_wd" not in group:
                raise ValueError(
                    f"WeightDecayExclusion: param group {i} is not split into decayed and undecayed parameters: {fix}"
                )
            for p in group["params"]:
                name = names.get(id(p))
                if name and excluded_from_weight_decay(name, p, **rules) == group["apply_wd"]:
                    raise ValueError(
                        f"WeightDecayExclusion: {name!r} is in a group with apply_wd={group['apply_wd']}, "
                        f"against the hook's rules {rules}: {fix}"
                    )
    return ()


def set_weight_decay(effect: SetWeightDecay, state, ctx) -> tuple:
    for optimizer in ctx.named_optimizers().values():
        for group in optimizer.param_groups:
            if group.get("apply_wd", True):
                group["weight_decay"] = effect.value
    return ()
