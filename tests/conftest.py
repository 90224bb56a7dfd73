"""Hypothesis profiles: ``dev`` (default) and ``ci`` (derandomized, no deadline); signals put back after each test.

Choose with ``HYPOTHESIS_PROFILE``; ``ci`` is the default when ``CI`` is set.
"""

import os
import signal

import pytest
from hypothesis import settings

settings.register_profile("dev", max_examples=100, deadline=1000)  # ms; the machine is shared
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@pytest.fixture(autouse=True)
def _signals_as_they_were():
    """A run stopped by ``Preempted`` holds its signals until the process exits (a script's 75 stands); a test
    process goes on after it, so each test gets them back as they were."""
    before = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
