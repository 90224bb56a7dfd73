"""The impure edge: the driver, the interpreter and its handlers."""

from pimm_fn.runtime.errors import ResumeNotExactWarning
from pimm_fn.runtime.engine.guard import CollectiveDivergenceError
from pimm_fn.runtime.engine.interpreter import Interpreter, MissingHandlerError
from pimm_fn.runtime.engine.loop import Loop, loop
from pimm_fn.runtime.resume.checks import ResumeError
from pimm_fn.runtime.step.train_step import train_step
from pimm_fn.runtime.step.configurable import TrainStep

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
