"""Test kit: simulate a hook list on many ranks and check what the design promises.

``simulate`` runs every rank through the pure core; ``simulate_replicas`` runs the
replica groups of a fault-tolerant job under a ``Membership`` (replicas lost and
rejoining), checked by ``assert_fault_tolerant``; ``assert_collective_agreement``
and ``assert_resume_continuity`` check rules 3 and 4 of the design (agreement,
resume continuity); ``pimm_fn.testing.assertions.matches_plan`` compares a run's
trace with its plan; ``pimm_fn.testing.strategies`` generates schedules, metric
streams, rank-local inputs and hook stacks for hypothesis. Imports no torch.

    >>> from pimm_fn.hooks import save_every
    >>> from pimm_fn.testing import simulate, assert_collective_agreement
    >>> assert_collective_agreement(simulate([save_every(3)], world_size=4, iters_per_epoch=5, max_epochs=2))
"""

from pimm_fn.testing.assertions import assert_collective_agreement, assert_fault_tolerant, assert_resume_continuity
from pimm_fn.testing.replicas import Membership, ReplicaRun, ReplicasResult, simulate_replicas
from pimm_fn.testing.simulation import SimEntry, SimulationResult, simulate

__all__ = [
    "simulate",
    "SimulationResult",
    "SimEntry",
    "assert_collective_agreement",
    "assert_resume_continuity",
    "simulate_replicas",
    "Membership",
    "ReplicasResult",
    "ReplicaRun",
    "assert_fault_tolerant",
]
