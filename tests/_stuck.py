"""A deadline on a block that could wait forever (a read blocked on a FIFO, a stuck kernel): it fails the test instead
of hanging pytest."""

import contextlib
import signal


class Stuck(BaseException):
    """A block ran past its deadline: not an ``OSError`` (as ``TimeoutError`` is), so no ``except`` absorbs it."""


@contextlib.contextmanager
def within(seconds: int, what: str = "the block"):
    """Raise :class:`Stuck` naming ``what`` when the block runs past ``seconds`` (main thread, POSIX)."""

    def expire(signum, frame):
        raise Stuck(f"{what} still waiting after {seconds} s (blocked on a FIFO? a stuck kernel?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
