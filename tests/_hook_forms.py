"""One hook in other forms, for the tests that check the forms fold alike: the plain call, and the old contract.

``Plain(hook)`` keeps every declaration of ``hook`` but ``update`` and is
called as ``hook(state, event)``; ``AsState(hook)`` is that, handed the
``State`` a step's ``StepState`` stands for (the contract before
``StepState``). ``Count`` is a slotted hook of the update form that changes
the state and emits.
"""

import attrs

from pimm_fn.core import hook as protocol
from pimm_fn.core.effects import Log
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.step_state import built


class Plain:
    """``hook`` as the plain form: every declaration but ``update``, called as ``hook(state, event)``."""

    def __init__(self, hook):
        d = protocol.declared(hook)
        self.hook, self.events, self.every, self.accumulate = hook, d.events, d.every, d.accumulate
        self.reads_outputs, self.rank_consistent, self.emits = d.reads_outputs, d.rank_consistent, d.emits
        self.hook_key, self.reads_metrics = d.key, d.reads_metrics
        self.evaluators = getattr(hook, "evaluators", None)

    def init(self):
        return protocol.init_slot(self.hook)

    def __call__(self, state, event):
        return self.hook(state, event)


class AsState(Plain):
    """``hook`` under the contract before ``StepState``: handed a ``State`` on every event, a step's built first."""

    def __call__(self, state, event):
        return self.hook(built(state), event)


@attrs.frozen
class Count:
    """Counts the events it sees in its slot; every ``n``-th emits a Log and marks the config."""

    name: str
    n: int = 2

    def init(self):
        return 0

    def update(self, slot, state, event):
        slot += 1
        if slot % self.n:
            return slot, state, ()
        state = state.evolve(config=state.config.set(self.name, slot))
        return slot, state, (Log(state.progress.global_step, self.name, {"seen": slot}),)

    __call__ = called_plainly  # hook(state, event) still works: the slot in state.slot
