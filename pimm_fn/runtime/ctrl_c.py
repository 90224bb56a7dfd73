"""Ctrl-C during ``run()``: taken inside the work a step does, held back inside the loop's own bookkeeping.

A real SIGINT (Ctrl-C, a notebook's interrupt) raises ``KeyboardInterrupt``
at whatever bytecode runs. Inside the step's work (loading a batch, the
train step, a hook, an effect handler) that is what the loop's transaction
expects: it records where the step stopped and continues exactly. Between
two of those, while the loop hands a drawn batch or a finished effect over
to its own records, it would lose the batch or run the effect twice. So,
while ``run()`` or ``step()`` runs in the main thread, the loop's handler:

* raises at once when the loop has *opened* a piece of work and the signal
  lands outside the loop's own files (in the data loader, the model, torch,
  a hook, a handler);
* otherwise holds it, and the loop raises it at its next safe point: the
  start of the next piece of work, or the end of the step. From the start
  of ``optimizer.step()`` to the end of the train step, and during a
  scheduler step, it is held too (``holding``): a step stopped half-way
  through its parameters or its schedule, or after them but before the
  loop recorded the step, could not be continued exactly.

The previous SIGINT handler is put back when ``run()``/``step()`` returns.
"""

import contextlib
import pathlib
import signal
import threading

__all__ = ["CtrlC", "CTRL_C"]

_HERE = pathlib.Path(__file__).parent
# The loop's own bookkeeping: a signal landing in these files is held back, wherever the loop stands.
OWN_FILES = frozenset(
    str(path)
    for path in [*(_HERE.parent / "core").glob("*.py"), *(_HERE / name for name in (
        "run.py", "walker.py", "transaction.py", "driver.py", "optimizer_watch.py", "quiet.py", "feed.py", "rng.py",
        "peers.py", "interpreter.py", "ctrl_c.py", "batches.py", "training_data.py", "failed_fetch.py",
    ))]
)


class CtrlC:
    """The loop's SIGINT handler while a run trains; see the module docstring.

    ``open`` is True while the loop runs a piece of work that may stop
    anywhere, ``holding`` while a part of it must not stop (the optimizer
    step); ``pending`` holds a signal the loop has not stopped at yet: one
    that arrived elsewhere, or one raised at once that no unit has seen.
    One per process, as the SIGINT handler is: ``CTRL_C``.
    """

    def __init__(self):
        self.open = False
        self.holding = False
        self.pending = False
        self._depth = 0
        self._previous = None

    def __enter__(self) -> "CtrlC":
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        self.open = False
        if self._depth == 0 and self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        # Pending until the loop stops a step on it (``Transaction.stop``), also when raised at once: where
        # Python drops an exception (a gc callback, a ``__del__``) the raise is lost, and the next unit raises it.
        self.pending = True
        if self.open and not self.holding and (frame is None or frame.f_code.co_filename not in OWN_FILES):
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def holding_back(self):
        """Hold a Ctrl-C while the block runs: a scheduler step stopped half-way could not be continued exactly."""
        before = self.holding
        self.holding = True
        try:
            yield
        finally:
            self.holding = before

    def start(self) -> None:
        """Open a piece of work, raising first a Ctrl-C held back until now (call it inside the work's ``try``)."""
        self.holding = False  # an optimizer step that raised never released it
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt
        self.open = True

    def safe_point(self) -> None:
        """Raise a held-back Ctrl-C where nothing is in flight (between steps)."""
        self.open = False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


CTRL_C = CtrlC()
