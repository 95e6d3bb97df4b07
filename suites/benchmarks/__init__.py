"""asv benchmarks of ml-harness: one module per component (``bench_<component>.py``).

Conventions (README.md in this folder): classes whose name starts or ends with ``Gpu``/``GPU``
form the GPU group and skip without CUDA by raising ``NotImplementedError`` in ``setup``;
every other class is in the CPU group. ``harness perf run --group cpu|gpu`` selects a group.
This folder is excluded from pytest collection (``norecursedirs`` in pyproject.toml).
"""
