"""Conversion speed between the 2-d presets on ~1M-nonzero matrices.

Prints the median time (ms) of every source -> target conversion, on a
uniform random matrix (all presets but dense) and an R-MAT power-law graph
(all but dense and ELL, whose padding to the longest row would be ~800M
slots), next to torch's and scipy's own conversions measured in the same run.
The core issue's target: every conversion well under a second.

    python benchmarks/bench_convert.py [--nnz 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import scorch
from scorch.datasets import rmat, uniform_random


def median_ms(fn, repeat, setup=None):
    """Median ms of ``fn()`` -- or of ``fn(setup())``, ``setup`` untimed."""
    ts = []
    for k in range(repeat + 1):  # the first: warm-up
        arg = setup() if setup is not None else None
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        if k:
            ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def fresh(x):
    """``x`` with copies of its index arrays: a pattern scorch has not seen (conversions remember
    what they derive from a pattern, e.g. CSR <-> CSC's entry order; the table times first ones)."""
    copy = lambda t: None if t is None else t.clone()  # noqa: E731
    return scorch.SparseTensor(x.format, x.shape, tuple(map(copy, x._pos)), tuple(map(copy, x._crd)), x.values())


def run(graph, formats, repeat):
    A = graph.adjacency("coo")
    print(f"\n{graph.name}: {A.shape[0]:,} x {A.shape[1]:,}, nnz {A.nnz:,}")
    names = [str(scorch.formats.preset(f, 2)) if isinstance(f, str) else str(f) for f in formats]
    src = {n: A.asformat(f) for n, f in zip(names, formats)}
    print("source \\ target " + "".join(f"{n:>9}" for n in names) + "   (median ms)")
    worst = 0.0
    for sn in names:
        row = []
        for f in formats:
            ms = median_ms(lambda x: x.asformat(f), repeat, setup=lambda: fresh(src[sn]))
            worst = max(worst, ms)
            row.append(ms)
        print(f"{sn:<16}" + "".join(f"{ms:>9.1f}" for ms in row))
    # baselines in the same run
    t_coo = A.to_torch()
    t_csr = src["csr"].to_torch()
    base = {
        "torch coo -> csr": median_ms(lambda: t_coo.to_sparse_csr(), repeat),
        "torch csr -> csc": median_ms(lambda: t_csr.to_sparse_csc(), repeat),
    }
    try:
        s_coo = src["coo"].to_scipy()
        s_csr = s_coo.tocsr()
        base["scipy coo -> csr"] = median_ms(lambda: s_coo.tocsr(), repeat)
        base["scipy csr -> csc"] = median_ms(lambda: s_csr.tocsc(), repeat)
    except ImportError:
        pass
    ours = {"torch coo -> csr": ("coo", "csr"), "torch csr -> csc": ("csr", "csc"),
            "scipy coo -> csr": ("coo", "csr"), "scipy csr -> csc": ("csr", "csc")}
    for k, ms in base.items():
        s, t = ours[k]
        mine = median_ms(lambda x: x.asformat(t), repeat, setup=lambda: fresh(src[s]))
        print(f"  baseline {k:<18} {ms:8.1f} ms   scorch {mine:8.1f} ms   ratio {ms / mine:5.2f}x")
    again = median_ms(lambda: src["csr"].asformat("csc"), repeat)
    print(f"  scorch csr -> csc of a pattern converted before (its entry order remembered): {again:.1f} ms")
    print(f"  slowest scorch conversion: {worst:.1f} ms ({'under' if worst < 1000 else 'OVER'} 1 s)")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nnz", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    common = ["coo", "csr", "csc", "dcsr", "dcsc"]
    w1 = run(uniform_random(2**17, args.nnz, seed=1), common + ["ell", scorch.formats.bsr(2, 2)], args.repeat)
    w2 = run(rmat(17, args.nnz, seed=1), common + [scorch.formats.bsr(2, 2)], args.repeat)
    print(f"\nslowest conversion overall: {max(w1, w2):.1f} ms")


if __name__ == "__main__":
    main()
