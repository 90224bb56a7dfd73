"""The built-in factories of ``DEFAULT_REGISTRY``: one per pimm hook type, with pimm's keywords and defaults.

Each takes exactly the keywords of pimm's class (``PIMM.md`` 2, 4), with
its defaults, and builds the pimm_fn hook of ``pimm_fn.compat.build``'s
table; a factory taking ``context`` reads ``build_hooks``' ``weight``,
``evaluate`` and ``tester``. ``REFUSED`` holds the types with no place in a
functional loop, each with the reason and what to do instead; their
factories raise it.
"""

import inspect
from collections.abc import Mapping

from pimm_fn.compat.evaluators import EVALUATOR_DEFAULTS, final_evaluator, pimm_evaluator
from pimm_fn.compat.logs import information_writer, iteration_timer, wandb_namer
from pimm_fn.compat.model_hooks import (
    attention_mask_annealing,
    dtype_overrider,
    garbage_handler,
    gradient_norm_logger,
    parameter_counter,
    pimm_model_hook,
)
from pimm_fn.compat.monitors import push_to_hub, resource_utilization_logger, runtime_profiler
from pimm_fn.compat.saving import checkpoint_saver, checkpoint_saver_iteration
from pimm_fn.compat.warm_start import checkpoint_loader
from pimm_fn.compat.weight_decay import weight_decay_exclusion, weight_decay_scheduler
from pimm_fn.core.validate import int_at_least

__all__ = ["BUILTINS", "REFUSED", "CONTEXT"]

# The parameter through which a factory receives build_hooks' context; never a config keyword.
CONTEXT = "context"


# -- the built-in factories: pimm's keyword names and defaults ---------------------------------------------------
def _evaluating(context) -> bool:
    return context.get("evaluate") is not False


def _checkpoint_saver(save_freq=None, evaluator_every_n_steps=None, *, context):
    return checkpoint_saver(save_freq, evaluator_every_n_steps, evaluate=_evaluating(context))


def _checkpoint_saver_iteration(save_freq=None, save_iter_checkpoints=False, backend=None):
    return checkpoint_saver_iteration(save_freq, save_iter_checkpoints, backend)


def _checkpoint_loader(keywords="", replacement=None, replacements=None, strict=False, *, context):
    return checkpoint_loader(
        context.get("weight"), keywords=keywords, replacement=replacement, replacements=replacements, strict=strict
    )


def _information_writer(log_frequency=1, step_offset=0):
    return information_writer(log_frequency, step_offset)


def _iteration_timer(warmup_iter=1):
    return iteration_timer(warmup_iter)


def _evaluator(type_name):
    defaults = EVALUATOR_DEFAULTS[type_name]

    def factory(*, context, **options):
        every = options.pop("every_n_steps", defaults["every_n_steps"])
        if not _evaluating(context):
            return pimm_evaluator(type_name, None, every_n_steps=every, evaluate=False, **options)
        fn = context.get("evaluate")
        fn = fn.get(type_name) if isinstance(fn, Mapping) else fn
        if not callable(fn):
            raise ValueError(
                f"needs the evaluation to run: pass build_hooks(..., evaluate=fn) or evaluate={{{type_name!r}: fn}}, "
                f"where fn(model) returns {{metric: value}} (pimm computes them from its val loader; here fn does), "
                f"or evaluate=False (pimm's cfg.evaluate=False)"
            )
        return pimm_evaluator(type_name, fn, every_n_steps=every, **options)

    params = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in defaults.items()]
    params.append(inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY))
    factory.__signature__ = inspect.Signature(params)
    factory.__name__ = factory.__qualname__ = f"_{type_name}"
    return factory


def _final_evaluator(test_last=False, *, context):
    if not _evaluating(context):
        return final_evaluator(None, test_last=test_last, evaluate=False)
    tester = context.get("tester")
    if not callable(tester):
        raise ValueError(
            "needs the test to run after training: pass build_hooks(..., tester=fn), where fn(model) runs pimm's "
            "cfg.test tester on the model it is given and returns {metric: value} or None, or evaluate=False"
        )
    return final_evaluator(tester, test_last=test_last)


def _wandb_namer(keys=(), sep="-", format_numbers=True, extra=None):
    return wandb_namer(keys, sep, format_numbers, extra)


def _weight_decay_exclusion(
    exclude_bias_from_wd=True,
    exclude_norm_from_wd=True,
    exclude_gamma_from_wd=True,
    exclude_token_from_wd=True,
    exclude_ndim_1_from_wd=True,
):
    return weight_decay_exclusion(
        exclude_bias_from_wd, exclude_norm_from_wd, exclude_gamma_from_wd, exclude_token_from_wd, exclude_ndim_1_from_wd
    )


def _weight_decay_scheduler(base_value=0.04, final_value=0.2, warmup_ratio=1.0):
    return weight_decay_scheduler(base_value, final_value, warmup_ratio)


def _gradient_norm_logger(norm_type=2.0, log_per_layer=False, log_frequency=1, prefix="grad_norm"):
    return gradient_norm_logger(norm_type, log_per_layer, log_frequency, prefix)


def _parameter_counter(show_details=True, show_gradients=True, sort_by_params=True, min_params=0):
    return parameter_counter(show_details, show_gradients, sort_by_params, min_params)


def _attention_mask_annealing(log_frequency=100, log_per_layer=False, prefix="anneal"):
    return attention_mask_annealing(log_frequency, log_per_layer, prefix)


def _dtype_overrider(
    patterns=None,
    class_patterns=None,
    dtype="float32",
    methods_to_override=None,
    override_parameters=False,
    verbose=False,
    check_interval=10,
):
    int_at_least(1).check(check_interval, "check_interval", owner="DtypeOverrider")  # accepted; unused, as in pimm
    return dtype_overrider(patterns, class_patterns, dtype, methods_to_override, override_parameters, verbose)


def _garbage_handler(interval=150, disable_auto=True, empty_cache=False):
    return garbage_handler(interval, disable_auto, empty_cache)


def _resource_utilization_logger(
    log_frequency=10, prefix="resources", log_per_gpu=False, log_cpu=True, log_system_memory=True, per_process=True
):
    return resource_utilization_logger(log_frequency, prefix, log_per_gpu, log_cpu, log_system_memory, per_process)


def _runtime_profiler(
    forward=True, backward=True, interrupt=False, warm_up=2, sort_by="cuda_time_total", row_limit=30, memory=True
):
    return runtime_profiler(forward, backward, interrupt, warm_up, sort_by, row_limit, memory)


def _push_to_hub(
    repo_id,
    checkpoint="model_best",
    weights_only=True,
    private=True,
    token=None,
    revision=None,
    name=None,
    on_train_end=True,
    on_best=False,
    every_n_epochs=None,
    every_n_steps=None,
    background=True,
    squash_history=True,
    squash_every_n_pushes=None,
):
    # Accepted as pimm's and without effect here: weights_only (only weights are uploaded), background (the one
    # upload after training blocks), squash_history / squash_every_n_pushes (one commit per run).
    if token is not None:
        raise ValueError(
            "'token' in a config ends up in checkpoints and logs: drop it and log in with "
            "`huggingface-cli login` or set HF_TOKEN"
        )
    if on_best or every_n_epochs is not None or every_n_steps is not None:
        raise ValueError(
            f"pushes during training (on_best={on_best!r}, every_n_epochs={every_n_epochs!r}, "
            f"every_n_steps={every_n_steps!r}) are not supported: the weights are pushed once, after "
            f"training (on_train_end=True)"
        )
    if not on_train_end:
        raise ValueError("on_train_end=False pushes nothing: drop the hook instead")
    return push_to_hub(repo_id, "last" if checkpoint in ("last", "model_last") else checkpoint, private, revision, name)


def _model_hook():
    return pimm_model_hook()


# -- types with no pimm_fn counterpart: each refusal says why and what to do -------------------------------------
REFUSED = {
    "SimulateCrash": (
        "it kills the process (os._exit(137) at PIMM_SIMULATE_CRASH_STEP) to rehearse a crash, which no hook may do. "
        "Drop it: a pimm_fn run continues exactly after an exception (run.run() again) and after a kill "
        "(loop(resume='auto')); kill a real run to rehearse it"
    ),
    "PrototypeUsageLogger": (
        "it all-reduces inside forward hooks on the model's Sonata heads, which hangs when ranks' forwards differ "
        "(PIMM.md 6.4). Compute the prototype statistics in the model's forward and return them as outputs: "
        "InformationWriter logs every scalar output"
    ),
    "FeatureStdMonitor": (
        "it all-reduces inside forward hooks on the model's Sonata heads, which hangs when ranks' forwards differ "
        "(PIMM.md 6.4). Compute the feature statistics in the model's forward and return them as outputs: "
        "InformationWriter logs every scalar output"
    ),
    "LogitEntropyLogger": (
        "it reads the logits tensor from the model's outputs, which pimm_fn reduces to scalars before any hook sees "
        "them. Return the entropy (and the temperature) from the model as outputs: InformationWriter logs them"
    ),
    "PreciseEvaluator": (
        "pimm does not register it (a config naming it fails in pimm as well). "
        "Use FinalEvaluator, which tests model_best (or the last weights) after training"
    ),
    "OnlineLinearProbe": "pimm never registers it (its module is not imported), so a config naming it fails in pimm too",
    "EventLinearProbeEvaluator": (
        "pimm never registers it (its module is not imported), so a config naming it fails in pimm too"
    ),
}


def _refusal(type_name):
    def refuse(**options):
        raise ValueError(f"not supported: {REFUSED[type_name]}")

    refuse.__name__ = refuse.__qualname__ = f"_refuse_{type_name}"
    refuse.refused = True
    return refuse


BUILTINS = {
    "CheckpointLoader": _checkpoint_loader,
    "CheckpointSaver": _checkpoint_saver,
    "CheckpointSaverIteration": _checkpoint_saver_iteration,
    "InformationWriter": _information_writer,
    "IterationTimer": _iteration_timer,
    **{name: _evaluator(name) for name in EVALUATOR_DEFAULTS},
    "FinalEvaluator": _final_evaluator,
    "ModelHook": _model_hook,
    "WandbNamer": _wandb_namer,
    "WeightDecayExclusion": _weight_decay_exclusion,
    "WeightDecayScheduler": _weight_decay_scheduler,
    "GradientNormLogger": _gradient_norm_logger,
    "ParameterCounter": _parameter_counter,
    "AttentionMaskAnnealingHook": _attention_mask_annealing,
    "DtypeOverrider": _dtype_overrider,
    "GarbageHandler": _garbage_handler,
    "ResourceUtilizationLogger": _resource_utilization_logger,
    "RuntimeProfiler": _runtime_profiler,
    "PushToHub": _push_to_hub,
    **{name: _refusal(name) for name in REFUSED},
}
