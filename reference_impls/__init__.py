"""Reference implementations of standard training-infrastructure parts.

One subpackage per component (attention, collectives, data, training, ...), each wrapped by
suites under ``suites/`` and asv benchmarks under ``suites/benchmarks``. Nothing here imports
pytest or ``harness``: dependencies point from suites to both, never back.
"""
