"""``torch.profiler`` for a run: the handler of ``pimm_fn.profile``'s effects, and the one place a profiler is built.

``Profiler`` is one run's handler (``profiler_handlers()`` makes a fresh
one for each run, so no profiler is shared between runs): ``StartProfiler``
enters a ``torch.profiler.profile`` with the hook's schedule and a
``tensorboard_trace_handler`` writing into ``dir`` (default
``save_dir/profiler``), ``StepProfiler`` steps it after each training step
of the window and stops it after the last, ``StopProfiler`` stops it where
training ended. The interpreter closes the handler at the end of training
and on an error: a profiler still running is stopped (what it recorded is
written). ``new_profile`` builds the profiler for this handler and for
``pimm_fn.compat``'s ``RuntimeProfiler``: CPU, plus CUDA when a GPU is there.
"""

import contextlib
import warnings
from pathlib import Path

import torch

from pimm_fn.hooks.profiler import StartProfiler, StepProfiler, StopProfiler

__all__ = ["Profiler", "new_profile", "profiler_handlers"]


def new_profile(*, memory: bool = False, shapes: bool = False, schedule=None, on_trace_ready=None):
    """A ``torch.profiler.profile`` of the CPU, and of CUDA when available (not entered yet)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        profile_memory=memory,
        record_shapes=shapes,
        schedule=schedule,
        on_trace_ready=on_trace_ready,
    )


def trace_dir(effect: StartProfiler, ctx) -> Path:
    """Where the traces go: the hook's ``dir``, else ``save_dir/profiler``."""
    if effect.dir is not None:
        return Path(effect.dir)
    if ctx.save_dir is None:
        raise ValueError(
            "profile(): this run has no save_dir to write the traces into: pass profile(dir=...) or loop(save_dir=...)"
        )
    return Path(ctx.save_dir) / "profiler"


@contextlib.contextmanager
def _cycles_apart():
    """torch warns that each cycle's events are cleared when the next begins: meant so, each is its own trace file."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
        yield


class Profiler:
    """One run's ``torch.profiler``: the handler of ``StartProfiler``, ``StepProfiler`` and ``StopProfiler``."""

    def __init__(self):
        self._running = None  # the entered torch.profiler.profile, while the window lasts

    def __call__(self, effect, state, ctx) -> tuple:
        if isinstance(effect, StartProfiler):
            self.close()  # a window begun again (a run replayed from its start): the old one ends first
            where = trace_dir(effect, ctx)
            where.mkdir(parents=True, exist_ok=True)
            schedule = torch.profiler.schedule(
                wait=effect.wait, warmup=effect.warmup, active=effect.active, repeat=effect.repeat
            )
            handler = torch.profiler.tensorboard_trace_handler(str(where), worker_name=f"rank{ctx.rank}")
            self._running = new_profile(
                memory=effect.memory, shapes=effect.shapes, schedule=schedule, on_trace_ready=handler
            )
            with _cycles_apart():
                self._running.__enter__()
            cycle = effect.wait + effect.warmup + effect.active
            ctx.say(
                f"profiling steps {effect.step + 1}-{effect.step + effect.repeat * cycle} (recording the last "
                f"{effect.active} of every {cycle}); traces in {where}"
            )
        elif self._running is not None:  # none: resumed inside a window this process did not start
            if isinstance(effect, StepProfiler):
                with _cycles_apart():
                    self._running.step()
                if effect.last:
                    self.close()
            elif isinstance(effect, StopProfiler):
                self.close()
        return ()

    def close(self) -> None:
        """Stop the profiler if it runs (its recording, if any, is written)."""
        running, self._running = self._running, None
        if running is not None:
            running.__exit__(None, None, None)

    def __repr__(self):
        return f"Profiler(running={self._running is not None})"


def profiler_handlers() -> dict:
    """The handlers of ``pimm_fn.profile``'s effects, for one run: one ``Profiler`` for all three."""
    profiler = Profiler()
    return {StartProfiler: profiler, StepProfiler: profiler, StopProfiler: profiler}
