"""Placeholder: replaced by the tolerance module."""
DEFAULT_TOLERANCES: dict = {}


def assert_close(actual, expected, *, rtol=None, atol=None, **kwargs):  # pragma: no cover
    raise NotImplementedError


def rel_error(a, b):  # pragma: no cover
    raise NotImplementedError
