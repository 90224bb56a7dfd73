"""What happens during training, as frozen values hooks match on.

The lifecycle, in order: ``ModifyConfig`` once (fresh runs only), then
``BeforeTrain``, per epoch ``BeforeEpoch``, per step ``BeforeStep`` and
``AfterStep``, then ``AfterEpoch``, and ``AfterTrain`` once. Follow-up events
such as ``MetricsPublished`` are delivered when an effect (an evaluation)
finishes; ``StopRequested`` when a ``Stop`` effect ran, after which only the
closing events (``AfterEpoch``, ``AfterTrain``) follow. ``Elapsed`` carries the
run's clock (rank 0's, the same on every rank) at a step boundary, to the hooks
that listen to it: the core itself reads no clock.
"""

from collections.abc import Mapping
from typing import ClassVar

import attrs

from pimm_fn.core.frozen import FrozenMap, freeze, repr_unless_none
from pimm_fn.core.outputs import StepOutputs

__all__ = [
    "Event",
    "ModifyConfig",
    "BeforeTrain",
    "BeforeEpoch",
    "BeforeStep",
    "AfterStep",
    "AfterEpoch",
    "AfterTrain",
    "MetricsPublished",
    "StopRequested",
    "Elapsed",
    "LIFECYCLE",
]


@attrs.frozen
class Event:
    """Base class of every event."""


@attrs.frozen
class ModifyConfig(Event):
    """Once, at the start of a fresh run, before anything is written."""


@attrs.frozen
class BeforeTrain(Event):
    """At the start of every run; ``resumed`` when continuing a checkpoint."""

    resumed: bool = False


@attrs.frozen
class BeforeEpoch(Event):
    epoch: int


@attrs.frozen
class BeforeStep(Event):
    """Before global step ``step`` (1-based) trains."""

    step: int


def _step_outputs(outputs: Mapping[str, float] | None) -> "FrozenMap | StepOutputs":
    """A real run's ``StepOutputs`` as it is (reading it is the hooks' choice), any other mapping frozen."""
    if type(outputs) is StepOutputs or type(outputs) is FrozenMap:  # the loop's own, on every walked step: at once
        return outputs
    return outputs if isinstance(outputs, StepOutputs) else freeze(outputs)


@attrs.frozen
class AfterStep(Event):
    """After global step ``step`` trained, with its scalar outputs.

    ``outputs`` are rank-local (each rank's own loss); ``batch_size`` counts
    the samples this step consumed on this rank. In a real run ``outputs`` is
    a ``StepOutputs`` (``pimm_fn.core.outputs``): the values are read off the
    device only when a hook asks for one.
    """

    step: int
    outputs: "FrozenMap | StepOutputs" = attrs.field(default=FrozenMap(), converter=_step_outputs)
    batch_size: int = 0


@attrs.frozen
class AfterEpoch(Event):
    epoch: int


@attrs.frozen
class AfterTrain(Event):
    """Once, when the last epoch has ended."""


@attrs.frozen(repr=False)
class MetricsPublished(Event):
    """An evaluation finished: ``values`` maps metric names to numbers.

    ``consistent`` is True when every rank holds the same ``values`` (the
    main rank's result was broadcast); False when each rank kept its own, in
    which case no collective decision may depend on them. ``weights`` names
    the average (``pimm_fn.ema``) that was evaluated; ``None``: the model's own.
    """

    values: FrozenMap = attrs.field(converter=freeze)
    source: str = ""
    step: int = 0
    consistent: bool = True
    weights: str | None = None

    __repr__ = repr_unless_none("weights")


@attrs.frozen
class StopRequested(Event):
    """A ``Stop`` effect ran at global step ``step``: training ends early, for ``reason``.

    Delivered on every rank alike (``Stop`` is collective). The core records
    ``reason`` in ``State.stop`` before the hooks see it; the epoch in
    progress then closes (``AfterEpoch``) and ``AfterTrain`` follows.
    """

    step: int
    reason: str = "stop requested"


@attrs.frozen
class Elapsed(Event):
    """The run's clock at the boundary of global step ``step``: ``seconds`` since training began in this process.

    Rank 0's clock, sent to every rank, so a hook may base a collective
    decision on it (``save_every(minutes=...)``); the pure core reads no
    clock, the runtime delivers this event instead (``pimm_fn.runtime.engine.preemption``),
    and ``plan``/``pimm_fn.testing.simulate`` deliver it from the ``clock`` they
    are given. Only hooks that name it in ``events`` get it (it is opt-in), after a step's
    events (and the closing events of the epoch it ends). ``seconds`` restarts
    at 0 in a resumed process.
    """

    opt_in: ClassVar[bool] = True  # only hooks that name it in ``events`` get it: the others never pay for it

    step: int
    seconds: float


# The events that move training forward, by name; ``State.position`` holds one.
LIFECYCLE = (ModifyConfig, BeforeTrain, BeforeEpoch, BeforeStep, AfterStep, AfterEpoch, AfterTrain)
