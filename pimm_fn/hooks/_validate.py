"""Moved to ``pimm_fn.core.validate``, the one validator module; kept so old imports still work."""

from pimm_fn.core.validate import int_at_least, is_bool, is_callable, non_empty_str, one_of

__all__ = ["int_at_least", "one_of", "non_empty_str", "is_callable", "is_bool"]
