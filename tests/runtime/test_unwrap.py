"""unwrap: the module inside DDP-style (``.module``), FSDP-style (a ``module`` property) and compiled wrappers."""

import torch

from pimm_fn.runtime.engine.interpreter import unwrap


class _Holds(torch.nn.Module):
    """A DDP-style wrapper: the model is its submodule ``module``."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner


class _Exposes(torch.nn.Module):
    """An FSDP-style wrapper: the model under another name, ``module`` a property of the class."""

    def __init__(self, inner):
        super().__init__()
        self._wrapped = inner

    @property
    def module(self):
        return self._wrapped


def test_a_plain_module_is_its_own_inside():
    net = torch.nn.Linear(2, 1)
    assert unwrap(net) is net


def test_each_kind_of_wrapper_is_opened_at_any_depth():
    net = torch.nn.Linear(2, 1)
    assert unwrap(_Holds(net)) is net
    assert unwrap(_Exposes(net)) is net
    assert unwrap(torch.compile(net, backend="eager")) is net
    assert unwrap(torch.compile(_Holds(_Exposes(net)), backend="eager")) is net


def test_a_module_attribute_that_is_no_module_is_not_a_wrapper():
    net = torch.nn.Linear(2, 1)
    net.module = "not a module"  # an attribute of the instance, not a submodule
    assert unwrap(net) is net
