"""What a run trains and keeps beyond one optimizer: named optimizers, extra state, weight averages.

``loop(optimizer={"g": opt_g, "d": opt_d})`` hands the dict to a custom
``step_fn`` as its ``optimizer`` argument and checkpoints each optimizer's
state under its name. ``loop(training=Training(extra_state={"name": obj}))`` checkpoints any
object with ``state_dict()``/``load_state_dict()`` in the replicated part
(rank 0's is written, so it must be the same on every rank: keep rank-local
things in the data cursor or a hook's slot). The ``ema()`` hooks' averages
join the extra state under their names. Every check here runs before
anything is built, with the fix in the message.
"""

from collections.abc import Mapping

from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.runtime.handlers.ema import EmaWeights
from pimm_fn.runtime.step.configurable import built_in

__all__ = ["check_optimizers", "extra_state"]


def _names(value, argument: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise TypeError(f"loop: '{argument}' must be a non-empty dict of names to objects (got {value!r:.80})")
    bad = [k for k in value if not isinstance(k, str) or not k]
    if bad:
        raise TypeError(f"loop: the names in '{argument}' must be non-empty strings (got {bad[0]!r})")


def _stateful(obj, where: str) -> None:
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(
            f"loop: {where} is a {type(obj).__name__}, which has no {' or '.join(missing)}(): the checkpoint keeps "
            f"what state_dict() returns and a resume hands it to load_state_dict()"
        )


def check_optimizers(optimizer, step_fn, *, sharded: bool) -> tuple:
    """``(optimizer, optimizers)`` for the run's ``Context``: the step's argument, and the named ones or ``None``.

    ``optimizer`` is one optimizer, or a dict of named ones for a custom ``step_fn``.

    Raises:
        TypeError: no optimizer; names or optimizers of the wrong kind.
        ValueError: several optimizers with a built-in step, or with a sharded model.
    """
    if optimizer is None:
        raise TypeError(
            "loop: pass the optimizer (loop(model, optimizer, data, ...)), or "
            "optimizer={name: opt, ...} for a custom step_fn"
        )
    if not isinstance(optimizer, Mapping):
        return optimizer, None
    _names(optimizer, "optimizer")
    for name, opt in optimizer.items():
        _stateful(opt, f"optimizer[{name!r}]")
    if built_in(step_fn):  # a built-in step trains one optimizer
        raise ValueError(
            f"loop: the built-in train step steps one optimizer, but optimizer= names {sorted(optimizer)}: "
            f"pass step_fn=your_step (it receives the dict as its 'optimizer'), or one optimizer"
        )
    if sharded:
        raise ValueError(
            "loop: several optimizers with a sharded (FSDP2) model are not supported yet: its optimizer state "
            "is checkpointed as shards of one optimizer"
        )
    named = dict(optimizer)
    return named, named


def extra_state(given, hooks, *, sharded: bool) -> dict:
    """``{name: object}`` the checkpoint keeps: ``given`` and one ``EmaWeights`` per ``ema()`` hook.

    Raises:
        TypeError: a name or an object of the wrong kind.
        ValueError: a name taken twice; an evaluation of an average no
            ``ema`` keeps; an ``ema`` after a saver or an evaluator of it;
            an ``ema`` of a sharded model.
    """
    found = {}
    if given is not None:
        _names(given, "extra_state")
        for name, obj in given.items():
            _stateful(obj, f"extra_state[{name!r}]")
        found.update(given)
    averages = hook_list.averages(hooks)
    if averages and sharded:
        raise ValueError(
            "loop: ema() of a sharded (FSDP2) model is not supported yet: its average would be sharded too"
        )
    for name in averages:
        if name in found:
            raise ValueError(f"loop: extra_state has an entry {name!r}, and so has ema(name={name!r}): rename one")
        found[name] = EmaWeights()
    _check_evaluated(hooks, averages)
    return found


def _check_evaluated(hooks, averages) -> None:
    """Each ``weights=`` names an average; the ``ema`` comes before the evaluators that use it.

    Not before the savers: a save runs after the other effects of its event
    (``SaveCheckpoint.runs_last``), so it holds that step's average wherever the ``ema`` stands.
    """
    for hook_key, name in hook_list.evaluated_averages(hooks):
        if name not in averages:
            known = f"the run keeps {sorted(averages)}" if averages else "add pimm_fn.ema(0.999) to the hooks"
            raise ValueError(
                f"loop: hook {hook_key} evaluates weights={name!r}, but no ema(name={name!r}) keeps them: {known}"
            )
    evaluators: dict[str, str] = {}  # average name -> the first hook that evaluates it
    for leaf in protocol.leaves(hooks):
        d = protocol.declared(leaf)
        for name in hook_list.averages([leaf]):
            late = evaluators.get(name)
            if late is not None:
                raise ValueError(
                    f"loop: {d.key} comes after {late} in hooks: an evaluation at a step must "
                    f"see that step's average, so put the ema before it"
                )
        for hook_key, name in hook_list.evaluated_averages([leaf]):
            evaluators.setdefault(name, hook_key)
