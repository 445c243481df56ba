"""Timing shared by the benchmark scripts: medians of runs alternated in one process."""

from __future__ import annotations

import statistics
import time


def timeit(fns, repeat: int):
    """Median seconds of each fn, the fns run alternately (fair on a noisy, shared machine)."""
    for f in fns:
        f()
    ts = [[] for _ in fns]
    for _ in range(repeat):
        for k, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]

