"""Tolerances from evidence (issue #29): record how close every numeric check comes to its
bound, fit the tail of that over many seeds, and propose the tightest bound that will not flake.

- :mod:`.recording`: the plugin's ``--harness-record-errors`` mode (one JSON line per check
  site per test run) and the per-site bound override ``$HARNESS_TOLERANCE_OVERRIDES``.
- :mod:`.fit`: peaks over threshold with a generalized Pareto tail and a bootstrap interval.
- :mod:`.propose`: runs tests over many seeds, fits each site, writes verdicts and a patch.
- :mod:`.reference`: :func:`assert_close_to_reference`, expected values from float64.

Nothing here is imported by :mod:`harness.tolerances` itself: it only calls the observer the
plugin installs (:func:`harness.tolerances.set_observer`), so ``assert_close`` pays one global
lookup when recording is off.
"""

from harness.tolerances_evidence.reference import assert_close_to_reference

__all__ = ["assert_close_to_reference"]
