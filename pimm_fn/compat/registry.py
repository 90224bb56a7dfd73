"""pimm hook configs (``dict(type="CheckpointSaver", save_freq=5)``) as pimm_fn hooks.

A ``HookRegistry`` is an immutable mapping from pimm type names to hook
factories whose keywords and defaults are pimm's; ``build_hooks``
(``pimm_fn.compat.build``) looks each config up in one. Nothing is
registered behind your back: extend a registry with ``add`` and pass it as
``registry=``.

Built-in types (``DEFAULT_REGISTRY``; every type pimm's configs use):

=================================  ================================================
pimm config                        pimm_fn hook
=================================  ================================================
``CheckpointSaver``                ``checkpoint_saver(save_freq, evaluator_every_n_steps)``
``CheckpointSaverIteration``       ``checkpoint_saver_iteration(save_freq, save_iter_checkpoints, backend)``
``CheckpointLoader``               ``checkpoint_loader(weight, keywords/replacement/replacements, strict)``
``InformationWriter``              ``information_writer(log_frequency, step_offset)``
``IterationTimer``                 ``iteration_timer(warmup_iter)``
``SemSegEvaluator``,               ``pimm_evaluator(type, fn, every_n_steps, **options)``
``InstanceSegmentationEvaluator``,
``MAEEvaluator``,
``PretrainEvaluator``
``FinalEvaluator``                 ``final_evaluator(tester, test_last)``
``ModelHook``                      ``pimm_model_hook()``
``WandbNamer``                     ``wandb_namer(keys, sep, format_numbers, extra)``
``WeightDecayExclusion``           ``weight_decay_exclusion(...)`` (+ ``split_weight_decay``)
``WeightDecayScheduler``           ``weight_decay_scheduler(base_value, final_value, warmup_ratio)``
``GradientNormLogger``             ``gradient_norm_logger(norm_type, log_per_layer, log_frequency, prefix)``
``ParameterCounter``               ``parameter_counter(...)``
``AttentionMaskAnnealingHook``     ``attention_mask_annealing(log_frequency, log_per_layer, prefix)``
``DtypeOverrider``                 ``dtype_overrider(...)``
``GarbageHandler``                 ``garbage_handler(interval, disable_auto, empty_cache)``
``ResourceUtilizationLogger``      ``resource_utilization_logger(log_frequency, prefix, ...)``
``RuntimeProfiler``                ``runtime_profiler(..., warm_up, sort_by, row_limit, memory)``
``PushToHub``                      ``push_to_hub(repo_id, checkpoint, private, revision, name)`` (``hub`` extra)
``SimulateCrash``, ``PrototypeUsageLogger``,                         refused: the error says why and what
``FeatureStdMonitor``, ``LogitEntropyLogger``,                       to do instead
``PreciseEvaluator``, ``OnlineLinearProbe``,
``EventLinearProbeEvaluator``
=================================  ================================================

Hooks whose work needs the model, the optimizer or a clock emit the effects
of ``pimm_fn.compat.effects``: run them with ``loop(handlers=pimm_fn.compat.HANDLERS)``.
"""

from collections.abc import Mapping

import attrs

from pimm_fn.compat.type_factories import BUILTINS
from pimm_fn.core.frozen import FrozenMap, freeze

__all__ = ["HookRegistry", "DEFAULT_REGISTRY", "register_hook"]

# -- the registry --------------------------------------------------------------------------------------------------
def _check_factory(name, factory):
    if not isinstance(name, str) or not name:
        raise TypeError(f"a hook type name must be a non-empty str (got {name!r})")
    if not callable(factory):
        raise TypeError(f"the factory registered as {name!r} must be callable (got {factory!r})")


@attrs.frozen(repr=False)
class HookRegistry(Mapping):
    """An immutable mapping of pimm hook type names to hook factories.

    A factory is called with the config's keywords (everything but
    ``type``) and returns a pimm_fn hook. One that declares a keyword-only
    ``context`` parameter also receives ``build_hooks``' context (``weight``,
    ``evaluate``, ``tester`` and the entries of its ``context=``) as a
    read-only mapping.

    >>> from pimm_fn.hooks import save_every
    >>> registry = HookRegistry({"Every": save_every})
    >>> registry.add(save_every, name="Again")
    HookRegistry(['Every', 'Again'])
    """

    _factories: FrozenMap = attrs.field(converter=freeze, alias="factories", default=FrozenMap())

    def __attrs_post_init__(self):
        for name, factory in self._factories.items():
            _check_factory(name, factory)

    def __getitem__(self, name):
        return self._factories[name]

    def __iter__(self):
        return iter(self._factories)

    def __len__(self):
        return len(self._factories)

    def add(self, factory, *, name: str | None = None, replace: bool = False) -> "HookRegistry":
        """A new registry with ``factory`` under ``name`` (default: its ``register_hook`` name).

        Raises:
            ValueError: ``name`` is taken and ``replace`` is False, or no name is known.
        """
        name = name if name is not None else getattr(factory, "pimm_type", None)
        if name is None:
            raise ValueError(
                f"no hook type name for {factory!r}: decorate it with @register_hook('Name') or pass name='Name'"
            )
        _check_factory(name, factory)
        if name in self._factories and not replace:
            raise ValueError(f"hook type {name!r} is already registered: pass replace=True to override it")
        return HookRegistry(self._factories.set(name, factory))

    def __repr__(self):
        return f"HookRegistry({list(self._factories)!r})"


DEFAULT_REGISTRY = HookRegistry(BUILTINS)


def register_hook(name: str):
    """Mark a factory with the pimm type name it builds; returns it unchanged.

    Registration is explicit: add the marked factory to a registry and pass
    that registry to ``build_hooks``. No global registry changes.

    >>> from pimm_fn.hooks import log_every
    >>> @register_hook("ConsoleWriter")
    ... def console_writer(every=10):
    ...     return log_every(every)
    >>> registry = DEFAULT_REGISTRY.add(console_writer)
    >>> from pimm_fn.compat.build import build_hooks
    >>> build_hooks([dict(type="ConsoleWriter", every=5)], registry=registry)
    [log_every(5)]
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_hook: 'name' must be a non-empty str (got {name!r})")

    def mark(factory):
        _check_factory(name, factory)
        factory.pimm_type = name
        return factory

    return mark
