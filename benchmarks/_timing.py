"""Timing shared by the benchmark scripts: the suite's (``scorch.bench.timeit``), medians of
runs alternated in one process, each round in a new (seeded) order."""

from __future__ import annotations

from scorch.bench.workloads import timeit  # noqa: F401
