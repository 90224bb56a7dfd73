"""Small attrs validators whose errors name the factory, the argument and the value."""

import math

__all__ = ["int_at_least", "one_of", "non_empty_str", "is_callable", "is_bool"]


def _arg(attribute) -> str:
    """The argument's name as the factory spells it (a field's alias)."""
    return getattr(attribute, "alias", None) or attribute.name


def _owner(instance) -> str:
    return getattr(instance, "factory_name", type(instance).__name__)


def int_at_least(minimum: int):
    def check(instance, attribute, value):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(
                f"{_owner(instance)}: '{_arg(attribute)}' must be an int >= {minimum} (got {value!r})"
            )

    return check


def one_of(*choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(
                f"{_owner(instance)}: '{_arg(attribute)}' must be one of {list(choices)} (got {value!r})"
            )

    return check


def non_empty_str(instance, attribute, value):
    if not isinstance(value, str) or not value:
        raise TypeError(f"{_owner(instance)}: '{_arg(attribute)}' must be a non-empty str (got {value!r})")


def is_callable(instance, attribute, value):
    if not callable(value):
        raise TypeError(f"{_owner(instance)}: '{_arg(attribute)}' must be callable (got {value!r})")


def is_bool(instance, attribute, value):
    if not isinstance(value, bool):
        raise TypeError(f"{_owner(instance)}: '{_arg(attribute)}' must be a bool (got {value!r})")


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)
