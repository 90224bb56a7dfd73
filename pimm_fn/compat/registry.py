"""pimm hook configs (``dict(type="CheckpointSaver", save_freq=5)``) as pimm_fn hooks.

A ``HookRegistry`` is an immutable mapping from pimm type names to hook
factories. ``build_hooks`` looks each config up, checks its keywords against
the factory's signature and calls it, so a typo fails when the hook list is
built, with the accepted names in the message. Nothing is registered behind
your back: extend a registry with ``add`` and pass it as ``registry=``.

Built-in types (``DEFAULT_REGISTRY``):

================================  ==============================================
pimm config                       pimm_fn hook
================================  ==============================================
``CheckpointSaverIteration(N)``   ``save_every(N)``
``CheckpointSaver(save_freq)``    ``save_every_epoch(1, snapshot_every=save_freq)``
``CheckpointLoader(...)``         ``load_weights(weight, replacements, strict)``
``InformationWriter(N)``          ``log_every(N)``
``SemSegEvaluator`` and others    ``evaluate_every(0, evaluate)``
``IterationTimer``                ``ignored(...)``: timing is the runtime's job
``PreciseEvaluator``              not supported: an error says what to do
================================  ==============================================
"""

import difflib
import inspect
from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.compat.hookbase import HookBase, adapt
from pimm_fn.compat.saving import save_every_epoch
from pimm_fn.core.frozen import FrozenMap, freeze
from pimm_fn.hooks import evaluate_every, load_weights, log_every, save_every

__all__ = ["HookRegistry", "DEFAULT_REGISTRY", "register_hook", "build_hooks", "ignored"]

# The parameter through which a factory receives build_hooks' context; never a config keyword.
CONTEXT = "context"


@attrs.frozen(repr=False)
class _Ignored:
    """A hook that never runs: the fold skips a hook that wants no event."""

    factory_name: ClassVar[str] = "ignored"
    events: ClassVar[tuple] = ()
    rank_consistent: ClassVar[bool] = True  # never runs
    type: str
    options: FrozenMap = attrs.field(default=FrozenMap(), converter=freeze)

    def __call__(self, state, event):
        return state, ()

    def __repr__(self):
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"ignored({self.type!r}{options})"


def ignored(type: str, **options):
    """A no-op stand-in for a pimm hook whose job pimm_fn does elsewhere.

    It keeps the hook's place (and index) in the list and shows in the repr
    what the config asked for.

    >>> ignored("IterationTimer", warmup_iter=2)
    ignored('IterationTimer', warmup_iter=2)
    """
    return _Ignored(type, options)


# The built-in factories. Their keyword names and defaults are pimm's.


def _checkpoint_saver_iteration(save_freq):
    return save_every(save_freq)


def _checkpoint_saver(save_freq=None):
    return save_every_epoch(1, snapshot_every=save_freq)


def _checkpoint_loader(keywords="", replacement="", strict=False, weight=None, *, context):
    path = weight if weight is not None else context.get("weight")
    if path is None:
        raise ValueError(
            "needs the weights file to load: pass build_hooks(..., weight='path/to/model.pth') "
            "or dict(type='CheckpointLoader', weight=...); to resume a run use loop(..., resume='auto') instead"
        )
    return load_weights(path, replacements={keywords: replacement} if keywords else None, strict=strict)


def _information_writer(log_interval=1):
    return log_every(log_interval)


def _evaluator(type_name):
    def factory(*, context):  # no keywords: evaluation settings belong to the evaluate callable
        evaluate = context.get("evaluate")
        if evaluate is None:
            raise ValueError(
                f"needs the evaluation to run: pass build_hooks(..., evaluate=fn) where "
                f"fn(model) returns {{metric: value}} (pimm_fn evaluates at the end of each epoch)"
            )
        return evaluate_every(0, evaluate)

    factory.__name__ = factory.__qualname__ = f"_{type_name}"
    return factory


def _iteration_timer(warmup_iter=1):
    # Timing reads a clock, which no pure hook may do; the runtime reports it.
    return ignored("IterationTimer", warmup_iter=warmup_iter)


def _precise_evaluator(test_last=False):
    raise ValueError(
        "a full test pass after training has no pimm_fn hook: drop it from the hook list, "
        "and after run() returns test the weights in save_dir/model/model_best.pth (or last/) with your tester"
    )


def _accepted(factory) -> tuple[tuple, bool]:
    """(config keywords ``factory`` accepts, whether it takes any keyword)."""
    params = inspect.signature(factory).parameters.values()
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != CONTEXT)
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


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
    ``context`` parameter also receives ``build_hooks``' context keywords as
    a read-only mapping.

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


DEFAULT_REGISTRY = HookRegistry({
    "CheckpointSaverIteration": _checkpoint_saver_iteration,
    "CheckpointSaver": _checkpoint_saver,
    "CheckpointLoader": _checkpoint_loader,
    "InformationWriter": _information_writer,
    "SemSegEvaluator": _evaluator("SemSegEvaluator"),
    "ClsEvaluator": _evaluator("ClsEvaluator"),
    "InsSegEvaluator": _evaluator("InsSegEvaluator"),
    "IterationTimer": _iteration_timer,
    "PreciseEvaluator": _precise_evaluator,
})


def register_hook(name: str):
    """Mark a factory with the pimm type name it builds; returns it unchanged.

    Registration is explicit: add the marked factory to a registry and pass
    that registry to ``build_hooks``. No global registry changes.

    >>> from pimm_fn.hooks import log_every
    >>> @register_hook("ConsoleWriter")
    ... def console_writer(every=10):
    ...     return log_every(every)
    >>> registry = DEFAULT_REGISTRY.add(console_writer)
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
    missing = [n for n, p in params.items() if p.default is p.empty and n != CONTEXT and n not in options
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise TypeError(f"build_hooks: {where} {name} needs keyword {missing[0]!r} (got {sorted(options)})")
    takes_context = CONTEXT in params
    try:
        return factory(**options, **({CONTEXT: context} if takes_context else {}))
    except (TypeError, ValueError) as error:
        raise type(error)(f"build_hooks: {where} {name}: {error}") from error


def build_hooks(configs, *, registry: Mapping | None = None, **context) -> list:
    """pimm-style hook configs as a list of pimm_fn hooks, in the same order.

    Each item is a dict ``{"type": name, **keywords}`` looked up in
    ``registry``, an already-built pimm_fn hook (kept as is), or a
    ``HookBase`` instance (wrapped with ``adapt``). Order matters as in
    pimm: put evaluators before savers.

    Args:
        configs: the pimm ``hooks`` list.
        registry: the type names to factories (default ``DEFAULT_REGISTRY``).
        **context: values factories may need: ``weight`` (the
            ``CheckpointLoader`` weights path, pimm's ``cfg.weight``) and
            ``evaluate`` (the ``fn(model) -> {metric: value}`` evaluators run).

    Returns:
        A list of hooks for ``loop`` or ``plan``.

    Raises:
        TypeError: an item is not a dict or hook, or a config has an unknown keyword.
        ValueError: an unknown or unsupported type, or a missing context value.

    >>> build_hooks([dict(type="CheckpointSaverIteration", save_freq=100), dict(type="IterationTimer")])
    [save_every(100), ignored('IterationTimer', warmup_iter=1)]
    >>> build_hooks([dict(type="CheckpointSaver", save_frq=1)])
    Traceback (most recent call last):
    TypeError: build_hooks: hooks[0] CheckpointSaver got unknown keyword 'save_frq': did you mean 'save_freq'?
    (CheckpointSaver accepts ['save_freq'])
    """
    registry = DEFAULT_REGISTRY if registry is None else registry
    if not isinstance(registry, HookRegistry):
        registry = HookRegistry(registry)
    context = FrozenMap(context)
    hooks = []
    for i, item in enumerate(configs):
        if isinstance(item, HookBase):
            hooks.append(adapt(item))
        elif callable(item):
            hooks.append(item)
        else:
            hooks.append(_build_one(f"hooks[{i}]", item, registry, context))
    return hooks
