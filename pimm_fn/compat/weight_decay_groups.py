"""Weight decay on the optimizer's param groups, pimm's way: which parameters go undecayed, and the split.

``split_weight_decay`` is pimm's ``WeightDecayExclusion`` split, called
where the optimizer is built; the handlers of ``ExcludeWeightDecay`` (it
checks the split was made) and ``SetWeightDecay`` (the scheduled decay on
every decayed group) carry out what ``pimm_fn.compat.weight_decay`` asks.
"""

from pimm_fn.compat.effects import ExcludeWeightDecay, SetWeightDecay
from pimm_fn.runtime.context import unwrap

__all__ = ["split_weight_decay", "excluded_from_weight_decay", "exclude_weight_decay", "set_weight_decay"]


def excluded_from_weight_decay(name: str, param, *, bias=True, norm=True, gamma=True, token=True, ndim_1=True) -> bool:
    """pimm's rule: a ``.bias``, a name holding ``norm``/``gamma``/``token`` (any case), or a 1-D parameter."""
    lowered = name.lower()
    return ((bias and name.endswith(".bias")) or (norm and "norm" in lowered) or (gamma and "gamma" in lowered)
            or (token and "token" in lowered) or (ndim_1 and param.ndim == 1))


def split_weight_decay(model, optimizer, *, bias=True, norm=True, gamma=True, token=True, ndim_1=True):
    """Split each param group into a decayed (``apply_wd=True``) and an undecayed (``weight_decay=0``) group.

    pimm's ``WeightDecayExclusion`` split, done where the optimizer is built:
    before its scheduler (which keeps one entry per group) and before
    ``pf.loop`` loads a checkpoint's optimizer state (which needs the same
    groups). A group already split (holding ``apply_wd``) is left as it is,
    so calling it twice changes nothing. Returns ``optimizer``.

    Args:
        model: the model (its names decide; unwrapped from DDP).
        optimizer: a torch optimizer over ``model``'s parameters.
        bias, norm, gamma, token, ndim_1: the exclusions of ``WeightDecayExclusion``
            (``hook.flags`` of a built ``weight_decay_exclusion``).
    """
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    rules = dict(bias=bias, norm=norm, gamma=gamma, token=token, ndim_1=ndim_1)
    groups = []
    for group in optimizer.param_groups:
        if "apply_wd" in group:
            groups.append(group)
            continue
        keep, drop = [], []
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
    fix = (f"call pimm_fn.compat.split_weight_decay(model, optimizer, **{rules!r}) after building the optimizer, "
           f"before its scheduler and pf.loop")
    for optimizer in ctx.named_optimizers().values():
        for i, group in enumerate(optimizer.param_groups):
            if "apply_wd" not in group:
                raise ValueError(f"WeightDecayExclusion: param group {i} is not split into decayed and undecayed "
                                 f"parameters: {fix}")
            for p in group["params"]:
                name = names.get(id(p))
                if name and excluded_from_weight_decay(name, p, **rules) == group["apply_wd"]:
                    raise ValueError(f"WeightDecayExclusion: {name!r} is in a group with apply_wd={group['apply_wd']}, "
                                     f"against the hook's rules {rules}: {fix}")
    return ()


def set_weight_decay(effect: SetWeightDecay, state, ctx) -> tuple:
    for optimizer in ctx.named_optimizers().values():
        for group in optimizer.param_groups:
            if group.get("apply_wd", True):
                group["weight_decay"] = effect.value
    return ()
