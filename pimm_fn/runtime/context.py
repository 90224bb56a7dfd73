"""What the effect handlers act on: the model, its optimizer, the data, the files."""

from pathlib import Path
from typing import Any

import attrs
import torch

__all__ = ["Context", "unwrap"]


def unwrap(model):
    """The module inside a DDP / FSDP / compiled wrapper."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


@attrs.define
class Context:
    """The impure objects of one run, shared by the interpreter's handlers.

    Only handlers touch it; hooks never see it.
    """

    model: Any
    optimizer: Any
    feed: Any
    save_dir: Path | None
    scheduler: Any = None
    scaler: Any = None
    evaluators: dict = attrs.Factory(dict)
    checkpoint_format: str = "standard"
    keep_snapshots: int | None = None
    digests: bool = False  # record each checkpoint file's SHA-256 in its marker (loop(digests=))
    keep: Any = None  # the retention policy of iter_<step> snapshots (pimm_fn.core.retention); None: keep all
    rank: int = 0
    world_size: int = 1
    console: bool = True
    hooks: tuple | None = None  # the run's top-level hooks: a checkpoint keeps their slots by identity
    best_per_metric: bool = False  # several metrics' best weights are kept: one model_best_<metric> file each
    advice: Any = None  # the run's Advice, told of every evaluation
    nonfinite: Any = None  # the step's NonFinite policy for a NaN/inf loss (loop(on_nonfinite=)); None: no check
    pending_save: Any = None  # the background save in flight (an AsyncSave), if any
    save_gate: Any = None  # the optimizer pre-step hook that waits for its staging
    prewarm_hook: Any = None  # the optimizer post-step hook that readies the staging memory of background saves
    prewarm: Any = None  # the staging prewarm it started (a checkpoint Prewarm), once it fired
    sharded: bool = False  # the model keeps DTensor parameters (FSDP2): its state goes through DCP's state_dict API
    weights_file: bool = True  # a sharded model's checkpoints gather its full weights into model.pth
    everywhere: tuple = ()  # main-rank effect types every rank executes (a sharded model's WriteBest gathers)
    optimizers: dict | None = None  # loop(optimizers=): name -> optimizer; then ``optimizer`` is this dict too
    extra_state: dict = attrs.Factory(dict)  # loop(extra_state=) and the ema() averages: name -> object with state_dict()
    logs: Any = None  # the run's Logs: its loggers, history and clock (pimm_fn.runtime.logs); the Log handler's
    bar: Any = None  # the run's ProgressBar on the main rank when one is shown (pimm_fn.runtime.progress_bar)
    lock: Any = None  # the save_dir lock (pimm_fn.runtime.lock): released when training ends

    def named_optimizers(self) -> dict:
        """``{name: optimizer}``: the ``optimizers=`` of the run, or ``{None: optimizer}`` for its one optimizer."""
        return self.optimizers if self.optimizers is not None else {None: self.optimizer}

    def wait_for_save(self) -> None:
        """Block until the background save in flight (if any) is published."""
        pending, self.pending_save = self.pending_save, None
        if pending is not None:
            pending.wait()

    @property
    def model_dir(self) -> Path:
        if self.save_dir is None:
            raise ValueError("this run has no save_dir, but a hook asked to write a checkpoint: pass save_dir= to loop()")
        return self.save_dir / "model"

    def weights(self) -> dict:
        """The model's state_dict without DDP's ``module.`` prefix."""
        return unwrap(self.model).state_dict()

    def say(self, message: str) -> None:
        """A line for the console, from the main rank; above the progress bar while one is shown, not through it."""
        if self.console and self.rank == 0:
            if self.bar is not None and self.bar.showing:
                self.bar.write(f"[pimm_fn] {message}")
            else:
                print(f"[pimm_fn] {message}", flush=True)

    def close(self) -> None:
        """Close the run's writers (loggers, progress bar): at the end of training and on an error.

        Each opens again on its next record, appending: a notebook's run
        continued after an exception writes on where it stopped.
        """
        if self.bar is not None:
            self.bar.close()
        if self.logs is not None:
            self.logs.close()
