"""Test and predict after training, on the final weights or the best ones (``run.test``, ``run.predict``).

``test(run, evaluator, weights="best")`` evaluates as the loop does during
training (eval mode, ``torch.inference_mode()``, every module's training flag
back after; a ``loader_evaluator`` shards the data over the ranks and reduces
its sums) and returns the metrics, on every rank alike. ``predict(run,
loader)`` returns the model's outputs for each batch of ``loader`` on this
rank, moved to the CPU. With ``weights="best"`` the best weights the run
wrote (``save_dir/model/model_best.pth``; with several ``best_on`` metrics
``metric=`` says which) are read (safely: no code runs) into the model for
the call and the model's own weights put back after, so training can go on.
Every rank reads the file: ``save_dir`` must be visible to each, as for a resume.
"""

import contextlib
import pathlib

import torch

from pimm_fn import checkpoint, dist
from pimm_fn.hooks.evaluation import evaluator_name
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.evaluation.loader_evaluator import default_forward
from pimm_fn.runtime.handlers.evaluation import as_metrics, evaluating
from pimm_fn.runtime.step.train_step import to_device

__all__ = ["test", "predict", "best_weights_file"]

_WEIGHTS = ("final", "best")


def best_weights_file(model_dir, metric: str | None = None) -> pathlib.Path:
    """The best weights file of ``metric`` under ``model_dir`` (the only one when ``metric`` is ``None``).

    Each ``model_best*.pth`` counts by the metric its ``.json`` records; the
    ``.json`` is untrusted (:mod:`pimm_fn.checkpoint.files`: a FIFO is
    never waited on, crafted JSON never raises from deep inside).

    Raises:
        FileNotFoundError: the run wrote no best weights (of ``metric``).
        CheckpointError: a best weights file whose ``.json`` is damaged, when it may be the one asked for.
        ValueError: several metrics have best weights and ``metric`` is ``None``.
    """
    model_dir = pathlib.Path(model_dir)
    found, damaged = {}, []
    for path in sorted(model_dir.glob("model_best*.pth")) if model_dir.is_dir() else ():
        try:
            found[checkpoint.best_record(path)["metric"]] = path
        except FileNotFoundError:
            continue  # a weights file without its record is not one the run finished writing
        except (OSError, ValueError) as exc:
            damaged.append(_damaged_record(path, exc))
    if metric is not None and metric in found:
        return found[metric]
    if damaged:  # it may hold the weights asked for: say so rather than "no best weights"
        raise damaged[0]
    if metric is not None:
        raise FileNotFoundError(
            f"no best weights of {metric!r} in {model_dir} (best weights of: {sorted(found)}); "
            f"a best_on({metric!r}) hook writes them when the metric improves"
        )
    if not found:
        raise FileNotFoundError(
            f"no best weights in {model_dir}: the run writes model_best with a best_on(metric) "
            f"hook, after an evaluation improved it; pass weights='final' for the model as it is"
        )
    if len(found) > 1:
        raise ValueError(f"{model_dir} holds best weights of {sorted(found)}: pass metric= to say which")
    return next(iter(found.values()))


def _damaged_record(path: pathlib.Path, exc: Exception) -> checkpoint.CheckpointError:
    """The error for best weights ``path`` whose ``.json`` cannot be read: which file, why, and what to do."""
    record = path.with_suffix(".json").name
    return checkpoint.CheckpointError(
        path,
        record,
        f"{checkpoint.record_problem(exc)}, so which metric {path.name} is the best of is not known",
        advice=f"Restore {record} (or delete it; a best_on hook writes both files again when its metric improves), "
        f"load {path.name} itself with pf.checkpoint.load_weights_file, or pass weights='final' for the model "
        f"as it is",
    )


@contextlib.contextmanager
def _weights(run, weights: str, metric: str | None):
    """The model holds ``weights`` for the block: ``"final"`` as it is, ``"best"`` read from the run's best file."""
    if weights not in _WEIGHTS:
        raise ValueError(
            f"'weights' must be 'final' (the model as it is) or 'best' (save_dir's model_best) (got {weights!r:.80})"
        )
    if weights == "final":
        yield
        return
    ctx = run.ctx
    if ctx.save_dir is None:
        raise ValueError("weights='best' reads save_dir/model/model_best.pth, but this run has no save_dir")
    if ctx.sharded:
        raise ValueError(
            "weights='best' into a sharded (FSDP2) model is not supported: load model_best.pth into "
            "an unsharded copy of the model and evaluate that"
        )
    best = checkpoint.load_weights_file(best_weights_file(ctx.model_dir, metric))
    module = unwrap(ctx.model)
    own = {name: value.detach().clone() for name, value in module.state_dict().items()}
    ctx.wait_for_save()  # a background save reads the model's tensors: let it finish before they change
    module.load_state_dict(best)
    try:
        yield
    finally:
        module.load_state_dict(own)


def test(run, evaluator, *, weights: str = "final", metric: str | None = None) -> dict:
    """``evaluator(model)``'s metrics on the ``weights`` asked for (see the module docstring), on every rank alike.

    Collective: every rank calls it (a ``loader_evaluator`` reduces over
    them); rank 0's result is returned on each.
    """
    name = evaluator_name(evaluator)
    with _weights(run, weights, metric), evaluating(run.ctx) as model:
        values = as_metrics(evaluator(model), name)
    values = dist.broadcast_object(values) or {}
    run.ctx.say(f"test ({weights} weights) {name}: " + " ".join(f"{k}={v:.5g}" for k, v in values.items()))
    return values


def predict(run, loader, *, forward=None, weights: str = "final", metric: str | None = None) -> list:
    """The outputs of ``forward(model, batch)`` (default: as ``loader_evaluator``'s) for each batch, on the CPU.

    Each rank predicts the batches of its own ``loader``; nothing is gathered.
    """
    forward = forward or default_forward
    device = next((p.device for p in unwrap(run.ctx.model).parameters()), torch.device("cpu"))
    outputs = []
    with _weights(run, weights, metric), evaluating(run.ctx) as model:
        for batch in loader:
            outputs.append(to_device(forward(model, to_device(batch, device)), "cpu"))
    return outputs
