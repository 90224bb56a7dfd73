"""The handlers of ``pimm_fn.compat.effects``: with ``compat.checkpoints``, the compat code that touches the model.

``HANDLERS`` maps each compat effect to its handler; pass it to the loop::

    pf.loop(..., hooks=build_hooks(cfg["hooks"], ...), handlers=pimm_fn.compat.HANDLERS)

Its ``LoadWeights`` handler is ``PIMM_CHECKPOINTS`` (``pimm_fn.compat.checkpoints``):
pimm's warm starts, and the reader through which ``loop(resume=...)`` resumes pimm's layouts.

Records go through pimm_fn's ``Log`` handler (the console and ``log.jsonl``).
``split_weight_decay`` is the one helper called outside the loop: pimm's
``WeightDecayExclusion`` split, applied where the optimizer is built.
"""

import copy
import gc
import re
import time

import torch

from pimm_fn import checkpoint
from pimm_fn import dist
from pimm_fn.compat import _monitoring
from pimm_fn.compat.checkpoints import PIMM_CHECKPOINTS
from pimm_fn.compat.effects import (
    AnnealAttention, CollectGarbage, CountParameters, ExcludeWeightDecay, FinalTest, LogGradientNorm,
    OverrideDtype, SetWeightDecay, TimeStep,
)
from pimm_fn.core.effects import LoadWeights, Log
from pimm_fn.core.events import MetricsPublished
from pimm_fn.core.records import named
from pimm_fn.runtime import handlers as runtime_handlers
from pimm_fn.runtime.context import unwrap
from pimm_fn.runtime.evaluation import eval_mode

__all__ = ["HANDLERS", "split_weight_decay", "excluded_from_weight_decay"]


def _log(state, ctx, step: int, kind: str, values: dict) -> None:
    runtime_handlers.log(Log(step, kind, values), state, ctx)


# -- WeightDecayExclusion / WeightDecayScheduler ---------------------------------------------------------------------
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


# -- diagnostics ---------------------------------------------------------------------------------------------------
def log_gradient_norm(effect: LogGradientNorm, state, ctx) -> tuple:
    """The norm of the gradients the step left (pimm's formula), and per parameter with ``per_layer``."""
    named = [(n, p.grad) for n, p in unwrap(ctx.model).named_parameters() if p.grad is not None]
    values = {}
    if named:
        grads = [g.detach() for _, g in named]
        if effect.norm_type == float("inf"):
            total = max(g.abs().max() for g in grads)
        else:
            total = torch.norm(torch.stack([torch.norm(g, effect.norm_type) for g in grads]), effect.norm_type)
        values[f"{effect.prefix}/total"] = float(total)
        if effect.per_layer:
            values.update({f"{effect.prefix}/layers/{n.replace('.', '_')}": float(torch.norm(g.detach(), effect.norm_type))
                           for n, g in named})
    else:
        values[f"{effect.prefix}/total"] = 0.0
    _log(state, ctx, effect.step, "grad_norm", values)
    return ()


def count_parameters(effect: CountParameters, state, ctx) -> tuple:
    module = unwrap(ctx.model)
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    step = state.progress.global_step
    _log(state, ctx, step, "parameters", {"total": total, "trainable": trainable, "non_trainable": total - trainable,
                                          "memory_mb": round(total * 4 / 2**20, 2)})
    if effect.show_details:
        rows = []
        for name, child in module.named_modules():
            if not name:
                continue
            count = sum(p.numel() for p in child.parameters())
            if count >= effect.min_params:
                row = {"module": name, "params": count}
                if effect.show_gradients:
                    row["trainable"] = sum(p.numel() for p in child.parameters() if p.requires_grad)
                rows.append(row)
        if effect.sort_by_params:
            rows.sort(key=lambda r: -r["params"])
        for row in rows:
            _log(state, ctx, step, "parameters/module", row)
    return ()


def anneal_attention(effect: AnnealAttention, state, ctx) -> tuple:
    model = unwrap(ctx.model)
    update = getattr(model, "update_anneal_step", None)
    if not callable(update):
        return ()  # pimm: "Model does not support attention mask annealing"
    update(effect.step)
    blocks = getattr(getattr(model, "decoder", None), "blocks", None)
    if not effect.log or not blocks:
        return ()
    factors = [float(b.get_anneal_factor()) for b in blocks if hasattr(b, "get_anneal_factor")]
    if factors:
        values = {f"{effect.prefix}/average": sum(factors) / len(factors)}
        if effect.per_layer:
            values.update({f"{effect.prefix}/layer_{i}": f for i, f in enumerate(factors)})
        _log(state, ctx, effect.step, "anneal", values)
    return ()


_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "int8": torch.int8, "int16": torch.int16, "int32": torch.int32}


def _dtype_wrapper(method, dtype):
    def wrapped(*args, **kwargs):
        if not (args and isinstance(args[0], torch.Tensor)):
            return method(*args, **kwargs)
        original = args[0].dtype
        output = method(args[0].to(dtype), *args[1:], **kwargs)
        if isinstance(output, torch.Tensor):
            return output.to(original)
        if isinstance(output, (tuple, list)):
            return type(output)(x.to(original) if isinstance(x, torch.Tensor) else x for x in output)
        return output

    wrapped.pimm_fn_dtype = dtype  # wrapped once: a second BeforeTrain in this process leaves it
    return wrapped


def override_dtype(effect: OverrideDtype, state, ctx) -> tuple:
    dtype = _DTYPES[effect.dtype]
    done = []

    def visit(module, prefix):
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if any(re.search(p, full) for p in effect.patterns) or any(
                    re.search(p, type(child).__name__) for p in effect.class_patterns):
                for method_name in effect.methods:
                    method = getattr(child, method_name, None)
                    if callable(method) and getattr(method, "pimm_fn_dtype", None) is None:
                        setattr(child, method_name, _dtype_wrapper(method, dtype))
                        done.append(f"{full}.{method_name}")
                if effect.override_parameters:
                    for param in child.parameters(recurse=False):
                        if param.dtype != dtype:
                            param.data = param.data.to(dtype)
            visit(child, full)

    visit(unwrap(ctx.model), "")
    if effect.verbose:
        ctx.say(f"DtypeOverrider: {len(done)} method(s) run in {effect.dtype}: {', '.join(done[:12])}")
    return ()


def collect_garbage(effect: CollectGarbage, state, ctx) -> tuple:
    if effect.automatic is False:
        gc.disable()
    if effect.collect:
        gc.collect()
        if effect.empty_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()
    if effect.automatic is True:
        gc.enable()
    return ()


class StepTimer:
    """The ``TimeStep`` handler: wall-clock time between steps, averaged per epoch past its warm-up steps.

    Keeps, per run, the time of the last step and this epoch's sums; at a
    ``report`` step logs ``Log(step, "timing", {batch_time, steps_left,
    remain})`` (``remain`` as pimm prints it, ``hh:mm:ss``).
    """

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._runs: dict = {}  # id(ctx) -> [last time, sum, count]

    def __call__(self, effect: TimeStep, state, ctx) -> tuple:
        now = self.clock()
        last, total, count = self._runs.get(id(ctx), (None, 0.0, 0))
        if effect.warmup:
            total, count = 0.0, 0
        elif last is not None:
            total, count = total + (now - last), count + 1
        self._runs[id(ctx)] = (now, total, count)
        if effect.report and count:
            average = total / count
            seconds = int(effect.steps_left * average)
            remain = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
            _log(state, ctx, effect.step, "timing", {"batch_time": average, "steps_left": effect.steps_left,
                                                     "remain": remain})
        return ()


# -- FinalEvaluator --------------------------------------------------------------------------------------------------
def final_test(effect: FinalTest, state, ctx) -> tuple:
    """Test ``model_best`` (or the last weights) in a copy of the model; publish what the tester returns."""
    tester = ctx.evaluators.get(effect.tester)
    if tester is None:
        raise LookupError(f"no tester named {effect.tester!r} (known: {sorted(ctx.evaluators)})")
    model = unwrap(ctx.model)
    if not effect.test_last:
        path = ctx.model_dir / "model_best.pth"
        if not path.is_file():
            raise FileNotFoundError(
                f"FinalEvaluator(test_last=False) tests {path}, which this run never wrote (no evaluation improved "
                f"the tracked metric); pass test_last=True to test the last weights"
            )
        model = copy.deepcopy(model)  # the run keeps its last weights
        model.load_state_dict(checkpoint.load_weights_file(path), strict=True)
    with eval_mode(model), torch.inference_mode():
        result = tester(model)
    values = None if result is None else named({k: float(v) for k, v in dict(result).items()},
                                               f"tester {effect.tester!r} returned metric", effect.tester)
    values = dist.broadcast_object(values)
    return (MetricsPublished(values or {}, effect.tester, effect.step),)


HANDLERS = {
    LoadWeights: PIMM_CHECKPOINTS,  # pimm's warm starts (pimm_fn's own passed on), and resumes from pimm's layouts
    ExcludeWeightDecay: exclude_weight_decay,
    SetWeightDecay: set_weight_decay,
    LogGradientNorm: log_gradient_norm,
    CountParameters: count_parameters,
    AnnealAttention: anneal_attention,
    OverrideDtype: override_dtype,
    CollectGarbage: collect_garbage,
    TimeStep: StepTimer(),
    FinalTest: final_test,
    **_monitoring.HANDLERS,  # LogResources, StartProfiler/StopProfiler, PushToHub
}
