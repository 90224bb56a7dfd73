"""pimm hook configs built into pimm_fn hooks: the registry of pimm's types, overrides applied, each config's keywords checked.

``build_hooks`` applies pimm's overrides (``hooks_override``, then
``--options``; ``pimm_fn.compat.options``), looks each config up in a
``HookRegistry`` (``pimm_fn.compat.build``, the table of pimm's types),
checks its keywords against the factory's signature and calls it, so a
typo fails when the hook list is built, with a did-you-mean message; then
hands each saver the current metric of the evaluator before it, as pimm's
``comm_info`` does.

pimm hook configs (``dict(type="CheckpointSaver", save_freq=5)``) as pimm_fn hooks.

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

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from pimm_fn.compat.evaluators import _FinalEvaluator, _PimmEvaluator
from pimm_fn.compat.hookbase import adapt, is_pimm_hook
from pimm_fn.compat.options import override_hooks
from pimm_fn.compat.saving import _PimmSaver
from pimm_fn.compat.type_factories import BUILTINS, CONTEXT
from pimm_fn.core.frozen import FrozenMap, freeze
from pimm_fn.hooks.evaluation import Evaluator

__all__ = [
    "HookRegistry",
    "DEFAULT_REGISTRY",
    "register_hook",
    "build_hooks",
    "CONTEXT_KEYWORDS",
]


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

    def add(self, factory: Callable[..., Any], *, name: str | None = None, replace: bool = False) -> "HookRegistry":
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


_Factory = TypeVar("_Factory", bound=Callable[..., Any])


def register_hook(name: str) -> Callable[[_Factory], _Factory]:
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


# The keywords build_hooks passes to factories, besides context={...} for factories of your own.
CONTEXT_KEYWORDS = ("weight", "evaluate", "tester")


def _accepted(factory) -> tuple[tuple, bool]:
    """(config keywords ``factory`` accepts, whether it takes any keyword)."""
    params = inspect.signature(factory).parameters.values()
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != CONTEXT)
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def _suggest(word, choices) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f": did you mean {match[0]!r}?" if match else ""


def _build_one(where, config, registry, context):
    if not isinstance(config, Mapping):
        raise TypeError(
            f"build_hooks: {where} must be a dict with a 'type' key, a pimm_fn hook or a HookBase "
            f"(got {type(config).__name__}: {config!r:.80})"
        )
    options = dict(config)
    name = options.pop("type", None)
    if name is None:
        raise ValueError(f"build_hooks: {where} has no 'type' key (got {dict(config)!r:.80})")
    if name not in registry:
        raise ValueError(
            f"build_hooks: {where} has unknown type {name!r}{_suggest(str(name), registry)} "
            f"(known types: {sorted(registry)})"
        )
    factory = registry[name]
    accepted, any_keyword = _accepted(factory)
    for keyword in options:
        if keyword not in accepted and not any_keyword:
            accepts = f"accepts {list(accepted)}" if accepted else "accepts no keywords"
            raise TypeError(
                f"build_hooks: {where} {name} got unknown keyword {keyword!r}{_suggest(keyword, accepted)} "
                f"({name} {accepts})"
            )
    params = inspect.signature(factory).parameters
    missing = [
        n
        for n, p in params.items()
        if p.default is p.empty
        and n != CONTEXT
        and n not in options
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if missing:
        raise TypeError(f"build_hooks: {where} {name} needs keyword {missing[0]!r} (got {sorted(options)})")
    takes_context = CONTEXT in params
    try:
        return factory(**options, **({CONTEXT: context} if takes_context else {}))
    except (TypeError, ValueError) as error:
        raise type(error)(f"build_hooks: {where} {name}: {error}") from error


def _with_metrics(hooks: list) -> list:
    """Each pimm saver tracking the current metric of the evaluator before it (else the first after), as pimm's
    ``comm_info`` hands it over."""
    found = []
    for i, hook in enumerate(hooks):
        if isinstance(hook, _PimmSaver) and hook.metric is None:
            before = [h.metric for h in hooks[:i] if isinstance(h, _PimmEvaluator) and h.evaluate and h.metric]
            after = [h.metric for h in hooks[i + 1 :] if isinstance(h, _PimmEvaluator) and h.evaluate and h.metric]
            metric = before[-1] if before else after[0] if after else None
            if metric is not None:
                hook = attrs.evolve(hook, metric=metric[0], mode=metric[1])
        found.append(hook)
    final = [h for h in found if isinstance(h, _FinalEvaluator) and h.evaluate and not h.test_last]
    if final and not any(isinstance(h, _PimmSaver) and h.metric for h in found):
        raise ValueError(
            "build_hooks: FinalEvaluator(test_last=False) tests model_best.pth, which no hook of this list writes "
            "(a CheckpointSaver after an evaluator writes it when the evaluator's metric improves): add an "
            "evaluator, or pass test_last=True"
        )
    return found


def build_hooks(
    configs: Iterable[Any],
    *,
    registry: Mapping | None = None,
    options: Iterable[str] | Mapping[str, Any] | None = None,
    hooks_override: Mapping | None = None,
    weight: str | None = None,
    evaluate: Evaluator | Mapping[str, Evaluator] | bool | None = None,
    tester: Callable | None = None,
    context: Mapping | None = None,
    **unknown: Any,
) -> list:
    """pimm-style hook configs as a list of pimm_fn hooks, in the same order.

    pimm's overrides are applied first, in pimm's order (``hooks_override``,
    then ``options``; ``pimm_fn.compat.options``). Each item is then a dict
    ``{"type": name, **keywords}`` looked up in ``registry``, an
    already-built pimm_fn hook (kept as is), or an object with pimm's hook
    methods, a ``HookBase`` (adapted with ``adapt``). Each saver tracks, for
    ``model_best``, the current metric of the evaluator listed before it, as
    in pimm; its save runs after the other effects of the event, so it holds
    the evaluation's result.

    Args:
        configs: the pimm ``hooks`` list.
        registry: the type names to factories (default ``DEFAULT_REGISTRY``).
        options: pimm's ``--options`` for hooks: ``["hooks.CheckpointSaver.save_freq=100",
            "hooks.1.save_freq=7"]`` (or the parsed dict).
        hooks_override: pimm's ``{HookType: {"param.path": value}}``, applied before ``options``.
        weight: pimm's ``cfg.weight``, the warm start of ``CheckpointLoader``
            (``None``: a fresh run loads nothing).
        evaluate: the evaluation ``fn(model) -> {metric: value}`` the
            evaluators run, or ``{type: fn}`` per evaluator type, or ``False``
            for pimm's ``cfg.evaluate=False`` (no evaluation at all).
        tester: ``FinalEvaluator``'s test ``fn(model) -> {metric: value} | None``.
        context: more values for factories of your own (their ``context``).

    Returns:
        A list of hooks for ``loop`` or ``plan``.

    Raises:
        TypeError: an item is not a dict or hook, a config has an unknown
            keyword, or ``build_hooks`` itself got one.
        ValueError: an unknown or unsupported type, a missing context value,
            or a bad override.

    >>> build_hooks([dict(type="CheckpointSaverIteration", save_freq=100), dict(type="IterationTimer")])
    [checkpoint_saver_iteration(save_freq=100), iteration_timer(1)]
    >>> build_hooks([dict(type="CheckpointSaver", save_frq=1)])
    Traceback (most recent call last):
    TypeError: build_hooks: hooks[0] CheckpointSaver got unknown keyword 'save_frq': did you mean 'save_freq'?
    (CheckpointSaver accepts ['save_freq', 'evaluator_every_n_steps'])
    >>> build_hooks([], wieght="w.pth")
    Traceback (most recent call last):
    TypeError: build_hooks() got an unexpected keyword 'wieght': did you mean 'weight'? ...
    """
    if unknown:
        word = next(iter(unknown))
        named = ["registry", "options", "hooks_override", *CONTEXT_KEYWORDS, "context"]
        raise TypeError(
            f"build_hooks() got an unexpected keyword {word!r}{_suggest(word, named)} (it takes {named}; values for "
            f"factories of your own go in context={{...}})"
        )
    registry = DEFAULT_REGISTRY if registry is None else registry
    if not isinstance(registry, HookRegistry):
        registry = HookRegistry(registry)
    if options is not None or hooks_override:
        configs = override_hooks(configs, options, hooks_override=hooks_override, known=registry)
    taken = {"weight": weight, "evaluate": evaluate, "tester": tester}
    clash = sorted(set(taken) & set(context or {}))
    if clash:
        raise TypeError(f"build_hooks: pass {clash} as build_hooks' own keywords, not in context={{...}}")
    context = FrozenMap({**taken, **(context or {})})
    hooks = []
    for i, item in enumerate(configs):
        if is_pimm_hook(item):
            hooks.append(adapt(item))
        elif callable(item):
            hooks.append(item)
        else:
            hooks.append(_build_one(f"hooks[{i}]", item, registry, context))
    return _with_metrics(hooks)
