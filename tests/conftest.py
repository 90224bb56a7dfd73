"""Hypothesis profiles: ``dev`` (default) and ``ci`` (derandomized, no deadline).

Choose with ``HYPOTHESIS_PROFILE``; ``ci`` is the default when ``CI`` is set.
"""

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=100, deadline=1000)  # ms; the machine is shared
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
