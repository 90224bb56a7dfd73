"""Every public name the API reference documents is annotated: a reader, an IDE and mypy see its types.

For each name in the ``__all__`` of a module the reference renders (``pimm_fn``, ``pimm_fn.testing``,
``pimm_fn.compat``, ``pimm_fn.checkpoint``, and the ``events`` and ``effects`` modules ``pimm_fn`` exports):
a function has every parameter (``*args`` and ``**kwargs`` included) and its return annotated; a class has its
``__init__`` so (for an attrs class: a type for every field) and its public methods, those pimm_fn defines, too.
The annotations are read as written, never evaluated.
"""

import importlib
import inspect

import attrs
import pytest

# The modules whose __all__ the API reference (docs/reference/*.md) renders.
DOCUMENTED = (
    "pimm_fn",
    "pimm_fn.testing",
    "pimm_fn.compat",
    "pimm_fn.checkpoint",
    "pimm_fn.core.events",
    "pimm_fn.core.effects",
)


def _unannotated(fn) -> list:
    """The parameters of ``fn`` without an annotation, and ``return`` when it has none."""
    signature = inspect.signature(fn, eval_str=False)
    missing = [name for name, p in signature.parameters.items() if p.annotation is inspect.Parameter.empty]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def _ours(obj) -> bool:
    return getattr(obj, "__module__", "").startswith("pimm_fn")


def _class_gaps(cls) -> dict:
    """``{member: what it leaves unannotated}`` for ``cls``'s ``__init__`` and public methods."""
    gaps = {}
    if attrs.has(cls):
        untyped = [field.name for field in attrs.fields(cls) if field.type is None]
        if untyped:
            gaps["fields"] = untyped
    else:
        init = inspect.getattr_static(cls, "__init__")
        if _ours(init):
            missing = [name for name in _unannotated(init) if name != "self"]
            if missing:
                gaps["__init__"] = missing
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in gaps:
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if not inspect.isfunction(member) or not _ours(member):
                continue
            missing = [n for n in _unannotated(member) if n not in ("self", "cls")]
            if missing:
                gaps[name] = missing
    return gaps


def _documented():
    for module in DOCUMENTED:
        for name in importlib.import_module(module).__all__:
            yield module, name


@pytest.mark.parametrize(("module", "name"), list(_documented()), ids=lambda v: v)
def test_public_name_is_annotated(module, name):
    """The name's signature (a function's, or a class's ``__init__`` and methods) has no unannotated part."""
    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj):
        gaps = _class_gaps(obj)
    elif inspect.isfunction(obj):
        gaps = {name: missing} if (missing := _unannotated(obj)) else {}
    else:
        return  # a module, a constant or a registry: nothing to call
    assert not gaps, f"{module}.{name} leaves unannotated: {gaps}"
