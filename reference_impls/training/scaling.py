"""Moved: the data-parallel scaling driver is now :mod:`reference_impls.scaling.ddp`.

``python -m reference_impls.training.scaling ...`` keeps working (same options, same
``scaling.json``) and runs it; new work belongs in :mod:`reference_impls.scaling`.
"""

from __future__ import annotations

import sys

from reference_impls.scaling.ddp import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
