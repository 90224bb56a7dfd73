"""The pure core: values, the fold, the lifecycle and dry runs. Imports no torch."""

from pimm_fn.core import effects, events
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.fold import Chain, TraceEntry, chain
from pimm_fn.core.frozen import FrozenMap
from pimm_fn.core.plan import plan
from pimm_fn.core.processing import process
from pimm_fn.core.schedule import next_event
from pimm_fn.core.state import Progress, State
from pimm_fn.core.step_state import StepState

__all__ = [
    "effects",
    "events",
    "register_slot_type",
    "Chain",
    "TraceEntry",
    "chain",
    "process",
    "FrozenMap",
    "plan",
    "next_event",
    "Progress",
    "State",
    "StepState",
]
