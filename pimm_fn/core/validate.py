"""Validators: small values that check one argument and say what is wrong, what was expected, what came.

A factory returns a frozen validator, used as an attrs validator
(``attrs.field(validator=int_at_least(1))``: the error names the class's
``factory_name`` and the field's alias) or on a plain argument
(``int_at_least(1).check(value, "iters_per_epoch", owner="loop")``). The
message names the owner, the argument, what it must be and what came, then
the fix (``.with_hint(...)``): ``loop: 'console' must be a bool (got 'no');
pass True or False``. A wrong type raises ``TypeError``, a value out of range
``ValueError`` (``int_at_least``, ``number`` and ``one_of`` raise
``ValueError`` for both, as their message says both). Validators compose
(``optional``, ``mapping_of``). Pure: the core, the hooks, the checkpoint
code, the runtime and the testing kit share it.

>>> int_at_least(1).check(0, "every", owner="save_every")
Traceback (most recent call last):
ValueError: save_every: 'every' must be an int >= 1 (got 0)
>>> optional(int_at_least(0))
optional(int_at_least(0))
"""

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

__all__ = [
    "Validator",
    "invalid",
    "shown",
    "finite",
    "refused_call",
    "int_at_least",
    "number",
    "one_of",
    "instance_of",
    "subclass_of",
    "has_methods",
    "optional",
    "mapping_of",
    "is_bool",
    "is_callable",
    "non_empty_str",
    "PathLike",
]

_T = TypeVar("_T")


@runtime_checkable
class PathLike(Protocol):
    """What ``os.PathLike`` describes (a ``pathlib.Path``), for the annotations of modules that import no ``os``.

    ``isinstance(value, PathLike)``: whether ``value`` has an ``__fspath__`` to call.
    """

    def __fspath__(self) -> str: ...


def finite(value: object) -> bool:
    """``value`` is a real number that can be compared and kept: not a bool, not NaN, not +/-inf.

    >>> finite(0.5), finite(3), finite(float("inf")), finite(float("nan")), finite(True), finite("1")
    (True, True, False, False, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def refused_call(fn: Callable[..., object], *args: object, **kwargs: object) -> inspect.Signature | None:
    """``fn``'s signature when ``fn(*args, **kwargs)`` could not bind to it, else ``None``.

    What lets a callable the loop will call later (an evaluator, a metric, a
    step) be refused when it is handed over, with its signature shown,
    instead of at its first call hours in. A callable without a signature to
    read (a builtin) is trusted: ``None``.

    >>> def evaluate(model, loader): ...
    >>> refused_call(evaluate, None), refused_call(evaluate, None, None)
    (<Signature (model, loader)>, None)
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        return signature
    return None


def invalid(
    owner: str | None,
    name: str,
    expected: str,
    value: object,
    *,
    hint: str | None = None,
    error: type[Exception] = ValueError,
) -> Exception:
    """The exception for argument ``name`` of ``owner`` holding ``value`` instead of ``expected``; raise it.

    >>> raise invalid("loop", "save_dir", "a directory", "run.txt", hint="it is a file")
    Traceback (most recent call last):
    ValueError: loop: 'save_dir' must be a directory (got 'run.txt'); it is a file
    """
    where = f"{owner}: " if owner else ""
    fix = f"; {hint}" if hint else ""
    return error(f"{where}'{name}' must be {expected} (got {shown(value)}){fix}")


def shown(value: object) -> str:
    """``value`` as an error message shows it: its repr, or its type when that is long or spans lines.

    >>> shown("no"), shown(list(range(100)))
    ("'no'", 'a list of 100 items')
    """
    text = repr(value)
    if "\n" not in text and len(text) <= 80:
        return text
    size = len(value) if isinstance(value, (list, tuple, dict, set)) else None
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}" + (f" of {size} items" if size is not None else "")


def _name(attribute: "attrs.Attribute[Any]") -> str:
    """The argument's name as the factory spells it (an attrs field's alias)."""
    return getattr(attribute, "alias", None) or attribute.name


def _owner(instance: object) -> str:
    return getattr(instance, "factory_name", type(instance).__name__)


class Validator:
    """Base of the validators: ``accepts``, ``expected``, ``with_hint`` define one; ``check`` and attrs' call use them.

    A validator is a frozen value: ``error`` (the exception it raises) and ``hint`` (the fix its
    errors end with) are read, never set.
    """

    @property
    def error(self) -> type[Exception]:
        return ValueError

    @property
    def hint(self) -> str | None:
        return None

    def accepts(self, value: object) -> bool:
        raise NotImplementedError

    @property
    def expected(self) -> str:
        raise NotImplementedError

    def check(self, value: _T, name: str, *, owner: str | None = None) -> _T:
        """``value`` when it is valid; else raises, naming ``owner``, ``name`` and ``value``."""
        if not self.accepts(value):
            raise invalid(owner, name, self.expected, value, hint=self.hint, error=self.error)
        return value

    # the attrs validator protocol
    def __call__(self, instance: object, attribute: "attrs.Attribute[Any]", value: object) -> None:
        self.check(value, _name(attribute), owner=_owner(instance))

    def with_hint(self, hint: str) -> "Validator":
        """This validator, its errors ending with ``hint`` (the fix to suggest).

        >>> is_bool.with_hint("pass True or False").check("no", "console", owner="loop")
        Traceback (most recent call last):
        TypeError: loop: 'console' must be a bool (got 'no'); pass True or False
        """
        raise NotImplementedError


def _repr(value: object) -> str:
    return value.__qualname__ if isinstance(value, type) else repr(value)


@attrs.frozen(repr=False)
class _Check(Validator):
    """A validator a factory below made: its test and what it expects, named (and equal) by the call that made it.

    ``args`` is ``None`` for a constant (``is_bool``), which reads as its name.
    """

    factory: str
    args: tuple[Any, ...] | None
    kwargs: tuple[tuple[str, Any], ...] = ()  # (name, value) pairs
    test: Callable[[Any], bool] = attrs.field(kw_only=True, eq=False)
    description: str = attrs.field(default="", eq=False)
    error: type[Exception] = attrs.field(default=ValueError, eq=False)
    hint: str | None = None

    def accepts(self, value: object) -> bool:
        return self.test(value)

    @property
    def expected(self) -> str:
        return self.description

    def with_hint(self, hint: str) -> Validator:
        return attrs.evolve(self, hint=hint)

    def __repr__(self) -> str:
        shown_args = [*map(_repr, self.args or ()), *(f"{k}={_repr(v)}" for k, v in self.kwargs)]
        call = self.factory if self.args is None else f"{self.factory}({', '.join(shown_args)})"
        return call + ("" if self.hint is None else f".with_hint({self.hint!r})")

    # by the call that made it: the test is a closure
    def __reduce__(self) -> tuple[Callable[..., Validator], tuple[Any, ...]]:
        return (_remake, (self.factory, self.args, self.kwargs, self.hint))


def _remake(
    factory: str, args: tuple[Any, ...] | None, kwargs: tuple[tuple[str, Any], ...], hint: str | None
) -> Validator:
    made: Validator = globals()[factory] if args is None else globals()[factory](*args, **dict(kwargs))
    return made if hint is None else made.with_hint(hint)


def int_at_least(minimum: int) -> Validator:
    """An ``int`` (not a bool) ``>= minimum``; ``ValueError`` otherwise.

    >>> int_at_least(0).check(-1, "keep_snapshots", owner="loop")
    Traceback (most recent call last):
    ValueError: loop: 'keep_snapshots' must be an int >= 0 (got -1)
    """
    return _Check(
        "int_at_least",
        (minimum,),
        test=lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
        description=f"an int >= {minimum}",
    )


def _bound(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def number(*, at_least: float | None = None, above: float | None = None, below: float | None = None) -> Validator:
    """A finite real number (not a bool) within the bounds given; ``ValueError`` otherwise.

    >>> number(at_least=0, below=1).with_hint("0.999 is usual").check(1.0, "decay", owner="ema")
    Traceback (most recent call last):
    ValueError: ema: 'decay' must be a number in [0, 1) (got 1.0); 0.999 is usual
    >>> number(above=0).check(float("inf"), "clip_grad_norm")
    Traceback (most recent call last):
    ValueError: 'clip_grad_norm' must be a finite number > 0 (got inf)
    """
    bounds = tuple((k, b) for k, b in (("at_least", at_least), ("above", above), ("below", below)) if b is not None)
    low = f"[{_bound(at_least)}" if at_least is not None else f"({_bound(above)}" if above is not None else None
    if low is not None and below is not None:
        description = f"a number in {low}, {_bound(below)})"
    else:
        signs = {"at_least": ">=", "above": ">", "below": "<"}
        description = " ".join(["a finite number", *(f"{signs[k]} {_bound(b)}" for k, b in bounds)])

    def test(v: Any) -> bool:
        return (
            finite(v)
            and (at_least is None or v >= at_least)
            and (above is None or v > above)
            and (below is None or v < below)
        )

    return _Check("number", (), bounds, test=test, description=description)


def one_of(*choices: object) -> Validator:
    """Equal to one of ``choices`` (and of its type: ``1`` is not ``True``); ``ValueError`` otherwise.

    >>> one_of("max", "min").check("MAX", "mode", owner="best_on")
    Traceback (most recent call last):
    ValueError: best_on: 'mode' must be one of ['max', 'min'] (got 'MAX')
    """

    def test(v: object) -> bool:
        try:
            return any(v == c and type(v) is type(c) for c in choices)
        except Exception:  # a value whose == raises (an array) is none of the choices
            return False

    return _Check("one_of", tuple(choices), test=test, description=f"one of {list(choices)}")


def instance_of(*types: type, expected: str | None = None) -> Validator:
    """An instance of one of ``types`` (a bool only where ``bool`` is listed); ``TypeError`` otherwise.

    >>> instance_of(dict, expected="a dict of settings").check([1], "config", owner="loop")
    Traceback (most recent call last):
    TypeError: loop: 'config' must be a dict of settings (got [1])
    """

    def test(v: object) -> bool:  # True is an int to Python, never to an argument that counts
        return isinstance(v, types) and (bool in types or not isinstance(v, bool))

    return _Check(
        "instance_of",
        tuple(types),
        (("expected", expected),) if expected else (),
        test=test,
        description=expected or " or ".join(f"a {t.__qualname__}" for t in types),
        error=TypeError,
    )


def subclass_of(base: type) -> Validator:
    """A class deriving from ``base`` (``base`` itself included); ``TypeError`` otherwise.

    >>> subclass_of(Exception).check("SaveCheckpoint", "key")
    Traceback (most recent call last):
    TypeError: 'key' must be a subclass of Exception (got 'SaveCheckpoint')
    """
    return _Check(
        "subclass_of",
        (base,),
        test=lambda v: isinstance(v, type) and issubclass(v, base),
        description=f"a subclass of {base.__qualname__}",
        error=TypeError,
    )


is_bool = _Check("is_bool", None, test=lambda v: isinstance(v, bool), description="a bool", error=TypeError)
"""``True`` or ``False`` (not ``0``, ``"no"`` or ``None``); ``TypeError`` otherwise."""

non_empty_str = _Check(
    "non_empty_str", None, test=lambda v: isinstance(v, str) and bool(v), description="a non-empty str", error=TypeError
)
"""A ``str`` with at least one character; ``TypeError`` otherwise."""

is_callable = _Check("is_callable", None, test=callable, description="callable", error=TypeError)
"""Anything ``callable``; ``TypeError`` otherwise."""


@attrs.frozen(repr=False)
class _HasMethods(Validator):
    methods: tuple[str, ...]
    description: str = attrs.field(kw_only=True)
    hint: str | None = None
    error = TypeError

    def accepts(self, value: object) -> bool:
        return not isinstance(value, type) and all(callable(getattr(value, m, None)) for m in self.methods)

    @property
    def expected(self) -> str:
        return f"{self.description}, with {', '.join(m + '()' for m in self.methods)}"

    def check(self, value: _T, name: str, *, owner: str | None = None) -> _T:
        if not self.accepts(value):
            missing = [m + "()" for m in self.methods if not callable(getattr(value, m, None))]
            what = "a class, not an instance of it" if isinstance(value, type) else f"it has no {', '.join(missing)}"
            hint = what + (f"; {self.hint}" if self.hint else "")
            raise invalid(owner, name, self.expected, value, hint=hint, error=self.error)
        return value

    def with_hint(self, hint: str) -> Validator:
        return attrs.evolve(self, hint=hint)

    def __repr__(self) -> str:
        hint = "" if self.hint is None else f".with_hint({self.hint!r})"
        return f"has_methods({', '.join(map(repr, self.methods))}, expected={self.description!r}){hint}"


def has_methods(*methods: str, expected: str) -> Validator:
    """An object (not a class) with each of ``methods`` callable: duck typing, named; ``TypeError`` otherwise.

    >>> has_methods("step", "state_dict", expected="a scheduler").check(3, "scheduler", owner="loop")
    Traceback (most recent call last):
    TypeError: loop: 'scheduler' must be a scheduler, with step(), state_dict() (got 3); it has no step(), state_dict()
    """
    return _HasMethods(tuple(methods), description=expected)


@attrs.frozen(repr=False)
class _Optional(Validator):
    inner: Validator

    @property
    def error(self) -> type[Exception]:
        return self.inner.error

    @property
    def hint(self) -> str | None:
        return self.inner.hint

    def accepts(self, value: object) -> bool:
        return value is None or self.inner.accepts(value)

    @property
    def expected(self) -> str:
        return f"None or {self.inner.expected}"

    def check(self, value: _T, name: str, *, owner: str | None = None) -> _T:
        if value is not None and not self.inner.accepts(value):  # the inner check's detail, "None or" added
            try:
                self.inner.check(value, name, owner=owner)
            except self.inner.error as error:
                told = str(error).replace(f"must be {self.inner.expected}", f"must be {self.expected}", 1)
                raise type(error)(told) from None
        return value

    def with_hint(self, hint: str) -> Validator:
        return _Optional(self.inner.with_hint(hint))

    def __repr__(self) -> str:
        return f"optional({self.inner!r})"


def optional(inner: Validator) -> Validator:
    """``None``, or what ``inner`` accepts.

    >>> optional(int_at_least(0)).check(-2, "keep_snapshots", owner="save_checkpoint")
    Traceback (most recent call last):
    ValueError: save_checkpoint: 'keep_snapshots' must be None or an int >= 0 (got -2)
    """
    return _Optional(inner)


@attrs.frozen(repr=False)
class _MappingOf(Validator):
    key: Validator
    value: Validator
    description: str = attrs.field(kw_only=True, eq=False)
    hint: str | None = None
    error = TypeError

    def accepts(self, value: object) -> bool:
        return isinstance(value, Mapping) and all(
            self.key.accepts(k) and self.value.accepts(v) for k, v in value.items()
        )

    @property
    def expected(self) -> str:
        return self.description

    def check(self, value: _T, name: str, *, owner: str | None = None) -> _T:
        if not isinstance(value, Mapping):
            raise invalid(owner, name, self.expected, value, hint=self.hint, error=TypeError)
        where, whole = (
            (f"{owner}: " if owner else ""),
            f"'{name}' must be {self.expected}" + (f"; {self.hint}" if self.hint else ""),
        )
        for k, v in value.items():
            if not self.key.accepts(k):
                raise self.key.error(
                    f"{where}'{name}' has the key {shown(k)}, which is not {self.key.expected}: {whole}"
                )
            if not self.value.accepts(v):
                raise self.value.error(
                    f"{where}'{name}' entry {_repr(k)} must be {self.value.expected} (got {shown(v)}): {whole}"
                )
        return value

    def with_hint(self, hint: str) -> Validator:
        return attrs.evolve(self, hint=hint)

    def __repr__(self) -> str:
        hint = "" if self.hint is None else f".with_hint({self.hint!r})"
        return f"mapping_of({self.key!r}, {self.value!r}, expected={self.description!r}){hint}"


def mapping_of(key: Validator, value: Validator, *, expected: str | None = None) -> Validator:
    """A mapping whose every key passes ``key`` and every value ``value``; the error names the entry.

    >>> mapping_of(non_empty_str, int_at_least(0)).check({"a": -1}, "counts", owner="f")
    Traceback (most recent call last):
    ValueError: f: 'counts' entry 'a' must be an int >= 0 (got -1): 'counts' must be a mapping of (a non-empty str) to (an int >= 0)
    """
    return _MappingOf(key, value, description=expected or f"a mapping of ({key.expected}) to ({value.expected})")
