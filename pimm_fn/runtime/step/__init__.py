"""The step: one optimizer step's work, the default step and ``TrainStep``, and what a step keeps beyond the model.

``train_step.py``: the default step and the contract every step keeps (what it
is handed, what it returns); ``configurable.py``: ``TrainStep``, the step you
configure (device, precision, accumulation, clipping, a supervised loss);
``driver.py``: one step's batch, train step and scheduler step as units of the
step's transaction; ``devices.py``: the process's device and DDP;
``nonfinite.py``: a NaN loss's policy; ``rng.py`` and ``stateful_objects.py``:
the random streams, named optimizers, extra state and averages a checkpoint keeps.
"""
