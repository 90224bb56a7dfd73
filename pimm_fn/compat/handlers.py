"""The handlers of ``pimm_fn.compat.effects``: with ``compat.checkpoints``, the compat code that touches the model.

``HANDLERS`` maps each compat effect to its handler; pass it to the loop::

    pf.loop(..., hooks=build_hooks(cfg["hooks"], ...), handlers=pimm_fn.compat.HANDLERS)

Its ``LoadWeights`` handler is ``PIMM_CHECKPOINTS`` (``pimm_fn.compat.checkpoints``):
pimm's warm starts, and the reader through which ``loop(resume=...)`` resumes pimm's layouts.

Records go through pimm_fn's ``Log`` handler (the console and ``log.jsonl``).
The weight decay handlers, with ``split_weight_decay`` (the one helper called
outside the loop), are in ``pimm_fn.compat.weight_decay``.
"""

import copy
import gc
import re
import time

import torch

from pimm_fn import checkpoint, dist
from pimm_fn.compat import monitors
from pimm_fn.compat.checkpoints import PIMM_CHECKPOINTS
from pimm_fn.compat.effects import (
    AnnealAttention,
    CollectGarbage,
    CountParameters,
    ExcludeWeightDecay,
    FinalTest,
    LogGradientNorm,
    OverrideDtype,
    SetWeightDecay,
    TimeStep,
)
from pimm_fn.compat.weight_decay import exclude_weight_decay, set_weight_decay
from pimm_fn.core.effects import LoadWeights, Log, named
from pimm_fn.core.events import MetricsPublished
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.handlers import dispatch as runtime_handlers
from pimm_fn.runtime.handlers.evaluation import eval_mode

__all__ = ["HANDLERS"]


def _log(state, ctx, step: int, kind: str, values: dict) -> None:
    runtime_handlers.log(Log(step, kind, values), state, ctx)


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
            values.update(
                {
                    f"{effect.prefix}/layers/{n.replace('.', '_')}": float(torch.norm(g.detach(), effect.norm_type))
                    for n, g in named
                }
            )
    else:
        values[f"{effect.prefix}/total"] = 0.0
    _log(state, ctx, effect.step, "grad_norm", values)
    return ()


def count_parameters(effect: CountParameters, state, ctx) -> tuple:
    module = unwrap(ctx.model)
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    step = state.progress.global_step
    _log(
        state,
        ctx,
        step,
        "parameters",
        {
            "total": total,
            "trainable": trainable,
            "non_trainable": total - trainable,
            "memory_mb": round(total * 4 / 2**20, 2),
        },
    )
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


_DTYPES = {
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
}


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
                re.search(p, type(child).__name__) for p in effect.class_patterns
            ):
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
            _log(
                state,
                ctx,
                effect.step,
                "timing",
                {"batch_time": average, "steps_left": effect.steps_left, "remain": remain},
            )
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
    values = (
        None
        if result is None
        else named(
            {k: float(v) for k, v in dict(result).items()}, f"tester {effect.tester!r} returned metric", effect.tester
        )
    )
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
    **monitors.HANDLERS,  # LogResources, StartProfiler/StopProfiler, PushToHub
}
