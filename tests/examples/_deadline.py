"""A time limit on a block that talks to a kernel: a stuck kernel fails the test instead of hanging pytest."""

import contextlib
import signal


@contextlib.contextmanager
def deadline(seconds: int, what: str):
    """Raise ``TimeoutError`` naming ``what`` when the block runs past ``seconds`` (main thread, POSIX)."""

    def expire(signum, frame):
        raise TimeoutError(f"{what} ran past {seconds} s: a kernel is stuck")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
