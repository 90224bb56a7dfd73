"""The data feed: the training data as the loop consumes it, and where an interrupted epoch goes on.

``feed.py``: epochs, a cursor into the current one, exact resume and a fetch
that failed; ``positioning.py``: what the feed reads off the data (its
sampler, its steps per epoch) and where an epoch continues when the world
size or the steps per epoch changed; ``dealing.py``: an epoch dealt over the
replicas that take part in each step, from one cursor (``Feed.deal``).
"""
