"""Replicas: a run kept by several replica groups, one of which may fail and rejoin while the others go on.

``heal.py``: a rejoining replica takes, from a live peer at a committed step,
everything a resume restores (the model, optimizers, scheduler, scaler,
extra state, the whole ``State`` and the data position), sent over a process
group as JSON and tensors, never pickled.
"""
