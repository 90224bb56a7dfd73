"""Evaluation beyond the ``Evaluate`` handler: evaluators over a DataLoader, the sanity check, test and predict.

``loader_evaluator.py``: an evaluator over a DataLoader, one shard per rank,
sums reduced once; ``sanity.py``: every evaluator run before the first step,
so a misspelt metric fails in seconds; ``after_training.py``: ``run.test`` and
``run.predict`` on the final or the best weights. The ``Evaluate`` handler is
``pimm_fn.runtime.handlers.evaluation``.
"""
