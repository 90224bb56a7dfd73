"""The impure edge: the engine that walks a run, its step, data feed, resume, logs and evaluation, the handlers of the effects, and replicas healed from a peer."""

from pimm_fn.runtime.engine.interpreter import Interpreter
from pimm_fn.runtime.engine.loop import Loop, loop
from pimm_fn.runtime.errors import CollectiveDivergenceError, MissingHandlerError, ResumeError, ResumeNotExactWarning
from pimm_fn.runtime.step.configurable import TrainStep
from pimm_fn.runtime.step.train_step import train_step

__all__ = [
    "Loop",
    "loop",
    "train_step",
    "TrainStep",
    "Interpreter",
    "MissingHandlerError",
    "CollectiveDivergenceError",
    "ResumeError",
    "ResumeNotExactWarning",
]
