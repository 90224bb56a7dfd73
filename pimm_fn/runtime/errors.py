"""The runtime's errors and warnings, in one place, and the advice a run gives once or refuses once it is sure.

The errors say what went wrong and the fix: ranks that disagree on their
collective effects (``CollectiveDivergenceError``) or a peer whose step failed
(``PeerFailureError``), an effect no handler executes, a sound checkpoint
that cannot be resumed as asked (``ResumeError``), a non-finite loss, and
``Preempted``, the ``SystemExit`` a preemption stop ends with. Each is
exported by ``pimm_fn`` under its name; the checkpoint's own errors are
``pimm_fn.checkpoint.errors``.

Mistakes a run can make without failing at once: each said once, or refused once it is sure.

A hook list can be valid and still do nothing useful: an evaluator that
returns ``None`` in a single process (so nothing is ever published), a
saver placed before an evaluator on the same steps (so the checkpoint
misses that evaluation). None of these is an error, since each can be
intended, but none should pass in silence: each is a ``ConfigurationWarning``.

A metric a hook reads (``best_on("acc")``) that no evaluator publishes is
an error once every evaluator has published (so a name another evaluator
publishes later never counts as missing), naming the published names and
the closest of them: a typo (``"miou"`` beside ``"mIoU"``), or the bare name
of a namespaced one (``"acc"`` beside ``"val/acc"``: ``loader_evaluator``
puts its name before each metric). The sanity check before the first step
(``pimm_fn.runtime.evaluation.sanity``) meets it there. It is raised on every rank
alike, from values every rank holds (broadcast, or a sanity check's); with
rank-local values (``broadcast=False``) only some ranks could see it, so it
is a ``ConfigurationWarning`` instead of a lone raising rank. A non-finite
value of a metric a hook reads (``best_on`` never makes it the best) is said
each time, with its step, as a ``NonFiniteMetricWarning``: training goes on.
"""

import difflib
import pathlib
import warnings
from typing import TYPE_CHECKING

from pimm_fn.core import hook as protocol
from pimm_fn.core import hook_list
from pimm_fn.core.effects import Evaluate
from pimm_fn.core.validate import finite

if TYPE_CHECKING:  # named for an annotation only: importing the checkpoint package would import torch
    from pimm_fn.checkpoint.storage import StorePath

__all__ = [
    "CollectiveDivergenceError",
    "PeerFailureError",
    "ReplicaError",
    "MissingHandlerError",
    "ResumeError",
    "NonFiniteLossError",
    "NonFiniteLossWarning",
    "Preempted",
    "ResumeNotExactWarning",
    "ConfigurationWarning",
    "NonFiniteMetricWarning",
    "Advice",
    "configuration_messages",
    "unpublished_metrics",
    "nothing_to_train",
    "near_miss",
    "namespaced",
]


class CollectiveDivergenceError(RuntimeError):
    """Ranks disagree on the collective effects of an event, or on the hooks and schedule that decide them."""


class PeerFailureError(CollectiveDivergenceError):
    """Another rank's step failed where this rank's did not: the group was shut down, and this rank stopped too."""


class ReplicaError(RuntimeError):
    """A fault-tolerant run cannot go on as replica groups: the lighthouse unreachable, too few groups in time, ..."""


class MissingHandlerError(LookupError):
    """An effect was requested that no handler executes."""


class ResumeError(RuntimeError):
    """A sound checkpoint cannot be resumed as asked (other hooks, optimizers, world size under ``strict``).

    A damaged one is a ``pimm_fn.CheckpointError`` instead: the fix there is another checkpoint, here another run setup.
    """


_RESUME = (
    "the weights already hold the update from that loss, so run() would raise this again: build the run anew "
    "from the last checkpoint (pimm_fn.loop(..., resume='auto')) with a lower lr"
)

_ADVICE = {  # by whether the step in use can skip: a built-in step can, a custom step_fn cannot
    True: f"{_RESUME}, or with training=pimm_fn.Training(on_nonfinite='skip') to leave such batches out of the update",
    False: f"{_RESUME}, or have your step_fn leave optimizer.step() out when its loss is not finite",
}


class NonFiniteLossError(FloatingPointError):
    """The training loss is NaN or infinite, under ``loop(training=Training(on_nonfinite="raise"))`` (the default).

    Read after its step ran, so the weights in memory already hold that
    step's update and the losses stay unread: ``run()`` would raise it
    again. ``advice`` is what the run's interruption line says instead of
    "run() continues exactly from here": what works for the step in use.
    """

    advice = _ADVICE[True]


class NonFiniteLossWarning(RuntimeWarning):
    """A NaN or infinite training loss, under ``loop(training=Training(on_nonfinite="skip"))`` or ``"warn"``."""


class Preempted(SystemExit):
    """Every rank saved ``step`` for ``reason`` and stops: a ``SystemExit`` whose ``code`` is the exit code.

    Uncaught, the script ends with that code and no traceback. ``path`` is
    the checkpoint that holds the step (``None`` without a ``save_dir``).
    """

    def __init__(self, code: int, step: int, reason: str, path: "pathlib.Path | StorePath | None") -> None:
        super().__init__(code)
        self.step, self.reason, self.path = step, reason, path


class ResumeNotExactWarning(UserWarning):
    """A resumed run will not see exactly the batches the original would have."""


class ConfigurationWarning(UserWarning):
    """A run's configuration is valid but probably not what was meant."""


class NonFiniteMetricWarning(UserWarning):
    """An evaluation published NaN or +/-inf for a metric a hook reads; it never improves, training goes on."""


def configuration_messages(hooks) -> list[str]:
    """Everything about ``hooks`` worth a ``ConfigurationWarning`` before the run starts."""
    return unpublished_metrics(hooks)


def nothing_to_train(state, path) -> str | None:
    """What to say when a resumed run has no step left under its budget (legal: ``run()`` only closes it).

    >>> from pimm_fn.core.state import Progress, State
    >>> print(nothing_to_train(State(Progress(10, 2, epoch=1, iter_in_epoch=10, global_step=20)), "runs/a/model/last"))
    resumed from runs/a/model/last at step 20, where its budget (max_epochs=2) is already spent: nothing is left to train. Pass a larger max_epochs (or max_steps) to train on
    """
    p = state.progress
    if p.steps_left > 0:
        return None
    budget = f"max_steps={p.step_limit}" if p.step_limit is not None else f"max_epochs={p.max_epochs}"
    return (
        f"resumed from {path} at step {p.global_step}, where its budget ({budget}) is already spent: nothing is "
        f"left to train. Pass a larger max_epochs (or max_steps) to train on"
    )


def unpublished_metrics(hooks) -> list[str]:
    """A message for each metric a hook reads while no hook evaluates anything: it can never appear.

    Said only when every hook declares what it emits and none emits
    ``Evaluate`` (a hook of unknown effects may evaluate).

    >>> from pimm_fn.hooks import best_on
    >>> unpublished_metrics([best_on("acc")])
    ["best_on('acc') reads metric 'acc', but no hook evaluates anything, so it never appears: add evaluate_every(n, fn) before it"]
    """
    found = [protocol.declared(h) for h in protocol.leaves(hooks)]
    if hook_list.evaluators(hooks) or any(d.emits is None or d.may_emit(Evaluate) for d in found):
        return []
    return [
        f"{d.key} reads metric {metric!r}, but no hook evaluates anything, so it never appears: "
        f"add evaluate_every(n, fn) before it"
        for d in found
        for metric in d.reads_metrics
    ]


def near_miss(metric: str, names) -> str | None:
    """A name among ``names`` that ``metric`` is almost surely a typo of (same letters but case, or very close).

    >>> near_miss("miou", ["mIoU", "loss"]), near_miss("acc", ["loss"])
    ('mIoU', None)
    """
    lowered = {name.lower(): name for name in names}
    return lowered.get(metric.lower()) or next(
        iter(difflib.get_close_matches(metric, list(names), n=1, cutoff=0.8)), None
    )


def namespaced(metric: str, names) -> str | None:
    """The one name among ``names`` that is ``metric`` under an evaluator's name (``"val/acc"`` for ``"acc"``).

    >>> namespaced("acc", ["val/acc", "val/loss"]), namespaced("acc", ["val/acc", "test/acc"])
    ('val/acc', None)
    """
    found = [name for name in names if name.rpartition("/")[2].lower() == metric.lower() and "/" in name]
    return found[0] if len(found) == 1 else None


class Advice:
    """Watches evaluations for the run-time mistakes above; warns once for each."""

    def __init__(self, implied, *, world_size: int):
        """``implied``: what the run's hooks imply (``pimm_fn.runtime.engine.implied.Implied``)."""
        self.readers_of = implied.readers_of  # metric -> the hooks that read it, in order
        self.evaluators = set(implied.evaluators)
        self.world_size = world_size
        self.published: dict[str, set] = {}  # evaluator -> the metric names it published
        self.rank_local: set = set()  # evaluators whose values differ by rank (broadcast=False): names may too
        self.said: set = set()

    def evaluated(self, evaluator: str, values, step: int | None = None, consistent: bool = False) -> None:
        """Note what one evaluation published (``None``: nothing on this rank) at global step ``step``.

        ``consistent``: every rank holds these same values (broadcast). A
        missing metric raises only when every evaluator's values were so:
        the names judged are then alike on every rank, and every rank raises.

        Raises:
            ValueError: once every evaluator has published, a metric some hook
                reads is missing (with ``consistent`` values only; else a
                ``ConfigurationWarning``).
        """
        if values is None and self.world_size == 1:
            self._say(
                ("none", evaluator),
                f"evaluator {evaluator!r} returned None in a single-process run, so it published nothing; "
                f"return a mapping of metric names to numbers (None is for ranks that computed nothing)",
            )
        if not consistent:
            self.rank_local.add(evaluator)
        if values:
            self.published.setdefault(evaluator, set()).update(values)
            self._non_finite(evaluator, values, step)
        if self.evaluators and self.evaluators <= set(self.published):
            self._check_readers(consistent=not self.rank_local)  # the names alike on every rank: it may raise

    def _check_readers(self, consistent: bool) -> None:
        """Once every evaluator has published: a metric some hook reads that none publishes."""
        names = sorted(set().union(*self.published.values()))
        for metric, readers in self.readers_of.items():
            if metric in names:
                continue
            prefixed = namespaced(metric, names)
            close = (
                prefixed
                or near_miss(metric, names)
                or next(iter(difflib.get_close_matches(metric, names, n=1, cutoff=0.5)), None)
            )
            message = (
                f"{', '.join(readers)} waits for metric {metric!r}, but the evaluators publish {names}"
                + (f": did you mean {close!r}?" if close else ": read one of these, or have an evaluator publish it")
                + (" (a loader_evaluator puts its name before each metric it publishes)" if prefixed else "")
            )
            if consistent:
                raise ValueError(message)
            self._say(("unread", metric), message)

    def _non_finite(self, evaluator: str, values, step) -> None:
        """Each time: a NaN or +/-inf of a metric some hook reads (each occurrence has its own step, so no key is kept)."""
        for metric, readers in self.readers_of.items():
            value = values.get(metric)
            if value is None or finite(value):
                continue
            at = f" at step {step}" if step is not None else ""
            warnings.warn(
                f"{', '.join(readers)} got metric {metric!r} = {value!r}{at} from evaluator {evaluator!r}: a "
                f"non-finite value never improves, so no best is written for it; training goes on",
                NonFiniteMetricWarning,
                stacklevel=3,
            )

    def _say(self, key, message: str) -> None:
        if key not in self.said:
            self.said.add(key)
            warnings.warn(message, ConfigurationWarning, stacklevel=3)
