"""Which module a benchmark name belongs to: the A/B's zygotes serve one module each (ab.py)."""

from __future__ import annotations

from harness.perf.ab import benchmark_module


def test_the_module_of_a_benchmark_is_the_deepest_file_or_package_its_name_starts_with(tmp_path):
    (tmp_path / "bench_a.py").write_text("")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "bench_b.py").write_text("")
    assert benchmark_module(tmp_path, "bench_a.Class.time_x(1, 'a.b')") == "bench_a"
    assert benchmark_module(tmp_path, "bench_a.time_y") == "bench_a"
    assert benchmark_module(tmp_path, "pkg.sub.bench_b.Class.time_z") == "pkg.sub.bench_b"
    assert benchmark_module(tmp_path, "pkg.Class.time_w") == "pkg"
