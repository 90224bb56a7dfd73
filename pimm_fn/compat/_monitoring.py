"""The handlers of ``LogResources``, ``StartProfiler``/``StopProfiler`` and ``PushToHub`` (see ``compat.monitors``).

No new dependency: memory comes from ``/proc`` (or ``resource``) when
psutil is not installed; ``huggingface_hub`` is imported only when an
upload runs (``pip install pimm_fn[hub]``).
"""

import importlib
import os
import resource
import sys
from pathlib import Path

import torch

from pimm_fn import checkpoint
from pimm_fn.compat.effects import LogResources, PushToHub, StartProfiler, StopProfiler
from pimm_fn.core.effects import Log
from pimm_fn.runtime import handlers as runtime_handlers
from pimm_fn.runtime.profiler import new_profile

__all__ = ["log_resources", "Profiler", "push_to_hub"]

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
    return {"gpu_memory_allocated_gb": torch.cuda.memory_allocated(device) / _GB,
            "gpu_memory_reserved_gb": torch.cuda.memory_reserved(device) / _GB,
            "gpu_memory_max_allocated_gb": torch.cuda.max_memory_allocated(device) / _GB}


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
        values.update(load_avg_1min=load1, load_avg_5min=load5, load_avg_15min=load15, load_per_cpu_1min=load1 / cpus,
                      num_cpus=cpus)
        if psutil is not None:
            values["cpu_percent"] = psutil.cpu_percent(interval=None)
    if effect.memory:
        if psutil is not None:
            memory = psutil.virtual_memory()
            values.update(system_memory_used_gb=memory.used / _GB, system_memory_total_gb=memory.total / _GB,
                          system_memory_pct=memory.percent)
        else:
            total, free = _proc_kb("/proc/meminfo", "MemTotal"), _proc_kb("/proc/meminfo", "MemAvailable")
            if total and free is not None:
                values.update(system_memory_used_gb=(total - free) * 1024 / _GB, system_memory_total_gb=total * 1024 / _GB,
                              system_memory_pct=100.0 * (total - free) / total)
    return values


def log_resources(effect: LogResources, state, ctx) -> tuple:
    """Measure and log ``Log(step, "resources", {"<prefix>/<name>": value})`` with pimm's names."""
    values = {**_gpu(effect), **_cpu(effect)}
    runtime_handlers.log(Log(effect.step, "resources", {f"{effect.prefix}/{k}": v for k, v in values.items()}),
                         state, ctx)
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
            raise FileNotFoundError(f"PushToHub(checkpoint='model_best') uploads {source}, which this run never wrote "
                                    f"(no evaluation improved the tracked metric); pass checkpoint='last'")
        weights = checkpoint.load_weights_file(source)  # the weights alone, whatever else the file holds
    else:
        weights = {k: v.detach().cpu() for k, v in ctx.weights().items()}
    torch.save(weights, target)
    return folder


def push_to_hub(effect: PushToHub, state, ctx) -> tuple:
    """Stage the weights, then upload the folder (the package is checked first, so nothing is staged in vain)."""
    hub = _hub()
    folder = stage_for_hub(effect, ctx)
    api = hub.HfApi()
    api.create_repo(effect.repo_id, private=effect.private, exist_ok=True)
    api.upload_folder(repo_id=effect.repo_id, folder_path=str(folder), revision=effect.revision,
                      commit_message=f"pimm_fn: {effect.checkpoint} after step {effect.step}")
    ctx.say(f"PushToHub: uploaded {folder} to {effect.repo_id}")
    return ()


PROFILER = Profiler()

HANDLERS = {LogResources: log_resources, StartProfiler: PROFILER, StopProfiler: PROFILER, PushToHub: push_to_hub}
