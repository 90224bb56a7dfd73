"""The moving average of a model's weights that ``pimm_fn.ema`` keeps, and the handler that updates it.

``EmaWeights`` is extra state (``loop(training=Training(extra_state=))``) like any other: the
checkpoint keeps its ``state_dict()`` in the replicated part, identical on
every rank because every rank averages the same weights, and a resume loads
it back bit for bit. Its tensors live on the parameters' device; an update
is two fused ``torch._foreach_*`` calls and reads nothing back to the host.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pimm_fn.core.effects import Effect, UpdateEma
from pimm_fn.runtime.engine.interpreter import unwrap

__all__ = ["EmaWeights", "update_ema", "EMA_HANDLERS"]


class EmaWeights:
    """An exponential moving average of a module's parameters, with its buffers copied.

    Empty until its first ``update``, which starts it as a copy of the
    weights. ``state_dict()`` holds references to its tensors (a save copies
    them); ``load_state_dict`` takes a saved one back, moved to the module's
    device at the next use.

    >>> net = torch.nn.Linear(2, 1)
    >>> avg = EmaWeights()
    >>> avg.update(net, 0.5); _ = net.weight.data.add_(2.0); avg.update(net, 0.5)
    >>> torch.allclose(avg.weights_of(net)["weight"], net.weight - 1.0)
    True
    """

    def __init__(self) -> None:
        self.params: dict = {}  # parameter name -> its average
        self.buffers: dict = {}  # buffer name -> its copy at the last update
        self.updates = 0
        # (module, _bind's lists for it): the averages and live tensors an update walks
        self._bound: tuple[torch.nn.Module, tuple[list, list, list, list]] | None = None

    def state_dict(self) -> dict:
        return {"updates": self.updates, "params": dict(self.params), "buffers": dict(self.buffers)}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.params = dict(state["params"])
        self.buffers = dict(state["buffers"])
        self._bound = None

    def _live(self, module) -> tuple[dict, dict]:
        return dict(module.named_parameters()), dict(module.named_buffers())

    def _bind(self, module) -> tuple[list, list, list, list]:
        """``(averages, parameters, buffer copies, buffers)``: aligned lists, built once per module."""
        if self._bound is not None and self._bound[0] is module:
            return self._bound[1]
        params, buffers = self._live(module)
        if not self.params:  # the first update: the average starts as the weights
            self.params = {k: p.detach().clone() for k, p in params.items()}
            self.buffers = {k: b.detach().clone() for k, b in buffers.items()}
        if self.params.keys() != params.keys() or self.buffers.keys() != buffers.keys():
            raise ValueError(
                f"the moving average holds parameters {sorted(self.params)[:4]}... and buffers "
                f"{sorted(self.buffers)[:4]}..., the model {sorted(params)[:4]}... and {sorted(buffers)[:4]}...: "
                f"it was made for another model"
            )
        self.params = {k: _like(v, params[k]) for k, v in self.params.items()}
        self.buffers = {k: _like(v, buffers[k]) for k, v in self.buffers.items()}
        lists = (
            list(self.params.values()),
            [params[k].detach() for k in self.params],
            list(self.buffers.values()),
            [buffers[k].detach() for k in self.buffers],
        )
        self._bound = (module, lists)
        return lists

    def update(self, module: torch.nn.Module, decay: float) -> None:
        """Move the average toward ``module``'s weights: ``avg += (1 - decay) * (p - avg)``; copy the buffers.

        Every tensor ``_bind`` lists is detached, so autograd records nothing here without a ``no_grad``
        context (entering one took 3 µs, as long as the update of a small model).
        """
        averages, params, copies, buffers = self._bind(module)
        if averages:
            torch._foreach_lerp_(averages, params, 1.0 - decay)
        if copies:
            torch._foreach_copy_(copies, buffers)
        self.updates += 1

    def weights_of(self, module: torch.nn.Module) -> dict:
        """``module.state_dict()`` with the averages in place of the weights (the module's own before any update)."""
        weights = module.state_dict()
        if not self.params:
            return weights
        self._bind(module)
        return {k: self.params.get(k, self.buffers.get(k, v)) for k, v in weights.items()}

    @contextlib.contextmanager
    def swapped_into(self, module: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The average in ``module``'s parameters and buffers for the block; its own weights back after, on any exit."""
        if not self.params:  # no update yet: the average is the weights themselves
            yield module
            return
        averages, params, copies, buffers = self._bind(module)
        live = params + buffers
        with torch.no_grad():
            kept = [t.clone() for t in live]
            torch._foreach_copy_(live, averages + copies)
        try:
            yield module
        finally:
            with torch.no_grad():
                torch._foreach_copy_(live, kept)

    def __repr__(self):
        return f"EmaWeights(updates={self.updates}, tensors={len(self.params) + len(self.buffers)})"


def _like(saved, live):
    """``saved`` on ``live``'s device and dtype (a loaded checkpoint's tensors are on the CPU)."""
    if saved.device == live.device and saved.dtype == live.dtype:
        return saved
    return saved.to(device=live.device, dtype=live.dtype)


def update_ema(effect: UpdateEma, state, ctx) -> tuple:
    """Update the average ``effect.name`` from the model, after a background save has copied the old one."""
    ctx.saver.wait_staged()  # the save stages the average by reference: it must not change before the copy
    average = ctx.extra_state.get(effect.name)
    if not isinstance(average, EmaWeights):
        raise LookupError(f"{effect!r}: this run keeps no ema(name={effect.name!r}); build the run with that hook")
    average.update(unwrap(ctx.model), effect.decay)
    return ()


EMA_HANDLERS: dict[type[Effect], Callable[..., Any]] = {UpdateEma: update_ema}
