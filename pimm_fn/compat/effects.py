"""The requests pimm's hooks make in pimm_fn: frozen values, carried out by ``pimm_fn.compat.HANDLERS``.

pimm's hooks act on the trainer themselves (load weights, rewrite the
optimizer's groups, wrap modules, log gradient norms). In pimm_fn the hook
decides (a pure function of the state) and asks for the work with one of
these effects; the handler of the same name in ``pimm_fn.compat.handlers``
(the weight decay ones: ``pimm_fn.compat.weight_decay``) does it. Pass them to the loop::

    pf.loop(model, optimizer, data, hooks=build_hooks(cfg["hooks"]), handlers=compat.HANDLERS, ...)

Without them a run stops at the first such effect with a
``MissingHandlerError`` naming it.

>>> SetWeightDecay(7, 0.05)
SetWeightDecay(step=7, value=0.05)
>>> SetWeightDecay.scope
Scope.LOCAL
"""

from typing import ClassVar

import attrs

from pimm_fn.core.effects import Effect, LoadWeights, Scope

__all__ = [
    "PIMM",
    "LoadPimmWeights",
    "ExcludeWeightDecay",
    "SetWeightDecay",
    "LogGradientNorm",
    "CountParameters",
    "AnnealAttention",
    "OverrideDtype",
    "CollectGarbage",
    "TimeStep",
    "FinalTest",
    "LogResources",
    "StartProfiler",
    "StopProfiler",
    "PushToHub",
]


PIMM = "pimm"  # the dialect of pimm's warm starts: LoadWeights(..., dialect=PIMM)


def LoadPimmWeights(path: str, rules: tuple = (), strict: bool = False) -> LoadWeights:  # noqa: N802 - an effect's name
    """pimm's ``CheckpointLoader`` request: pimm_fn's one warm-start effect, ``LoadWeights``, in pimm's dialect.

    ``rules`` is ``((keyword, replacement), ...)``, read as pimm reads them
    (``pimm_fn.compat.warm_start.pimm_rules``); the weights are found as pimm
    finds them. Carried out by ``HANDLERS``' ``LoadWeights`` handler, each rank its replica.

    >>> LoadPimmWeights("w.pth", (("backbone", "encoder"),))
    LoadWeights(path='w.pth', replacements=(('backbone', 'encoder'),), strict=False, dialect='pimm')
    """
    return LoadWeights(path, tuple(rules), strict, PIMM)


@attrs.frozen
class ExcludeWeightDecay(Effect):
    """Check that the optimizer's param groups are split as ``WeightDecayExclusion`` asks (each rank its own).

    The split itself is ``pimm_fn.compat.split_weight_decay``, done before the
    scheduler is built and the optimizer state is loaded.
    """

    scope: ClassVar[Scope] = Scope.LOCAL
    bias: bool = True
    norm: bool = True
    gamma: bool = True
    token: bool = True
    ndim_1: bool = True


@attrs.frozen
class SetWeightDecay(Effect):
    """Set ``weight_decay`` to ``value`` on every group not excluded (``apply_wd``), before step ``step``."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    value: float


@attrs.frozen
class LogGradientNorm(Effect):
    """Log the norm of the gradients of step ``step`` (after clipping) as ``<prefix>/total``."""

    scope: ClassVar[Scope] = Scope.MAIN
    step: int
    norm_type: float = 2.0
    per_layer: bool = False
    prefix: str = "grad_norm"


@attrs.frozen
class CountParameters(Effect):
    """Log the model's parameter counts (total, trainable, by module)."""

    scope: ClassVar[Scope] = Scope.MAIN
    show_details: bool = True
    show_gradients: bool = True
    sort_by_params: bool = True
    min_params: int = 0


@attrs.frozen
class AnnealAttention(Effect):
    """Tell the model the global step (``model.update_anneal_step(step)``); log the mean factor when ``log``."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    log: bool = False
    per_layer: bool = False
    prefix: str = "anneal"


@attrs.frozen
class OverrideDtype(Effect):
    """Run the matched modules' methods in ``dtype`` (their outputs cast back); optionally cast their parameters."""

    scope: ClassVar[Scope] = Scope.LOCAL
    patterns: tuple = ()
    class_patterns: tuple = ()
    dtype: str = "float32"
    methods: tuple = ("forward",)
    override_parameters: bool = False
    verbose: bool = False


@attrs.frozen
class CollectGarbage(Effect):
    """Run the garbage collector at ``step`` (``collect``), then empty the CUDA cache (``empty_cache``).

    ``automatic`` ``False`` turns Python's automatic collection off first,
    ``True`` turns it back on after; ``None`` leaves it as it is.
    """

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    collect: bool = True
    empty_cache: bool = False
    automatic: bool | None = None


@attrs.frozen
class TimeStep(Effect):
    """Time global step ``step`` (the wall clock since the previous one); ``report`` logs the epoch's timing and ETA."""

    scope: ClassVar[Scope] = Scope.MAIN
    step: int
    steps_left: int
    warmup: bool = False
    report: bool = False


@attrs.frozen
class FinalTest(Effect):
    """After training: run the tester named ``tester`` on ``model_best`` (or the last weights with ``test_last``)."""

    scope: ClassVar[Scope] = Scope.COLLECTIVE
    step: int
    tester: str
    test_last: bool = False


@attrs.frozen
class LogResources(Effect):
    """Measure this process's (or the machine's) CPU, memory and CUDA memory; log them as ``<prefix>/<name>``."""

    scope: ClassVar[Scope] = Scope.MAIN
    step: int
    prefix: str = "resources"
    per_gpu: bool = False
    cpu: bool = True
    memory: bool = True
    per_process: bool = True


@attrs.frozen
class StartProfiler(Effect):
    """Start ``torch.profiler`` (CPU, plus CUDA when available) over the steps after ``step``; each rank its own."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    memory: bool = True


@attrs.frozen
class StopProfiler(Effect):
    """Stop the profiler ``StartProfiler`` started; write its trace and table into ``save_dir/profiler``."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    sort_by: str = "cuda_time_total"
    row_limit: int = 30


@attrs.frozen
class PushToHub(Effect):
    """Stage the ``checkpoint`` weights (``model_best`` or ``last``) in ``save_dir/hub``; upload it to ``repo_id``."""

    scope: ClassVar[Scope] = Scope.MAIN
    step: int
    repo_id: str
    checkpoint: str = "model_best"
    private: bool = True
    revision: str | None = None
    name: str | None = None
