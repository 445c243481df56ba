"""Sparse ops against the closest torch.sparse route, on PubMed and ca-AstroPh.

CSR softmax (torch: COO softmax), row sums (torch: COO sum), sparse + sparse
(torch: COO add), the maximum of two patterns (torch: ``B + relu(A - B)`` on COO),
and the backward of SpMM w.r.t. the values and the dense operand (torch: CSR
autograd through ``torch.sparse.mm``).  Medians, alternated
in one process; results checked against each other first.

    python benchmarks/bench_ops.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path

import torch

import scorch
from scorch.bench.report import add_malloc_option, apply_malloc_option
from scorch.datasets import load_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import timeit  # noqa: E402

warnings.filterwarnings("ignore", message=".*beta.*")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("SCORCH_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--repeat", type=int, default=15)
    add_malloc_option(ap)
    args = ap.parse_args()
    malloc = apply_malloc_option(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {malloc}")
    names = [n for n in ("pubmed", "ca-astroph") if (Path(args.data) / f"{n}.npz").exists()] or ["cora"]
    rows = []
    for name in names:
        g = load_graph(name, args.data if name != "cora" else None)
        gen = torch.Generator().manual_seed(0)
        A = g.adjacency("csr")
        A = A.with_values(torch.rand(A.nnz, generator=gen))
        # a second matrix with another pattern: the same graph with its node ids shuffled
        perm = torch.randperm(g.num_nodes, generator=gen)
        B = scorch.from_coo(perm[g.edge_index], torch.rand(g.edge_index.shape[1], generator=gen),
                              (g.num_nodes, g.num_nodes), format="csr")
        Acoo, Bcoo, Acsr = A.to_torch().to_sparse_coo().coalesce(), B.to_torch().to_sparse_coo().coalesce(), A.to_torch()

        assert torch.allclose(torch.softmax(A, 1).to_dense(), torch.sparse.softmax(Acoo, 1).to_dense(), atol=1e-6)
        t = timeit([lambda: torch.softmax(A, 1), lambda: torch.sparse.softmax(Acoo, 1)], args.repeat)
        rows.append(("softmax (dim=1)", name, *t, "torch.sparse.softmax on COO"))

        assert torch.allclose(A.sum(1), torch.sparse.sum(Acoo, 1).to_dense(), atol=1e-4)
        t = timeit([lambda: A.sum(1), lambda: torch.sparse.sum(Acoo, 1)], args.repeat)
        rows.append(("row sums", name, *t, "torch.sparse.sum on COO"))

        assert torch.allclose((A + B).to_dense(), (Acoo + Bcoo).to_dense(), atol=1e-6)
        t = timeit([lambda: A + B, lambda: Acoo + Bcoo], args.repeat)
        rows.append(("sparse + sparse", name, *t, "COO + COO"))

        # torch has no maximum of two sparse tensors: its closest route is b + relu(a - b) on COO
        assert torch.allclose(torch.maximum(A, B).to_dense(), (Bcoo + (Acoo - Bcoo).relu()).to_dense(), atol=1e-6)
        t = timeit([lambda: torch.maximum(A, B), lambda: Bcoo + (Acoo - Bcoo).relu()], args.repeat)
        rows.append(("maximum(A, B)", name, *t, "B + relu(A - B) on COO"))

        X = torch.randn(A.shape[0], 64, requires_grad=True)
        v = A.values().clone().requires_grad_()
        vt = Acsr.values().clone().requires_grad_()
        G = torch.randn(A.shape[0], 64)

        def ours():
            (A.with_values(v) @ X).backward(G)

        def theirs():
            At = torch.sparse_csr_tensor(Acsr.crow_indices(), Acsr.col_indices(), vt, A.shape)
            torch.sparse.mm(At, X).backward(G)
        ours()
        gv, gx = v.grad.clone(), X.grad.clone()
        v.grad = X.grad = None
        theirs()
        assert torch.allclose(gx, X.grad, atol=1e-3) and torch.allclose(gv, vt.grad.to_dense() if vt.grad.is_sparse
                                                                       else vt.grad, atol=1e-3)
        t = timeit([ours, theirs], args.repeat)
        rows.append(("SpMM fwd+bwd (K=64)", name, *t, "torch.sparse.mm CSR autograd"))

    print("\n| op | graph | scorch ms | torch ms | speedup | torch route |")
    print("|---|---|---|---|---|---|")
    for op, name, a, b, what in rows:
        print(f"| {op} | {name} | {1e3 * a:.3f} | {1e3 * b:.3f} | {b / a:.2f}x | {what} |")
    ops = {}
    for op, _, a, b, _ in rows:
        ops.setdefault(op, []).append(b / a)
    for op, r in ops.items():
        print(f"{op}: geometric mean {math.exp(sum(map(math.log, r)) / len(r)):.2f}x")


if __name__ == "__main__":
    main()
