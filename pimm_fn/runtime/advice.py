"""Mistakes a run can make without failing, each said once as a ``ConfigurationWarning``.

A hook list can be valid and still do nothing useful: ``best_on("acc")``
when the evaluators publish ``"accuracy"``, an evaluator that returns
``None`` in a single process (so nothing is ever published), a saver placed
before an evaluator on the same steps (so the checkpoint misses that
evaluation). None of these is an error, since each can be intended, but
none should pass in silence.
"""

import difflib
import math
import warnings

from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Evaluate, SaveCheckpoint
from pimm_fn.core.events import AfterStep

__all__ = ["ConfigurationWarning", "Advice", "saver_before_evaluator"]


class ConfigurationWarning(UserWarning):
    """A run's configuration is valid but probably not what was meant."""


def saver_before_evaluator(hooks, *, iters_per_epoch: int, max_epochs: int) -> list[str]:
    """Messages for each saver that precedes an evaluator firing on a common mid-epoch step.

    A save executes after the effects of the hooks before it, so a saver
    listed first writes its checkpoint before that step's evaluation runs
    (epoch-end saves are deferred past the epoch's evaluations, so those
    never collide).
    """
    found = [protocol.declared(h) for h in protocol.leaves(hooks)]
    max_steps = iters_per_epoch * max_epochs
    messages = []
    for i, saver in enumerate(found):
        if not saver.may_emit(SaveCheckpoint) or not saver.wants(AfterStep):
            continue
        for evaluator in found[i + 1:]:
            if not evaluator.may_emit(Evaluate) or not evaluator.wants(AfterStep):
                continue
            common = math.lcm(saver.every, evaluator.every)
            if common <= max_steps and common % iters_per_epoch:
                messages.append(
                    f"{saver.key} comes before {evaluator.key} in the hook list and both act at "
                    f"step {common}: that checkpoint is written before the evaluation and misses its result. "
                    f"Put the evaluator first"
                )
    return messages


class Advice:
    """Watches evaluations for the run-time mistakes above; warns once for each."""

    def __init__(self, hooks, *, world_size: int):
        self.readers = {m: d.key for d in map(protocol.declared, protocol.leaves(hooks)) for m in d.reads_metrics}
        self.evaluators = set(protocol.evaluators(hooks))
        self.world_size = world_size
        self.published: dict[str, set] = {}  # evaluator -> the metric names it published
        self.said: set = set()

    def evaluated(self, evaluator: str, values) -> None:
        """Note what one evaluation published (``None``: nothing on this rank)."""
        if values is None and self.world_size == 1:
            self._say(
                ("none", evaluator),
                f"evaluator {evaluator!r} returned None in a single-process run, so it published nothing; "
                f"return a mapping of metric names to numbers (None is for ranks that computed nothing)",
            )
        if values:
            self.published.setdefault(evaluator, set()).update(values)
        if self.evaluators and self.evaluators <= set(self.published):
            self._check_readers()

    def _check_readers(self) -> None:
        """Once every evaluator has published: a metric some hook reads that none publishes."""
        names = sorted(set().union(*self.published.values()))
        for metric, reader in self.readers.items():
            if metric not in names:
                close = difflib.get_close_matches(metric, names, n=1, cutoff=0.5)
                hint = f": did you mean {close[0]!r}?" if close else ""
                self._say(
                    ("unread", metric),
                    f"{reader} waits for metric {metric!r}, but the evaluators publish {names}{hint}",
                )

    def _say(self, key, message: str) -> None:
        if key not in self.said:
            self.said.add(key)
            warnings.warn(message, ConfigurationWarning, stacklevel=3)
