"""ml-harness: a CI/test-harness and benchmarking platform for ML training code.

Public API for test authors::

    from harness import assert_close, assert_equal, rel_error

The pytest plugin (``harness.plugin``) is registered through the ``pytest11`` entry point and
adds tiers, seeds, goldens and the quarantine to every pytest run in an environment where
ml-harness is installed. The ``harness`` command line lives in ``harness.cli``.
"""

from harness.tolerances import (
    DEFAULT_TOLERANCES,
    assert_close,
    assert_equal,
    assert_within,
    rel_error,
)

__all__ = ["DEFAULT_TOLERANCES", "assert_close", "assert_equal", "assert_within", "rel_error"]
__version__ = "0.1.0"
