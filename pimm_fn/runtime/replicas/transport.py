"""The heal as torchft's checkpoint transport: ``heal.send_state`` and ``heal.receive_state`` on the main thread.

torchft's manager asks its transport, from its quorum thread, to send the
state to the replicas that need it and to receive it on a replica that
does. Here both wait for the quorum to return: the receiving replica's
manager calls ``load`` on the training thread (torchft applies a received
state there), which receives the peer's whole run (``heal.receive_state``);
the sending replica sends it when ``start_quorum`` returns
(``send_pending``). So a heal replaces a run's state between two steps, on
the thread that trains it, as JSON and tensors, never pickled.
"""

from torchft.checkpointing.transport import CheckpointTransport

from pimm_fn.runtime.replicas import heal

__all__ = ["Transport"]


class Transport(CheckpointTransport):
    """The heal's transport over the manager's gloo ``group``; ``run`` is the ``Loop`` healed or sent."""

    def __init__(self, group):
        self.group = group
        self.run = None
        self.sends: list[int] = []  # the ranks the quorum asked this replica to heal
        self.healed: heal.Healed | None = None  # what the last heal brought here
        self.failed: Exception | None = None  # the last heal's failure on the way (the peer died or hung)

    def metadata(self) -> str:
        return "pimm_fn-heal"

    def send_checkpoint(self, dst_ranks, step, state_dict, timeout) -> None:
        self.sends = list(dst_ranks)  # sent by send_pending, once the quorum returned to the training thread

    def recv_checkpoint(self, src_rank, metadata, step, timeout):
        # The state itself is received by ``load`` on the training thread; torchft's own part is the step.
        return {"user": {"default": src_rank}, "torchft": {"step": step, "batches_committed": 0}}

    def load(self, source: int) -> None:
        """The manager's ``load_state_dict``: this replica heals from rank ``source`` of the quorum."""
        try:
            self.healed = heal.receive_state(self.run, source, self.group)
        except heal.HealError:
            raise  # this replica is built otherwise than its peer: said, and it stops
        except Exception as exc:  # noqa: BLE001 - the peer died or hung while sending: nothing was loaded
            self.failed = exc

    def send_pending(self) -> list[int]:
        """Send this run's state to each rank the quorum asked for; returns them."""
        sends, self.sends = self.sends, []
        for rank in sends:
            heal.send_state(self.run, rank, self.group)
        return sends
