"""Stopping for the cluster or for Ctrl-C: a signal or the time budget becomes one agreed step, a save, and an exit.

The path of a request:

1. **Signal.** While ``run()``/``step()`` trains, each signal of
   ``Preemption.signals`` (default ``SIGTERM``) only records a request
   (``Requests``): nothing is raised inside the step, an evaluation or a save.
2. **Safe point.** At each step boundary (after a step's events, and the
   closing events of an epoch it ends) the walker asks ``Stopping.at_boundary``.
3. **Agreement.** One process decides at once. Several ranks reduce, every
   ``check_every`` steps, one small int64 buffer (the highest signal number
   any rank got, rank 0's "time is up" and rank 0's clock) with an
   asynchronous all-reduce on a gloo group of their own, and read it at the
   next check, when it has long completed: every rank reads the same answer at
   the same step (``pimm_fn.core.preemption.stop_step``). The clock that
   ``max_time`` and ``Elapsed`` use is rank 0's, so the ranks agree on time too.
4. **Save.** Every rank saves that step: a normal, resumable checkpoint whose
   marker says ``saved_for`` (the signal's name, or ``"max_time"``), unless
   the step's own save already holds it; rank 0 says one line.
5. **Exit.** ``Preempted`` (a ``SystemExit``) is raised on every rank with
   ``Preemption.exit_code`` (75 by default): a script exits with it, without a
   traceback; ``resume="auto"`` continues from the save, bit-identical. From
   then on a script holds the preempting signals until it exits
   (``Requests.hold``): torchrun's closing SIGTERM or a second ``scancel``
   cannot turn the 75 into a kill (143).

Cost on a step with no request: one process reads a flag (and the clock,
under ``max_time``); several ranks start one asynchronous all-reduce of 24
bytes per check and wait for the previous one, already done
(``benchmarks/RESULTS.md``).

A Ctrl-C in a script that escapes ``run()`` prints where the last checkpoint
is and how to continue instead of the loop's traceback
(``pimm_fn.runtime.engine.preemption``).

Ctrl-C during ``run()``: taken inside the work a step does, held back inside the loop's own bookkeeping.

A real SIGINT (Ctrl-C, a notebook's interrupt) raises ``KeyboardInterrupt``
at whatever bytecode runs. Inside the step's work (loading a batch, the
train step, a hook, an effect handler) that is what the loop's transaction
expects: it records where the step stopped and continues exactly. Between
two of those, while the loop hands a drawn batch or a finished effect over
to its own records, it would lose the batch or run the effect twice. So,
while ``run()`` or ``step()`` runs in the main thread, the loop's handler:

* raises at once when the loop has *opened* a piece of work and the signal
  lands outside the loop's own files (in the data loader, the model, torch,
  a hook, a handler), but not inside a finalizer (``in_finalizer``), where
  Python would drop the exception and the finalizer's work with it;
* otherwise holds it, and the loop raises it at its next safe point: the
  start of the next piece of work, or the end of the step. From the start
  of ``optimizer.step()`` to the end of the train step, and during a
  scheduler step, it is held too (``holding``): a step stopped half-way
  through its parameters or its schedule, or after them but before the
  loop recorded the step, could not be continued exactly.

The previous SIGINT handler is put back when ``run()``/``step()`` returns.

A script's Ctrl-C: the line its exit prints in place of the loop's traceback, and who drives the process.

A Ctrl-C in a script that escapes ``run()`` prints one line: the step it
stopped, where the last checkpoint is and how to continue (``advise``); a notebook's or the REPL's
Ctrl-C keeps its behaviour (``run()`` continues exactly), told by
``interactive``. How a Ctrl-C is taken during ``run()``:
``pimm_fn.runtime.engine.preemption``; a preemption save on Ctrl-C:
``pimm_fn.runtime.engine.preemption``.
"""

import atexit
import contextlib
import gc
import inspect
import os
import pathlib
import signal
import sys
import threading
import time
import weakref

import torch
import torch.distributed as td

from pimm_fn import checkpoint, dist
from pimm_fn.core import events as ev
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.core.preemption import lags, next_cadence, time_is_up
from pimm_fn.runtime.errors import Preempted

__all__ = [
    "CtrlC",
    "CTRL_C",
    "advise",
    "interactive",
    "in_finalizer",
    "newest_checkpoint",
    "Requests",
    "Stopping",
    "saved_at",
]


_RUNTIME = pathlib.Path(__file__).parent.parent


# The loop's own bookkeeping: a signal landing in these files is held back, wherever the loop stands.
OWN_FILES = frozenset(
    str(path)
    for path in [
        *(_RUNTIME.parent / "core").glob("*.py"),
        *(
            _RUNTIME / name
            for name in (
                "engine/run.py",
                "engine/walker.py",
                "engine/transaction.py",
                "engine/outputs.py",
                "engine/peers.py",
                "engine/interpreter.py",
                "engine/preemption.py",
                "step/driver.py",
                "step/rng.py",
                "data/feed.py",
                "data/positioning.py",
            )
        ),
    ]
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
        # Python drops an exception (a callback it cannot tell apart, below) the raise is lost, and the next unit
        # raises it. In a finalizer it is only held: raised there it would stop the finalizer's work half-way.
        self.pending = True
        if (
            self.open
            and not self.holding
            and (frame is None or frame.f_code.co_filename not in OWN_FILES)
            and not in_finalizer(frame)
        ):
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


# The standard library's weak references run their callbacks from these files (``weakref.finalize``, the weak
# dictionaries and sets); a signal landing there is held, as one landing in normal weakref code may be (harmless).
_WEAKREF_FILES = frozenset({weakref.__file__, inspect.getfile(weakref.WeakSet)})


def in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a finalizer or a ``gc`` callback, where Python drops what is raised.

    There a ``KeyboardInterrupt`` would be printed as "Exception ignored" and
    the rest of the finalizer skipped: a ``DataLoader`` iterator's
    ``__del__`` would leave its worker processes running. Found by the
    frames it runs in: a ``__del__``, a weakref callback of the standard
    library, a function in ``gc.callbacks``.
    """
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename in _WEAKREF_FILES or code in callbacks:
            return True
        frame = frame.f_back
    return False


def interactive() -> bool:
    """Whether a person drives this process: a notebook or IPython shell, or the Python REPL (``-i``)."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _advice(error: KeyboardInterrupt) -> str | None:
    return getattr(error, "pimm_fn_advice", None)


def _advising(previous):
    """``sys.excepthook`` printing a script's Ctrl-C advice instead of the loop's traceback; the rest as before."""

    def hook(kind, error, traceback):
        advice = _advice(error) if isinstance(error, KeyboardInterrupt) else None
        if advice is None:
            return previous(kind, error, traceback)
        print(f"KeyboardInterrupt\n{advice}", file=sys.stderr, flush=True)

    hook.pimm_fn_advising = True
    return hook


def newest_checkpoint(model_dir) -> tuple | None:
    """``(step, path)`` of the newest usable checkpoint in ``model_dir``, the one ``resume="auto"`` takes (``None``:
    none, or no ``model_dir``). Read where it lives, no collective: a Ctrl-C may stop each rank elsewhere."""
    if model_dir is None:
        return None
    try:
        info = checkpoint.find_checkpoint(model_dir)
    except (OSError, ValueError):  # none there, or none intact: running again starts over, or says why not
        return None
    return info.step, info.path


def advise(
    error: KeyboardInterrupt, stopped: str, *, newest: tuple | None, model_dir, auto: bool, saves_on_interrupt: bool
) -> None:
    """Attach to a Ctrl-C escaping ``run()`` in a script the line its exit prints in place of the traceback.

    The one line a script's Ctrl-C says (the loop's "run() continues exactly"
    is not said there: a script cannot). ``stopped``: where, as ``"during
    step 24 (the train step)"`` or ``"after step 23"``; ``newest``: ``(step,
    path)`` of the newest checkpoint in ``model_dir`` (``None``: none, or no
    ``save_dir``), the one ``resume="auto"`` takes; ``auto``: the loop was
    built with ``resume="auto"``, so running the script again resumes by
    itself. A notebook or the REPL is left alone: there ``run()`` continues
    exactly, and the traceback is the interpreter's to show.

    >>> error = KeyboardInterrupt()
    >>> advise(error, "during step 24 (the train step)", newest=(20, "runs/a/model/last"), model_dir="runs/a/model",
    ...        auto=True, saves_on_interrupt=False)
    >>> print(error.pimm_fn_advice)
    [pimm_fn] stopped by Ctrl-C during step 24 (the train step); the last checkpoint is step 20 in runs/a/model/last. Run the script again: it resumes from step 20 (resume="auto"); to save on Ctrl-C first, pass preemption=pimm_fn.Preemption(save_on_interrupt=True)
    """
    if interactive():
        return
    if model_dir is None:
        where, how = "this run has no save_dir: nothing was saved", "Running the script again starts over"
    elif newest is None:
        where, how = f"no checkpoint is in {model_dir}", "Running the script again starts over"
    else:
        where = f"the last checkpoint is step {newest[0]} in {newest[1]}"
        how = (
            f'Run the script again: it resumes from step {newest[0]} (resume="auto")'
            if auto
            else 'To continue from it, run the script again with loop(..., resume="auto")'
        )
    first = (
        ""
        if saves_on_interrupt or model_dir is None
        else "; to save on Ctrl-C first, pass preemption=pimm_fn.Preemption(save_on_interrupt=True)"
    )
    setattr(error, "pimm_fn_advice", f"[pimm_fn] stopped by Ctrl-C {stopped}; {where}. {how}{first}")
    if not getattr(sys.excepthook, "pimm_fn_advising", False):
        sys.excepthook = _advising(sys.excepthook)


MAX_TIME = "max_time"


_SAVING_ON_CTRL_C = b"[pimm_fn] Ctrl-C: saving at the end of this step, then exiting (Ctrl-C again to stop at once)\n"


class Requests:
    """The signal handlers while a run trains: a signal only records a request (``reason``, its name).

    With ``interrupt`` (``save_on_interrupt`` in a script) the first Ctrl-C
    is a request too; a second one goes to the handler before it (the loop's
    Ctrl-C: a ``KeyboardInterrupt``).
    """

    def __init__(self, signals: tuple, *, interrupt: bool = False, tell: bool = True):
        self.signals = tuple(signal.Signals[name] for name in signals)
        self.interrupt = interrupt
        self.reason: str | None = None
        self._tell = tell  # the first Ctrl-C says what it does (rank 0, with a console)
        self._depth = 0
        self._previous: dict = {}

    def __enter__(self) -> "Requests":
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
            if self.interrupt:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)
        self._depth += 1
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            # Left by a preemption stop in a script: the preempting signals stay recorded, not obeyed, with no
            # moment between putting the old handlers back and ``hold`` where one would kill the process.
            kept = self.signals if exc_type is not None and issubclass(exc_type, Preempted) and _holds() else ()
            for sig, previous in self._previous.items():
                if sig not in kept:
                    signal.signal(sig, previous)
            self._previous.clear()

    def hold(self) -> None:
        """A preemption stop left ``run()``: until the process exits, the preempting signals are recorded, not obeyed.

        In a script only (a notebook's kernel lives on: its handlers are put
        back as usual). Python puts its own handlers back to the default at
        its finalization, so from ``atexit`` on they are ignored: the
        process's teardown (torch's included) ends with the stop's exit code.
        """
        if not _holds():
            return
        held = self.signals + ((signal.SIGINT,) if self.interrupt else ())
        for sig in held:
            signal.signal(sig, self._handle)
        if not _HELD:
            atexit.register(_ignore_held)
        _HELD.update(held)

    def _handle(self, signum, frame) -> None:
        if self.reason is None:
            self.reason = signal.Signals(signum).name

    def _interrupt(self, signum, frame) -> None:
        if self.reason is None:
            self.reason = "SIGINT"
            if self._tell:  # a raw write: print() inside a signal handler may re-enter a write it interrupted
                with contextlib.suppress(OSError, ValueError):
                    os.write(sys.stderr.fileno(), _SAVING_ON_CTRL_C)
            return
        previous = self._previous.get(signal.SIGINT)
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt


_HELD: set = set()  # the signals a preemption stop holds until this process exits (Requests.hold)


def _holds() -> bool:
    """Whether a preemption stop holds its signals here: in a script's main thread (a notebook's kernel lives on)."""
    return not interactive() and threading.current_thread() is threading.main_thread()


def _ignore_held() -> None:
    """At exit (``atexit``, before Python resets its handlers): the held signals are ignored to the end."""
    for sig in _HELD:
        signal.signal(sig, signal.SIG_IGN)


class Stopping:
    """The run's preemption and time budget: asked at each step boundary, on every rank at the same steps.

    Several ranks compare at a cadence rank 0 chooses (about once a second,
    ``pimm_fn.core.preemption.next_cadence``) and sends with each
    comparison, or every ``Preemption.check_every`` steps.

    Args:
        option: the ``Preemption`` value.
        max_time: seconds this process may train (``None``: no limit).
        world_size: the ranks that must agree.
        ticks: whether some hook listens to ``Elapsed`` (the clock is then delivered at each check).
        tell: whether this process says what a Ctrl-C does (rank 0, with a console).
    """

    def __init__(self, option, *, max_time: float | None, world_size: int, ticks: bool, tell: bool = True):
        self.option = option
        self.requests = Requests(option.signals, interrupt=option.save_on_interrupt and not interactive(), tell=tell)
        self.limit = max_time
        self.lagged = lags(world_size)
        self.every = option.check_every
        self.listen(ticks)
        self.checks = 0  # reductions started (several ranks), for tests and benchmarks
        self._start = time.monotonic()
        self._last = 0.0  # rank 0's clock at the last check (seconds since loop())
        self._next: int | None = None  # the step of the next comparison (several ranks)
        self._cadence = self.every or 1
        self._issued = 0
        self._group = None  # made at the first comparison, where every rank is (a loop never trained makes none)
        self._buffer = torch.zeros(4, dtype=torch.int64)
        self._view = self._buffer.numpy()  # read and written through numpy: a CPU buffer, never a device sync
        self._work = None

    def listen(self, ticks: bool) -> None:
        """Deliver the clock (``Elapsed``) at each check or not: at build, and when ``replace`` changes the hooks."""
        self.ticks = ticks
        # The boundary work beyond a flag read: a reduction (several ranks) or a clock (a limit, an Elapsed hook).
        self.busy = self.lagged or self.limit is not None or ticks

    def at_boundary(self, step: int) -> tuple:
        """``(reason to stop or None, Elapsed or None)`` at the boundary of ``step``: the same on every rank."""
        if not self.busy:
            return self.requests.reason, None
        if not self.lagged:
            now, interval = self._clock()
            reason = self.requests.reason
            if (
                reason is None
                and self.limit is not None
                and time_is_up(now, interval, self.limit, self.option.margin, lagged=False)
            ):
                reason = MAX_TIME
            return reason, ev.Elapsed(step, round(now, 3)) if self.ticks else None
        if self._next is None:  # the first boundary of this process: one step trained
            self._next = step if self.every is None else -(-step // self.every) * self.every
            self._issued = step - 1
        if step < self._next:
            return None, None
        reason, seconds = self._read()
        self._next = step + self._cadence
        if reason is None:
            self._issue(step)
        return reason, ev.Elapsed(step, seconds) if self.ticks and seconds is not None else None

    def _clock(self) -> tuple:
        """(seconds since loop(), seconds since the last reading)."""
        now = time.monotonic() - self._start
        interval, self._last = now - self._last, now
        return now, interval

    def _read(self) -> tuple:
        """The answer of the reduction started at the previous check: (reason or None, rank 0's seconds or None)."""
        if self._work is None:
            return None, None
        self._work.wait()
        self._work = None
        signum, time_up, millis, cadence = (int(x) for x in self._view)
        if self.every is None:
            self._cadence = cadence  # rank 0's choice, the same on every rank
        if signum:
            return signal.Signals(signum).name, millis / 1000
        return (MAX_TIME if time_up else None), millis / 1000

    def _issue(self, step: int) -> None:
        """Start this check's reduction: this rank's request; rank 0's clock, "time is up" and next cadence."""
        reason = self.requests.reason
        signum = int(signal.Signals[reason]) if reason is not None else 0
        time_up = millis = cadence = 0
        if dist.rank() == 0:
            now, interval = self._clock()
            millis = int(now * 1000)
            cadence = next_cadence(interval, step - self._issued)
            if self.limit is not None:
                time_up = int(time_is_up(now, interval, self.limit, self.option.margin, lagged=True))
        self._issued = step
        self._view[:] = (signum, time_up, millis, cadence)
        if self._group is None:
            self._group = dist.new_gloo_group()
        self._work = td.all_reduce(self._buffer, op=td.ReduceOp.MAX, group=self._group, async_op=True)
        self.checks += 1

    def settle(self) -> None:
        """Wait for the reduction in flight (the run ended): no collective is left behind in the group."""
        if self._work is not None:
            self._work.wait()
            self._work = None

    def close(self, *, alike: bool = True) -> None:
        """The run ended, or left ``run()`` on an error: the reduction in flight waited for, the group destroyed.

        Nothing of pimm_fn's is left running beside the script's own groups
        once ``run()`` returns; a run that goes on makes a new group at its
        next comparison (every rank at the same step). Not ``alike`` (the
        ranks stopped in different places, or it is not known): a reduction in
        flight may wait for a rank that never starts it, and the ranks must
        not disagree on whether the group exists, so it is left as it is (to
        the process group's shutdown, ``pimm_fn.runtime.engine.peers``, or the exit).
        """
        if not alike:
            return
        self.settle()
        group, self._group = self._group, None
        dist.destroy_group(group)


def preemption_save(step: int, reason: str) -> SaveCheckpoint:
    """The save a preemption makes: a normal checkpoint of ``step``, synchronous, its marker saying ``reason``."""
    return SaveCheckpoint(step, saved_for=reason)


def saved_at(ctx, step: int):
    """The checkpoint of ``step`` this run wrote, as named where it lives: ``model_dir/last`` (``last.pth``), or on
    an fsspec store ``model_dir/last-<step>-<token>`` (``pimm_fn.checkpoint.rolling_checkpoint``)."""
    return checkpoint.rolling_checkpoint(ctx.model_dir, step, ctx.checkpoint_format)
