"""pimm's ``ResourceUtilizationLogger``, ``RuntimeProfiler`` and ``PushToHub`` as pure hooks.

Each hook decides *when* from the global step; the measuring, profiling
and uploading are effects of ``pimm_fn.compat.effects`` carried out by
``pimm_fn.compat.HANDLERS``.

Differences from pimm, each on purpose: the resource cadence is the global
step (pimm counts its own calls, restarting at 0 on resume); the profiler
profiles the first ``warm_up + 1`` steps of the run itself instead of
drawing extra batches from the train loader before training (which shifts
the data and RNG the run trains on, PIMM.md 2.7), and ``interrupt=True``
stops the run cleanly after them (``Stop``) instead of ``sys.exit(0)``;
``PushToHub`` uploads once after training, blocking, and takes no token in
the config (a token there ends up in checkpoints and logs: log in with
``huggingface-cli login`` or set ``HF_TOKEN``).

>>> import pimm_fn as pf
>>> [e.step for e in pf.plan([resource_utilization_logger(4)], iters_per_epoch=6, max_epochs=2)]
[4, 8, 12]
"""

from typing import ClassVar

import attrs

from pimm_fn.compat.effects import LogResources, PushToHub, StartProfiler, StopProfiler
from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Stop
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, non_empty_str, one_of, optional

__all__ = ["resource_utilization_logger", "runtime_profiler", "ProfilerState", "push_to_hub"]


def _args(hook, defaults: dict) -> str:
    """The fields of ``hook`` that differ from ``defaults``, as ``name=value``."""
    return ", ".join(f"{k}={getattr(hook, k)!r}" for k, v in defaults.items() if getattr(hook, k) != v)


# -- ResourceUtilizationLogger ---------------------------------------------------------------------------------------
_RESOURCE_DEFAULTS = dict(prefix="resources", log_per_gpu=False, log_cpu=True, log_system_memory=True,
                          per_process=True)


@attrs.frozen(repr=False)
class _ResourceUtilizationLogger:
    factory_name: ClassVar[str] = "resource_utilization_logger"
    events: ClassVar[tuple] = (ev.AfterStep,)
    emits: ClassVar[tuple] = (LogResources,)
    rank_consistent: ClassVar[bool] = True  # emits nothing collective
    reads_outputs: ClassVar[bool] = False
    log_frequency: int = attrs.field(default=10, validator=int_at_least(1))
    prefix: str = attrs.field(default="resources", validator=non_empty_str)
    log_per_gpu: bool = attrs.field(default=False, validator=is_bool)
    log_cpu: bool = attrs.field(default=True, validator=is_bool)
    log_system_memory: bool = attrs.field(default=True, validator=is_bool)
    per_process: bool = attrs.field(default=True, validator=is_bool)

    @property
    def every(self) -> int:
        return self.log_frequency

    def __call__(self, state, event):
        return state, (LogResources(event.step, self.prefix, self.log_per_gpu, self.log_cpu, self.log_system_memory,
                                    self.per_process),)

    def __repr__(self):
        rest = _args(self, _RESOURCE_DEFAULTS)
        return f"resource_utilization_logger({self.log_frequency}{', ' + rest if rest else ''})"


@hook_factory
def resource_utilization_logger(log_frequency: int = 10, prefix: str = "resources", log_per_gpu: bool = False,
                                log_cpu: bool = True, log_system_memory: bool = True, per_process: bool = True):
    """pimm's ``ResourceUtilizationLogger``: CPU, memory and CUDA memory every ``log_frequency`` global steps.

    Emits:
        ``LogResources(step, ...)`` (main rank); the handler logs
        ``Log(step, "resources", {"<prefix>/process_rss_gb": ...,
        "<prefix>/gpu_memory_allocated_gb": ..., ...})`` with pimm's names:
        with ``per_process`` this process's RSS (and CPU use, threads and
        virtual size when psutil is installed), else the machine's memory
        and load; CUDA memory only once CUDA is initialized.

    >>> resource_utilization_logger(50, per_process=False)
    resource_utilization_logger(50, per_process=False)
    """
    return _ResourceUtilizationLogger(log_frequency, prefix, log_per_gpu, log_cpu, log_system_memory, per_process)


# -- RuntimeProfiler -------------------------------------------------------------------------------------------------
@register_slot_type
@attrs.frozen
class ProfilerState:
    """The global step after which the profiler stops (0: not profiling)."""

    stop_at: int = 0


_PROFILER_DEFAULTS = dict(forward=True, backward=True, interrupt=False, warm_up=2, sort_by="cuda_time_total",
                          row_limit=30, memory=True)


@attrs.frozen(repr=False)
class _RuntimeProfiler:
    factory_name: ClassVar[str] = "runtime_profiler"
    events: ClassVar[tuple] = (ev.BeforeTrain, ev.AfterStep, ev.AfterTrain)
    emits: ClassVar[tuple] = (StartProfiler, StopProfiler, Stop)
    rank_consistent: ClassVar[bool] = True  # decisions read the global step only
    reads_outputs: ClassVar[bool] = False
    forward: bool = attrs.field(default=True, validator=is_bool)
    backward: bool = attrs.field(default=True, validator=is_bool)
    interrupt: bool = attrs.field(default=False, validator=is_bool)
    warm_up: int = attrs.field(default=2, validator=int_at_least(0))
    sort_by: str = attrs.field(default="cuda_time_total", validator=non_empty_str)
    row_limit: int = attrs.field(default=30, validator=int_at_least(1))
    memory: bool = attrs.field(default=True, validator=is_bool)

    def init(self) -> ProfilerState:
        return ProfilerState()

    def __call__(self, state, event):
        step = state.progress.global_step
        stop = StopProfiler(step, self.sort_by, self.row_limit)
        match event:
            case ev.BeforeTrain():
                return state.with_slot(ProfilerState(step + self.warm_up + 1)), (StartProfiler(step, self.memory),)
            case ev.AfterStep(step=at) if state.slot.stop_at and at >= state.slot.stop_at:
                halt = (Stop(at, "RuntimeProfiler(interrupt=True): profiling done"),) if self.interrupt else ()
                return state.with_slot(ProfilerState()), (attrs.evolve(stop, step=at), *halt)
            case ev.AfterTrain() if state.slot.stop_at:  # a run shorter than the window
                return state.with_slot(ProfilerState()), (stop,)
        return state, ()

    def __repr__(self):
        return f"runtime_profiler({_args(self, _PROFILER_DEFAULTS)})"


@hook_factory
def runtime_profiler(forward: bool = True, backward: bool = True, interrupt: bool = False, warm_up: int = 2,
                     sort_by: str = "cuda_time_total", row_limit: int = 30, memory: bool = True):
    """pimm's ``RuntimeProfiler``: ``torch.profiler`` over the run's first ``warm_up + 1`` steps.

    Whole steps are profiled (forward, backward and the optimizer step;
    ``forward``/``backward`` are accepted as pimm's and not separated).

    Emits:
        ``StartProfiler`` before training (each rank); ``StopProfiler`` after
        global step ``start + warm_up + 1`` (or after training, if sooner),
        whose handler writes ``save_dir/profiler/trace.json`` and
        ``table.txt`` (sorted by ``sort_by``; CPU time without CUDA); then,
        with ``interrupt``, ``Stop``.

    State:
        ``ProfilerState(stop_at)``.

    >>> runtime_profiler(warm_up=1, interrupt=True)
    runtime_profiler(interrupt=True, warm_up=1)
    """
    return _RuntimeProfiler(forward, backward, interrupt, warm_up, sort_by, row_limit, memory)


# -- PushToHub -------------------------------------------------------------------------------------------------------
_HUB_DEFAULTS = dict(checkpoint="model_best", private=True, revision=None, name=None)


@attrs.frozen(repr=False)
class _PushToHub:
    factory_name: ClassVar[str] = "push_to_hub"
    events: ClassVar[tuple] = (ev.AfterTrain,)
    emits: ClassVar[tuple] = (PushToHub,)
    rank_consistent: ClassVar[bool] = True
    reads_outputs: ClassVar[bool] = False
    repo_id: str = attrs.field(validator=non_empty_str)
    checkpoint: str = attrs.field(default="model_best", validator=one_of("model_best", "last"))
    private: bool = attrs.field(default=True, validator=is_bool)
    revision: str | None = attrs.field(default=None, validator=optional(non_empty_str))
    name: str | None = attrs.field(default=None, validator=optional(non_empty_str))

    def __call__(self, state, event):
        return state, (PushToHub(state.progress.global_step, self.repo_id, self.checkpoint, self.private,
                                 self.revision, self.name),)

    def __repr__(self):
        rest = _args(self, _HUB_DEFAULTS)
        return f"push_to_hub({self.repo_id!r}{', ' + rest if rest else ''})"


@hook_factory
def push_to_hub(repo_id: str, checkpoint: str = "model_best", private: bool = True, revision: str | None = None,
                name: str | None = None):
    """pimm's ``PushToHub`` (``on_train_end``): upload the final weights to the Hugging Face Hub after training.

    Emits:
        ``PushToHub(step, repo_id, ...)`` at ``AfterTrain`` (main rank); the
        handler copies ``model_best.pth`` (``checkpoint="model_best"``) or
        the last weights (``"last"``) to ``save_dir/hub/<name or
        checkpoint>.pth`` and uploads that folder with
        ``huggingface_hub.HfApi().upload_folder`` (the ``hub`` extra).

    >>> push_to_hub("someone/model", checkpoint="last")
    push_to_hub('someone/model', checkpoint='last')
    """
    return _PushToHub(repo_id, checkpoint, private, revision, name)
