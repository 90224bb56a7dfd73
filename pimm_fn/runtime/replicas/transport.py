"""The heal as torchft's checkpoint transport: ``heal.receive_state`` and ``heal.send_state`` on the main thread.

torchft's manager asks its transport, from its quorum thread, to send the
state to the replicas that need it and to receive it on a replica that
does. Here both wait for the quorum to return: the receiving replica's
manager calls ``load`` on the training thread (torchft applies a received
state there), which notes the source; once ``start_quorum`` returned, the
replica receives the peer's whole run (``receive_pending``) or sends its
own (``send_pending``). So a heal replaces a run's state between two
steps, on the thread that trains it, as JSON and tensors, never pickled.

In a ``torchrun`` group each rank has a manager and a gloo group of its
own: rank ``r`` of every replica group, the same replica ranks in each.
A heal goes rank to rank (rank ``r`` of the source to rank ``r`` of the
receiver), each rank its own part of the run (its RNG states, its data
position). torchft assigns each rank its part in the heal apart: at the
job's first step, when every group is fresh, each rank names a different
group the source (``torchft.manager``'s primary turns with the rank), so
the ranks of one group would take the states of different groups. Here
every rank takes its group's rank 0's part, which is one assignment for
all groups, and a group's ranks heal together: one rank's heal cut on the
way is every rank's (``receive_pending``).
"""

from typing import Any

from torchft.checkpointing.transport import CheckpointTransport

from pimm_fn import dist
from pimm_fn.runtime.errors import ReplicaError
from pimm_fn.runtime.replicas import heal

__all__ = ["Transport"]


class Transport(CheckpointTransport):
    """The heal's transport over the manager's gloo ``group``; ``run`` is the ``Loop`` healed or sent.

    ``ranks``: the ranks of this replica group (its ``torchrun`` world, the
    default process group's when the manager was built; 1 for one process).
    """

    def __init__(self, group, ranks: int = 1):
        self.group, self.ranks = group, ranks
        self.run: Any = None  # the Loop, once the switch connects it
        self.sends: list[int] = []  # the ranks the quorum asked this replica to heal
        self.source: int | None = None  # the rank the quorum asked this replica to heal from
        self.healed: heal.Healed | None = None  # what the last heal brought here
        self.failed: Exception | None = None  # the last heal's failure on the way (the peer died or hung)

    def metadata(self) -> str:
        return "pimm_fn-heal"

    def send_checkpoint(self, dst_ranks, step, state_dict, timeout) -> None:
        self.sends = list(dst_ranks)  # sent by send_pending, once the quorum returned to the training thread

    def recv_checkpoint(self, src_rank, metadata, step, timeout):
        # The state itself is received by ``receive_pending`` on the training thread; torchft's own part is the step.
        return {"user": {"default": src_rank}, "torchft": {"step": step, "batches_committed": 0}}

    def load(self, source: int) -> None:
        """The manager's ``load_state_dict``: this replica heals from rank ``source`` of the quorum (``receive_pending``)."""
        self.source = source

    def receive_pending(self) -> None:
        """Receive a live peer's state when the quorum asked for it; a failure on the way is kept in ``failed``.

        Called on every rank once the quorum returned, before ``send_pending``.
        In a ``torchrun`` group every rank first takes its rank 0's part in
        the heal (whom to receive from, whom to send to); its ranks then
        receive together and agree on the outcome: a heal cut on one rank is
        said failed on each (every rank's run as it was, healed again at the
        next quorum). Collective in the group.

        Raises:
            HealError: this replica is built otherwise than its peer (on one rank of the group: on each).
            ReplicaError: some ranks of the group took the peer's state and others did not.
        """
        if self.ranks > 1:  # one assignment for all groups: their ranks 0's (see the module docstring)
            self.source, self.sends = dist.broadcast_object((self.source, self.sends))
        source, self.source = self.source, None
        if source is None:
            return
        refused: heal.HealError | None = None
        try:
            self.healed = heal.receive_state(self.run, source, self.group)
        except heal.HealCut as cut:  # the peer died or hung while sending: nothing was loaded, the next quorum heals
            self.failed = cut
        except heal.HealError as exc:  # this replica is built otherwise than its peer: said, and it stops
            refused = exc
        except Exception as exc:  # noqa: BLE001 - anything else on the way: nothing was loaded
            self.failed = exc
        outcome = "refused" if refused is not None else "failed" if self.failed is not None else "healed"
        outcomes = dist.all_gather_object(outcome) if self.ranks > 1 else [outcome]
        if refused is not None:
            raise refused
        if "refused" in outcomes:
            raise heal.HealError(f"rank {outcomes.index('refused')} of this replica group refused its peer's state")
        if "healed" in outcomes and "failed" in outcomes:
            raise ReplicaError(
                f"the heal from a peer reached ranks {[r for r, o in enumerate(outcomes) if o == 'healed']} of this "
                f"replica group and failed on the others, whose runs no longer hold one state: restart the group "
                f"(resume='auto'), which heals it whole"
            )

    def send_pending(self) -> list[int]:
        """Send this run's state to each rank the quorum asked for; returns them."""
        sends, self.sends = self.sends, []
        for rank in sends:
            heal.send_state(self.run, rank, self.group)
        return sends
