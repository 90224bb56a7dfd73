"""Replicas: a run kept by several replica groups, one of which may fail and rejoin while the others go on.

``loop(parallel=Parallel(fault_tolerant=FaultTolerance(...)))`` runs it
through torchft, which is imported in this family only, and only then.

``switch.py``: one group's part, asked by the walker at each step's
boundary (the quorum, a heal in it, waiting for ``min_replicas``) and by
the interpreter (one group writes each checkpoint).
``manager.py``: the group's torchft ``Manager``, built from the option and
the environment (``REPLICA_GROUP_ID``, ``TORCHFT_LIGHTHOUSE``).
``commit.py``: the gradients averaged over the participants and the commit
vote; a step whose vote fails is discarded and drawn again.
``agreement.py``: every live group folds the same trace: its hooks, schedule
and collective effects compared across the groups at each step's vote.
``transport.py``: the heal as torchft's checkpoint transport, on the
training thread.
``heal.py``: a rejoining replica takes, from a live peer at a committed step,
everything a resume restores (the model, optimizers, scheduler, scaler,
extra state, the whole ``State`` and the data position), sent over a process
group as JSON and tensors, never pickled.
"""
