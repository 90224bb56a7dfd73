"""The impure edge: the driver, the interpreter and its handlers."""

from pimm_fn.runtime.resume_warning import ResumeNotExactWarning
from pimm_fn.runtime.guard import CollectiveDivergenceError
from pimm_fn.runtime.interpreter import Interpreter, MissingHandlerError
from pimm_fn.runtime.loop import Loop, loop
from pimm_fn.runtime.resume_checks import ResumeError
from pimm_fn.runtime.default_step import train_step
from pimm_fn.runtime.configurable_step import TrainStep

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
