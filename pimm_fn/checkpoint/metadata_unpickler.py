"""What DCP's pickled ``.metadata`` may name when pimm_fn unpickles it: DCP's own metadata classes, and nothing else.

``MetadataUnpickler`` admits DCP's dataclasses and enums and the torch and
standard types they hold, as CPython 3.10-3.13 pickle them; any other
class a crafted ``.metadata`` names is refused before it could run.
:mod:`.safe_reading` reads every DCP directory through it.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib
import pickle
from typing import Any

import torch

__all__ = ["MetadataUnpickler"]

_PATHS = ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP's ``.metadata`` that admits what DCP metadata holds and nothing else.

    DCP's own dataclasses and enums, ``torch.Size``, dtypes, layouts and
    memory formats, paths (``pathlib``, ``pathlib._local`` on 3.13) and
    ``OrderedDict``. An enum member pickled as ``getattr(EnumClass, "NAME")``
    (CPython 3.11.0-3.11.x before the revert, e.g. Debian 12's 3.11.2) is
    admitted through :func:`_enum_member`, which applies to an admitted DCP
    enum and one of its member names only: ``builtins.getattr`` itself is
    never handed out.
    """

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint"):
            obj = super().find_class(module, name)
            if _is_dcp_type(obj):
                return obj
        elif module == "builtins" and name == "getattr":
            return _enum_member
        elif module == "torch.serialization" and name == "_get_layout":  # layout name -> torch.layout
            return super().find_class(module, name)
        elif module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
                return obj
        elif module in ("pathlib", "pathlib._local") and name in _PATHS:
            return getattr(pathlib, name)
        elif module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"DCP metadata references {module}.{name}, which is not allowed to load")


def _is_dcp_type(obj: Any) -> bool:
    return isinstance(obj, type) and obj.__module__.startswith("torch.distributed.checkpoint") and (
        dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """``getattr(cls, name)`` for a DCP enum and one of its members' names; an ``UnpicklingError`` for anything else."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and _is_dcp_type(cls) and isinstance(name, str) \
            and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(
        f"DCP metadata applies getattr to {getattr(cls, '__qualname__', type(cls).__name__)}.{name!r}, "
        "which is not a member of a DCP enum: refused"
    )
