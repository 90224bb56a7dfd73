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

The handlers of ``LogResources``, ``StartProfiler``/``StopProfiler`` and ``PushToHub`` (see ``compat.monitors``).

No new dependency: memory comes from ``/proc`` (or ``resource``) when
psutil is not installed; ``huggingface_hub`` is imported only when an
upload runs (``pip install pimm_fn[hub]``).
"""

import importlib
import os
import resource
import sys
from pathlib import Path
from typing import ClassVar

import attrs
import torch

from pimm_fn import checkpoint
from pimm_fn.compat.effects import LogResources, PushToHub, StartProfiler, StopProfiler
from pimm_fn.core import events as ev
from pimm_fn.core.codec import register_slot_type
from pimm_fn.core.effects import Log, Stop
from pimm_fn.core.hook_list import hook_factory
from pimm_fn.core.validate import int_at_least, is_bool, non_empty_str, one_of, optional
from pimm_fn.runtime.handlers import dispatch as runtime_handlers
from pimm_fn.runtime.handlers.profiler import new_profile

__all__ = [
    "resource_utilization_logger",
    "runtime_profiler",
    "ProfilerState",
    "push_to_hub",
    "log_resources",
    "Profiler",
    "upload_to_hub",
]


def _args(hook, defaults: dict) -> str:
    """The fields of ``hook`` that differ from ``defaults``, as ``name=value``."""
    return ", ".join(f"{k}={getattr(hook, k)!r}" for k, v in defaults.items() if getattr(hook, k) != v)


# -- ResourceUtilizationLogger ---------------------------------------------------------------------------------------
_RESOURCE_DEFAULTS = dict(prefix="resources", log_per_gpu=False, log_cpu=True, log_system_memory=True, per_process=True)


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
        return state, (
            LogResources(
                event.step, self.prefix, self.log_per_gpu, self.log_cpu, self.log_system_memory, self.per_process
            ),
        )

    def __repr__(self):
        rest = _args(self, _RESOURCE_DEFAULTS)
        return f"resource_utilization_logger({self.log_frequency}{', ' + rest if rest else ''})"


@hook_factory
def resource_utilization_logger(
    log_frequency: int = 10,
    prefix: str = "resources",
    log_per_gpu: bool = False,
    log_cpu: bool = True,
    log_system_memory: bool = True,
    per_process: bool = True,
) -> _ResourceUtilizationLogger:
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


_PROFILER_DEFAULTS = dict(
    forward=True, backward=True, interrupt=False, warm_up=2, sort_by="cuda_time_total", row_limit=30, memory=True
)


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
def runtime_profiler(
    forward: bool = True,
    backward: bool = True,
    interrupt: bool = False,
    warm_up: int = 2,
    sort_by: str = "cuda_time_total",
    row_limit: int = 30,
    memory: bool = True,
) -> _RuntimeProfiler:
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
        return state, (
            PushToHub(
                state.progress.global_step, self.repo_id, self.checkpoint, self.private, self.revision, self.name
            ),
        )

    def __repr__(self):
        rest = _args(self, _HUB_DEFAULTS)
        return f"push_to_hub({self.repo_id!r}{', ' + rest if rest else ''})"


@hook_factory
def push_to_hub(
    repo_id: str,
    checkpoint: str = "model_best",
    private: bool = True,
    revision: str | None = None,
    name: str | None = None,
) -> _PushToHub:
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


_GB = 1e9


def _proc_kb(path: str, field: str) -> float | None:
    """``field``'s value in kB from a ``/proc`` status file, or None off Linux."""
    try:
        with open(path) as file:
            for line in file:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _psutil():
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


_PROCESSES: dict = {}  # pid -> psutil.Process: cpu_percent measures since the previous call on the same object


def _process(psutil):
    return _PROCESSES.setdefault(os.getpid(), psutil.Process())


def _gpu(effect: LogResources) -> dict:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    if effect.per_gpu and not effect.per_process:
        values = {}
        for i in range(torch.cuda.device_count()):
            values[f"gpu{i}_memory_allocated_gb"] = torch.cuda.memory_allocated(i) / _GB
            values[f"gpu{i}_memory_reserved_gb"] = torch.cuda.memory_reserved(i) / _GB
        return values
    device = torch.cuda.current_device()
    return {
        "gpu_memory_allocated_gb": torch.cuda.memory_allocated(device) / _GB,
        "gpu_memory_reserved_gb": torch.cuda.memory_reserved(device) / _GB,
        "gpu_memory_max_allocated_gb": torch.cuda.max_memory_allocated(device) / _GB,
    }


def _cpu(effect: LogResources) -> dict:
    psutil, values = _psutil(), {}
    if effect.per_process:
        process = _process(psutil) if psutil else None
        if effect.cpu and process is not None:
            values["process_cpu_percent"] = process.cpu_percent(interval=None)  # since the previous record (first: 0)
            values["process_num_threads"] = process.num_threads()
        if effect.memory:
            if process is not None:
                info = process.memory_info()
                values["process_rss_gb"], values["process_vms_gb"] = info.rss / _GB, info.vms / _GB
            else:
                rss = _proc_kb("/proc/self/status", "VmRSS")
                if rss is not None:
                    values["process_rss_gb"] = rss * 1024 / _GB
                else:  # the peak, where /proc is missing (kB on Linux, bytes on macOS)
                    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                    values["process_max_rss_gb"] = peak * (1 if sys.platform == "darwin" else 1024) / _GB
        return values
    if effect.cpu:
        load1, load5, load15 = os.getloadavg()
        cpus = os.cpu_count() or 1
        values.update(
            load_avg_1min=load1,
            load_avg_5min=load5,
            load_avg_15min=load15,
            load_per_cpu_1min=load1 / cpus,
            num_cpus=cpus,
        )
        if psutil is not None:
            values["cpu_percent"] = psutil.cpu_percent(interval=None)
    if effect.memory:
        if psutil is not None:
            memory = psutil.virtual_memory()
            values.update(
                system_memory_used_gb=memory.used / _GB,
                system_memory_total_gb=memory.total / _GB,
                system_memory_pct=memory.percent,
            )
        else:
            total, free = _proc_kb("/proc/meminfo", "MemTotal"), _proc_kb("/proc/meminfo", "MemAvailable")
            if total and free is not None:
                values.update(
                    system_memory_used_gb=(total - free) * 1024 / _GB,
                    system_memory_total_gb=total * 1024 / _GB,
                    system_memory_pct=100.0 * (total - free) / total,
                )
    return values


def log_resources(effect: LogResources, state, ctx) -> tuple:
    """Measure and log ``Log(step, "resources", {"<prefix>/<name>": value})`` with pimm's names."""
    values = {**_gpu(effect), **_cpu(effect)}
    runtime_handlers.log(
        Log(effect.step, "resources", {f"{effect.prefix}/{k}": v for k, v in values.items()}), state, ctx
    )
    return ()


class Profiler:
    """The ``StartProfiler``/``StopProfiler`` handler: one ``torch.profiler.profile`` per run in flight.

    ``close()`` (the interpreter's, at the end of a run or on an error)
    stops any profiler still running without writing its output.
    """

    def __init__(self):
        self._running: dict = {}  # id(ctx) -> profile

    def __call__(self, effect, state, ctx) -> tuple:
        if isinstance(effect, StartProfiler):
            self._stop(ctx)
            profile = new_profile(memory=effect.memory, shapes=True)  # built as pimm_fn.profile's: CPU (+ CUDA)
            profile.__enter__()
            self._running[id(ctx)] = profile
            return ()
        profile = self._running.pop(id(ctx), None)
        if profile is None:  # resumed inside a window this process never started
            return ()
        profile.__exit__(None, None, None)
        if ctx.save_dir is None:
            ctx.say("RuntimeProfiler: this run has no save_dir; the profile is not written")
            return ()
        where = Path(ctx.save_dir) / "profiler" / (f"rank{ctx.rank}" if ctx.world_size > 1 else "")
        where.mkdir(parents=True, exist_ok=True)
        profile.export_chrome_trace(str(where / "trace.json"))
        sort_by = effect.sort_by
        if not torch.cuda.is_available() and sort_by.startswith(("cuda", "device")):
            sort_by = "cpu_time_total"  # no CUDA events were recorded
        table = profile.key_averages().table(sort_by=sort_by, row_limit=effect.row_limit)
        (where / "table.txt").write_text(table)
        ctx.say(f"RuntimeProfiler: profiled up to step {effect.step}; trace and table in {where}")
        return ()

    def _stop(self, ctx) -> None:
        profile = self._running.pop(id(ctx), None)
        if profile is not None:
            profile.__exit__(None, None, None)

    def close(self) -> None:
        for key in list(self._running):
            self._running.pop(key).__exit__(None, None, None)


def _hub():
    try:
        return importlib.import_module("huggingface_hub")
    except ImportError as error:
        raise ImportError("PushToHub needs huggingface_hub: pip install 'pimm_fn[hub]' (the 'hub' extra)") from error


def stage_for_hub(effect: PushToHub, ctx) -> Path:
    """The folder ``push_to_hub`` uploads: ``save_dir/hub`` holding ``<name or checkpoint>.pth`` (weights only)."""
    folder = ctx.model_dir.parent / "hub"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{effect.name or effect.checkpoint}.pth"
    if effect.checkpoint == "model_best":
        source = ctx.model_dir / "model_best.pth"
        if not source.is_file():
            raise FileNotFoundError(
                f"PushToHub(checkpoint='model_best') uploads {source}, which this run never wrote "
                f"(no evaluation improved the tracked metric); pass checkpoint='last'"
            )
        weights = checkpoint.load_weights_file(source)  # the weights alone, whatever else the file holds
    else:
        weights = {k: v.detach().cpu() for k, v in ctx.weights().items()}
    torch.save(weights, target)
    return folder


def upload_to_hub(effect: PushToHub, state, ctx) -> tuple:
    """Stage the weights, then upload the folder (the package is checked first, so nothing is staged in vain)."""
    hub = _hub()
    folder = stage_for_hub(effect, ctx)
    api = hub.HfApi()
    api.create_repo(effect.repo_id, private=effect.private, exist_ok=True)
    api.upload_folder(
        repo_id=effect.repo_id,
        folder_path=str(folder),
        revision=effect.revision,
        commit_message=f"pimm_fn: {effect.checkpoint} after step {effect.step}",
    )
    ctx.say(f"PushToHub: uploaded {folder} to {effect.repo_id}")
    return ()


PROFILER = Profiler()


HANDLERS = {LogResources: log_resources, StartProfiler: PROFILER, StopProfiler: PROFILER, PushToHub: upload_to_hub}
