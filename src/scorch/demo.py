"""``python -m scorch.demo``: a short sparse workload on the Cora graph shipped with scorch.

Builds the adjacency matrix from its edge list, converts it through every 2-d
preset format and back (checking each round trip is exact and timing it),
saves and reloads it, then runs a GCN-style propagation ``A @ X`` (on Cora and
on a generated 500k-edge power-law graph) and an SDDMM through scorch's
generated kernels beside torch.sparse and dense torch.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import torch

import scorch
from scorch._version import __version__ as scorch_version
from scorch.datasets import load_graph, rmat


def _median_ms(fn, repeat=7):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _compare_ms(*fns, budget=0.3):
    """Median ms of each fn, run alternately (fair on a shared machine) after one warm-up each,
    for about ``budget`` seconds (at least 7 rounds, at most 1000)."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    t_start = time.perf_counter()
    while len(times[0]) < 7 or (time.perf_counter() - t_start < budget and len(times[0]) < 1000):
        for k, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return [1e3 * statistics.median(t) for t in times]


def _storage_bytes(A) -> int:
    arrays = [A.values(), *(t for t in (*A._pos, *A._crd) if t is not None)]
    return sum(t.numel() * t.element_size() for t in arrays)


def _spmm_line(label, A, At, X, dense):
    ours, theirs = _compare_ms(lambda: A @ X, lambda: At @ X)
    line = f"  {label}: scorch {ours:.3f} ms | torch.sparse CSR {theirs:.3f} ms ({theirs / ours:.2f}x)"
    if dense is not None:
        d = _median_ms(lambda: dense @ X)
        line += f" | dense torch.mm {d:.2f} ms ({d / ours:.1f}x)"
    print(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scorch.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="cora", help="a graph name in $SCORCH_DATA, or an .npz path (default: shipped cora)")
    ap.add_argument("--features", type=int, default=64, help="feature width of X in A @ X")
    args = ap.parse_args(argv)
    if args.features < 1:
        ap.error(f"--features: expected a positive int, got {args.features}")
    try:
        g = load_graph(args.graph)
    except (ValueError, OSError) as e:
        ap.error(f"--graph: {e}")
    n, nnz = g.num_nodes, g.edge_index.shape[1]
    print(f"scorch {scorch_version} demo: {g.name} graph, {n:,} nodes, {nnz:,} directed edges "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")

    t0 = time.perf_counter()
    A = g.adjacency("csr")
    print(f"built the {n}x{n} adjacency in csr from the edge list in {1e3 * (time.perf_counter() - t0):.1f} ms: "
          f"nnz={A.nnz:,}, density={A.density:.2e}, index dtype {A.index_dtype}")
    dense = A.to_dense()

    print(f"\n{'format':<10}{'stored values':>14}{'bytes':>12}{'csr -> fmt':>12}{'fmt -> csr':>12}  exact")
    formats = ["coo", "csr", "csc", "dcsr", "dcsc", "ell", scorch.formats.bsr(2, 2), scorch.formats.bsr(4, 4), "dense"]
    all_exact = True
    for fmt in formats:
        B = A.asformat(fmt)
        to_ms = _median_ms(lambda: A.asformat(fmt))
        back_ms = _median_ms(lambda: B.asformat("csr"))
        exact = torch.equal(B.to_dense(), dense) and torch.equal(B.asformat("csr").to_dense(), dense)
        all_exact &= exact
        print(f"{str(B.format):<10}{B.values().numel():>14,}{_storage_bytes(B):>12,}{to_ms:>10.2f}ms{back_ms:>10.2f}ms  "
              f"{'yes' if exact else 'NO'}")

    buf = io.BytesIO()
    torch.save(A, buf)
    buf.seek(0)
    same = torch.equal(torch.load(buf).to_dense(), dense)
    print(f"\ntorch.save / torch.load round trip ({buf.getbuffer().nbytes:,} bytes): {'exact' if same else 'WRONG'}")

    X = torch.randn(n, args.features)
    At = A.to_torch()  # the same matrix as a torch.sparse CSR tensor (the baseline)
    ok = torch.allclose(A @ X, At @ X, atol=1e-4)  # A @ X: a generated, compiled kernel
    plan = scorch.explain("ij,jk->ik", A, X)
    print(f"\nA @ X (SpMM), loop order {' -> '.join(plan.loop_order)}, {plan.parallel}-parallel, "
          f"path: {plan.dispatch}")
    _spmm_line(f"{g.name}, X {n}x{args.features}", A, At, X, dense)
    big = rmat(16, 500_000, seed=1).adjacency("csr")  # generated: a power-law graph, 65k nodes
    Xb = torch.randn(big.shape[0], args.features)
    ok = ok and torch.allclose(big @ Xb, big.to_torch() @ Xb, atol=1e-3)
    _spmm_line(f"R-MAT 65,536 nodes / {big.nnz:,} edges, X {big.shape[0]}x{args.features}", big, big.to_torch(), Xb,
               None)

    Q, K = torch.randn(n, 16), torch.randn(n, 16)
    S = scorch.einsum("ij,ik,jk->ij", A, Q, K)   # SDDMM: scores only where edges are
    ref_s = torch.sparse.sampled_addmm(At, Q, K.t(), beta=0.0)
    ok_s = torch.allclose(S.values(), ref_s.values(), atol=1e-4)
    s_ms, t_ms = _compare_ms(lambda: scorch.einsum("ij,ik,jk->ij", A, Q, K),
                             lambda: torch.sparse.sampled_addmm(At, Q, K.t(), beta=0.0))
    print(f"SDDMM (edge scores, d=16): scorch {s_ms:.3f} ms | torch.sparse.sampled_addmm {t_ms:.3f} ms "
          f"({t_ms / s_ms:.2f}x); result {S.format} with A's pattern; agree: {'yes' if ok_s else 'NO'}")
    ok = ok and ok_s
    return 0 if (all_exact and same and ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
