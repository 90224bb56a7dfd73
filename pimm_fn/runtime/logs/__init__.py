"""Logging: where ``Log`` records go (loggers, trackers) and ``run.history``, the columns they leave.

``loggers.py``: the logger lifecycle, ``log.jsonl`` and CSV; ``trackers.py``:
TensorBoard, MLflow and Weights & Biases, each an optional extra;
``history.py``: ``run.history`` as packed columns. The ``Log`` handler that
feeds them is ``pimm_fn.runtime.handlers.logs``.
"""
