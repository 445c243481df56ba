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


def add_malloc_option(ap):
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc as it is (default: keep freed large blocks for reuse, "
                         "for scorch's and torch's outputs alike; see scorch.runtime.keep_freed_memory)")


def apply_malloc_option(args) -> str:
    """Apply ``--default-malloc`` (or not) and describe the allocator for the header line."""
    from scorch import runtime
    if not args.default_malloc and runtime.keep_freed_memory():
        return "malloc keeps freed large blocks (scorch.runtime.keep_freed_memory)"
    return "default malloc (outputs over 32 MiB are fresh mmaps)"
