"""A hook that profiles a window of training steps with ``torch.profiler``, as its ``schedule`` does.

``profile(wait=1, warmup=1, active=3)`` decides *which* steps, from the
global step alone: after ``skip_first`` steps the profiler starts; each of
the next ``repeat`` cycles of ``wait + warmup + active`` steps skips
``wait`` steps, warms up for ``warmup`` and records ``active``, and each
recorded cycle is written as a TensorBoard trace. The profiling itself
(``torch.profiler.profile`` with that schedule and
``tensorboard_trace_handler``) is the runtime's
(``pimm_fn.runtime.handlers.profiler``): on every rank its own profiler and trace
file (``rank<r>`` in the file name), under ``dir`` (default
``save_dir/profiler``). View with ``tensorboard --logdir <dir>`` (the
``torch-tb-profiler`` plug-in) or open the ``.pt.trace.json`` file in
Perfetto or ``chrome://tracing``.

The window is counted in global steps of the run: a run resumed inside it
does not profile the rest (its profiler was in the process that stopped);
a run resumed before it profiles it as planned.
"""

from typing import ClassVar

import attrs

from pimm_fn.core import events as ev
from pimm_fn.core.effects import Effect, Scope
from pimm_fn.core.fold import called_plainly
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import PathLike, instance_of, int_at_least, optional

__all__ = ["profile", "StartProfiler", "StepProfiler", "StopProfiler"]


@attrs.frozen
class StartProfiler(Effect):
    """Start ``torch.profiler`` after global step ``step`` with this schedule; every rank its own (``LOCAL``)."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    wait: int
    warmup: int
    active: int
    repeat: int
    dir: str | None = None
    memory: bool = False
    shapes: bool = False


@attrs.frozen
class StepProfiler(Effect):
    """Tell the running profiler that global step ``step`` ended; ``last``: the window ends, stop it."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int
    last: bool = False


@attrs.frozen
class StopProfiler(Effect):
    """Training ended inside the window at ``step``: stop the profiler, writing what it recorded."""

    scope: ClassVar[Scope] = Scope.LOCAL
    step: int


_STEPS = int_at_least(0)


@attrs.frozen(repr=False)
class _Profile:
    factory_name: ClassVar[str] = "profile"
    events: ClassVar[tuple] = (ev.BeforeTrain, ev.AfterStep, ev.AfterTrain)
    emits: ClassVar[tuple] = (StartProfiler, StepProfiler, StopProfiler)
    reads_outputs: ClassVar[bool] = False  # the step numbers alone: no output is read off the device for it
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    wait: int = attrs.field(default=1, validator=_STEPS)
    warmup: int = attrs.field(default=1, validator=_STEPS)
    active: int = attrs.field(default=3, validator=int_at_least(1))
    repeat: int = attrs.field(default=1, validator=int_at_least(1))
    skip_first: int = attrs.field(default=0, validator=_STEPS)
    dir: str | None = attrs.field(
        default=None, converter=lambda d: d if d is None else str(d), validator=optional(instance_of(str))
    )
    memory: bool = attrs.field(default=False, validator=instance_of(bool))
    shapes: bool = attrs.field(default=False, validator=instance_of(bool))

    @property
    def last_step(self) -> int:
        """The global step the window ends with: its last recorded step."""
        return self.skip_first + self.repeat * (self.wait + self.warmup + self.active)

    def _start(self) -> StartProfiler:
        return StartProfiler(
            self.skip_first, self.wait, self.warmup, self.active, self.repeat, self.dir, self.memory, self.shapes
        )

    def update(self, slot, state, event):
        """The hook protocol's ``update`` (no slot): called so, it builds no ``State`` after a hook with one."""
        p = state.progress
        match event:
            case ev.BeforeTrain() if self.skip_first == 0 and p.global_step == 0:
                return slot, state, (self._start(),)
            case ev.AfterStep(step=step) if step == self.skip_first:
                return slot, state, (self._start(),)
            case ev.AfterStep(step=step) if self.skip_first < step <= self.last_step:
                return slot, state, (StepProfiler(step, last=step == self.last_step),)
            case ev.AfterTrain() if self.skip_first < p.global_step < self.last_step:
                return slot, state, (StopProfiler(p.global_step),)
        return slot, state, ()

    def __call__(self, state, event):
        return called_plainly(self, state, event)

    def __repr__(self):
        given = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in attrs.fields(type(self))
            if getattr(self, f.name) != f.default
        ]
        return f"profile({', '.join(given)})"


@hook_factory
def profile(
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    skip_first: int = 0,
    *,
    dir: str | PathLike | None = None,
    memory: bool = False,
    shapes: bool = False,
) -> _Profile:
    """Profile a window of training steps with ``torch.profiler``, a TensorBoard trace per recorded cycle.

    The schedule is ``torch.profiler.schedule``'s: after ``skip_first``
    steps, ``repeat`` cycles of ``wait`` idle steps, ``warmup`` steps
    profiled but not kept, and ``active`` steps recorded. Each rank writes
    its own trace into ``dir`` (default ``save_dir/profiler``). See the
    module docstring.

    Args:
        wait: idle steps of each cycle, before it records (>= 0).
        warmup: steps of each cycle profiled but not kept, after ``wait`` and
            before it records (>= 0).
        active: steps each cycle records (>= 1).
        repeat: cycles (>= 1).
        skip_first: global steps before the first cycle (>= 0).
        dir: where the traces go; ``None``: ``save_dir/profiler``.
        memory: the profiler's ``profile_memory``.
        shapes: the profiler's ``record_shapes``.

    Emits:
        ``StartProfiler`` at ``BeforeTrain`` (``skip_first=0``) or after
        step ``skip_first``; ``StepProfiler(step)`` after each step of the
        window, ``last=True`` on its final one; ``StopProfiler`` at
        ``AfterTrain`` when training ends inside the window. All ``LOCAL``.

    State:
        None: the window is a function of the global step.

    >>> profile(wait=1, warmup=1, active=2, skip_first=3)
    profile(active=2, skip_first=3)
    >>> profile().last_step
    5
    """
    return _Profile(wait, warmup, active, repeat, skip_first, dir, memory, shapes)
