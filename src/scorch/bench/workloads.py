"""Benchmark workloads and the machinery that checks and times them.

A workload is a generator of :class:`Case` objects; each case holds its inputs
(built once) and a list of :class:`System` callables computing the same result.
:func:`run_case` runs every system once, checks agreement against the case's
reference system (errors become rows, not timings), times the agreeing systems
alternated in one process and returns one row per system.
"""

from __future__ import annotations

import math
import random
import resource
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

import scorch
from scorch.datasets import attention_mask, graph_like, load_graph, multi_hot, pruned_weight  # noqa: F401

warnings.filterwarnings("ignore", message=".*beta.*")
warnings.filterwarnings("ignore", message=".*[Ss]parse.*support.*")
warnings.filterwarnings("ignore", message=".*[Ss]parse invariant checks.*")

try:  # optional
    import scipy.sparse as _sp
except Exception:  # pragma: no cover
    _sp = None

try:  # optional
    import torch_geometric.nn as _pyg
except Exception:  # pragma: no cover
    _pyg = None

try:  # optional
    import psutil as _psutil
except Exception:  # pragma: no cover
    _psutil = None


# ---------------------------------------------------------------- data structures

@dataclass
class System:
    name: str
    fn: Callable[[], object]
    baseline: bool = False      # one of the systems the speedup is measured against (the faster one)
    reference: bool = False     # the output every other system is checked against


@dataclass
class Case:
    workload: str               # group: kernels, gnn, moe, attention, mlp
    name: str                   # e.g. "SpMM K=64 / cora"
    systems: list
    atol: float = 1e-4
    rtol: float = 1e-3
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------- timing (benchmarks/_timing.py re-exports it)

def timeit(fns, repeat: int, budget: float | None = None, warmup: bool = True):
    """Median seconds of each fn, the fns run alternately (fair on a noisy, shared machine),
    each round in a new order (seeded shuffle): in a fixed order each system would always run
    right after the same other one and inherit what it leaves -- the caches it warmed with the
    same operands, or evicted, and OpenMP threads awake or asleep after a single-threaded run.

    One warm-up call each (unless ``warmup=False``, when the caller has just run them);
    with ``budget`` (seconds) the repeat count is adjusted after the first timed round: lowered
    (to at least 3) so that the timed rounds take at most about that long, raised (up to
    1000) so that they take at least a tenth of it."""
    if warmup:
        for f in fns:
            f()
    ts = [[] for _ in fns]
    done = 0
    order, rng = list(range(len(fns))), random.Random(0)
    while done < repeat:
        rng.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
        done += 1
        if done == 1 and budget is not None:
            t_round = sum(t[0] for t in ts)
            if t_round > 0:
                # fast cases get more rounds (a tenth of the budget at least: sub-millisecond medians
                # over 20 rounds move by 10-20% on a shared machine), slow ones fewer (at least 3)
                more = max(repeat, min(int(0.1 * budget / t_round), 1000))
                repeat = max(3, min(more, int(budget / t_round)))
    return [statistics.median(t) for t in ts]


def peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MB (getrusage; psutil as fallback)."""
    try:
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024
    except Exception:  # pragma: no cover
        if _psutil is not None:
            return _psutil.Process().memory_info().rss / 2**20
        return float("nan")


# ---------------------------------------------------------------- agreement

def _is_sparse(x) -> bool:
    return isinstance(x, scorch.SparseTensor) or (isinstance(x, torch.Tensor) and x.layout != torch.strided) \
        or (_sp is not None and _sp.issparse(x))


def _to_scipy(x):
    """A canonical (sorted, duplicates summed) scipy CSR copy: the CSR results of SpGEMM
    may have unsorted columns within a row, which scipy's arithmetic does not expect."""
    if isinstance(x, scorch.SparseTensor):
        x = x.to_torch()
    if isinstance(x, torch.Tensor):
        if x.layout == torch.sparse_csr:
            crow = x.crow_indices().long()
            r = torch.repeat_interleave(torch.arange(x.shape[0]), crow[1:] - crow[:-1])
            c, v = x.col_indices().long(), x.values()
        else:
            x = x.to_sparse_coo().coalesce()
            (r, c), v = x.indices(), x.values()
        return _sp.coo_array((v.double().numpy(), (r.numpy(), c.numpy())), shape=tuple(x.shape)).tocsr()
    x = _sp.coo_array(x)
    return _sp.coo_array((x.data.astype(np.float64), (x.row, x.col)), shape=x.shape).tocsr()


def _to_dense(x) -> torch.Tensor:
    if isinstance(x, scorch.SparseTensor):
        return x.to_dense().as_subclass(torch.Tensor)
    if isinstance(x, torch.Tensor):
        return x.to_dense() if x.layout != torch.strided else x
    if _sp is not None and _sp.issparse(x):
        return torch.from_numpy(np.asarray(x.toarray()))
    return torch.as_tensor(np.asarray(x))


def max_error(out, ref):
    """``(max |out - ref|, max |ref|)``; sparse results (2-d) are compared as scipy CSR, so
    no large dense matrix is formed; explicit zeros and absent entries count the same."""
    if _is_sparse(out) and _is_sparse(ref) and _sp is not None and len(tuple(ref.shape)) == 2:
        a, b = _to_scipy(out), _to_scipy(ref)
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"shape {tuple(a.shape)} != reference shape {tuple(b.shape)}")
        d = abs(a.astype(np.float64) - b.astype(np.float64))
        return (float(d.max()) if d.nnz else 0.0), (float(abs(b).max()) if b.nnz else 0.0)
    a, b = _to_dense(out).double(), _to_dense(ref).double()
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"shape {tuple(a.shape)} != reference shape {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0, 0.0
    return float((a - b).abs().max()), float(b.abs().max())


def check_agreement(outputs: dict, reference: str, atol: float, rtol: float) -> dict:
    """``{system: error message}`` for every output that disagrees with ``outputs[reference]``
    (allclose-style: max |out - ref| <= atol + rtol * max |ref|, and no NaN/inf mismatch)."""
    errors = {}
    ref = outputs[reference]
    for name, out in outputs.items():
        if name == reference:
            continue
        try:
            err, scale = max_error(out, ref)
        except Exception as e:  # noqa: BLE001
            errors[name] = f"cannot compare with {reference}: {type(e).__name__}: {e}"
            continue
        if not (err <= atol + rtol * scale):  # also catches NaN
            errors[name] = f"disagrees with {reference}: max abs err {err:.3g} (tol {atol + rtol * scale:.3g})"
    return errors


# ---------------------------------------------------------------- running a case

def run_case(case: Case, repeat: int, budget: float | None = None) -> list:
    """Rows (dicts) for one case: agreement check, then alternated timing of the agreeing systems."""
    rss_before = peak_rss_mb()
    outputs, errors = {}, {}
    ref_name = next((s.name for s in case.systems if s.reference), case.systems[0].name)
    with torch.no_grad():
        for s in case.systems:
            try:
                outputs[s.name] = s.fn()
            except Exception as e:  # noqa: BLE001
                errors[s.name] = f"{type(e).__name__}: {e}"[:300]
        if ref_name in errors:
            # no reference: nothing can be checked, every system is an error row
            for s in case.systems:
                errors.setdefault(s.name, f"reference {ref_name} failed")
        else:
            errors.update(check_agreement(outputs, ref_name, case.atol, case.rtol))
        outputs.clear()
        ok = [s for s in case.systems if s.name not in errors]
        # the agreement run above was the warm-up (kernels compiled, caches filled)
        times = dict(zip([s.name for s in ok], timeit([s.fn for s in ok], repeat, budget, warmup=False))) if ok else {}
    base = [times[s.name] for s in case.systems if s.baseline and s.name in times]
    t_base = min(base) if base else None
    base_names = [s.name for s in case.systems if s.baseline]
    rss_after = peak_rss_mb()
    rows = []
    for s in case.systems:
        t = times.get(s.name)
        rows.append({
            "workload": case.workload, "case": case.name, "system": s.name,
            "median_ms": None if t is None else 1e3 * t,
            "speedup": None if (t is None or t_base is None) else t_base / t,
            "baseline": " / ".join(base_names), "is_baseline": s.baseline,
            "peak_rss_mb": rss_after, "rss_delta_mb": max(0.0, rss_after - rss_before),
            "error": errors.get(s.name),
            **{f"param_{k}": v for k, v in case.extra.items()},
        })
    return rows


# ---------------------------------------------------------------- helpers for the systems

def _csr_coo(A: scorch.SparseTensor):
    """torch.sparse CSR and coalesced COO copies of a 2-d SparseTensor."""
    T = A.to_torch()
    if T.layout != torch.sparse_csr:
        T = T.to_sparse_csr()
    return T, T.to_sparse_coo().coalesce()


def _scipy_of(T):
    return _sp.csr_array((T.values().numpy(), T.col_indices().numpy(), T.crow_indices().numpy()),
                         shape=tuple(T.shape))


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- graphs

def graphs(cfg, names_full=("cora", "citeseer", "pubmed", "ca-astroph"), names_quick=("cora", "citeseer")):
    """The real graphs available (Cora always), plus the ogbn-arxiv-sized R-MAT graph in full mode."""
    out = []
    names = names_quick if cfg.quick else names_full
    for name in names:
        try:
            if name == "cora":
                out.append(load_graph("cora"))
            elif cfg.data and (cfg.data / f"{name}.npz").exists():
                out.append(load_graph(name, cfg.data))
        except Exception as e:  # noqa: BLE001
            print(f"[bench] cannot load {name}: {e}", file=sys.stderr)
    return out


# ---------------------------------------------------------------- 1. kernels

def kernels(cfg):
    names = ("cora", "pubmed") if not cfg.quick else ("cora",)
    for g in graphs(cfg, names, names):
        A = g.adjacency("csr")
        A = A.with_values(torch.rand(A.nnz, generator=_gen(0)) + 0.5)
        T, C = _csr_coo(A)
        n = A.shape[0]
        S = _scipy_of(T) if _sp is not None else None
        ones = A.with_values(torch.ones(A.nnz))
        Tones = torch.sparse_csr_tensor(T.crow_indices(), T.col_indices(), torch.ones(A.nnz), T.shape)

        X = torch.randn(n, 64, generator=_gen(1))
        systems = [System("scorch", lambda: A @ X),
                   System("torch.sparse CSR", lambda: T @ X, baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch.sparse.mm(C, X), baseline=True)]
        if S is not None:
            Xn = X.numpy()
            systems.append(System("scipy", lambda: S @ Xn))
        yield Case("kernels", f"SpMM K=64 / {g.name}", systems)

        Q, Kt = torch.randn(n, 16, generator=_gen(2)), torch.randn(n, 16, generator=_gen(3))
        KT = Kt.t()
        # sampled_addmm computes (Q @ K^T) on the pattern: the 0/1 pattern makes the sums equal
        systems = [System("scorch", lambda: torch.einsum("ij,ik,jk->ij", ones, Q, Kt)),
                   System("torch.sparse CSR", lambda: torch.sparse.sampled_addmm(Tones, Q, KT, beta=0.0),
                          baseline=True, reference=True)]
        yield Case("kernels", f"SDDMM K=16 / {g.name}", systems)

        x = torch.randn(n, generator=_gen(4))
        systems = [System("scorch", lambda: A @ x),
                   System("torch.sparse CSR", lambda: T @ x, baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch.mv(C, x), baseline=True)]
        if S is not None:
            xn = x.numpy()
            systems.append(System("scipy", lambda: S @ xn))
        yield Case("kernels", f"SpMV / {g.name}", systems)

        systems = [System("scorch", lambda: A @ A),
                   System("torch.sparse CSR", lambda: T @ T, baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch.sparse.mm(C, C), baseline=True)]
        if S is not None:
            systems.append(System("scipy", lambda: S @ S))
        yield Case("kernels", f"SpGEMM A@A / {g.name}", systems)

        systems = [System("scorch", lambda: torch.softmax(A, 1)),
                   System("torch.sparse COO", lambda: torch.sparse.softmax(C, 1), baseline=True, reference=True)]
        yield Case("kernels", f"softmax dim=1 / {g.name}", systems, atol=1e-6)


# ---------------------------------------------------------------- 2. GNNs

def _gnn_graphs(cfg):
    out = graphs(cfg)
    if not cfg.quick:
        out.append(graph_like("ogbn-arxiv"))
    return out


def _norm_adj(A_sc, n, kind):
    """Hand-built operand for the torch routes: GCN D^-1/2 (A+I) D^-1/2 or SAGE row mean."""
    from scorch.nn import gcn_norm
    if kind == "gcn":
        return gcn_norm(A_sc, n)
    T = A_sc.to_torch().to_sparse_coo().coalesce()
    r, c = T.indices()
    w = T.values()
    deg = torch.zeros(n).index_add_(0, r, w)
    return scorch.from_coo(torch.stack([r, c]), w / deg[r].clamp_min(1e-30), (n, n), format="csr")


def gnn(cfg):
    import torch.nn.functional as F
    from scorch.nn import GATConv, GCNConv, SAGEConv
    fin, hid, fout = (64, 32, 16) if cfg.quick else (128, 64, 16)
    for g in _gnn_graphs(cfg):
        n = g.num_nodes
        ei = torch.unique(g.edge_index, dim=1)                  # distinct edges (pattern = weights 1)
        A = scorch.from_coo(ei, torch.ones(ei.shape[1]), (n, n), format="csr")   # A[i, j]: i aggregates j
        ei_pyg = ei.flip(0)                                     # PyG: (source j, target i)
        x = torch.randn(n, fin, generator=_gen(5))
        dense_ok = n <= cfg.dense_max_nodes

        # ---- GCN
        torch.manual_seed(0)
        c1, c2 = GCNConv(fin, hid, cached=True), GCNConv(hid, fout, cached=True)
        Ah = _norm_adj(A, n, "gcn")
        Th, Ch = _csr_coo(Ah)

        def torch_gcn(M):
            h = F.relu(M @ (x @ c1.lin.weight.t()) + c1.bias)
            return M @ (h @ c2.lin.weight.t()) + c2.bias
        systems = [System("scorch", lambda: c2(F.relu(c1(x, A)), A)),
                   System("torch.sparse CSR", lambda: torch_gcn(Th), baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch_gcn(Ch), baseline=True)]
        if dense_ok:
            D = Th.to_dense()
            systems.append(System("dense torch", lambda: torch_gcn(D)))
        if _pyg is not None:
            p1, p2 = _pyg.GCNConv(fin, hid, cached=True), _pyg.GCNConv(hid, fout, cached=True)
            p1.load_state_dict(c1.state_dict(), strict=False)
            p2.load_state_dict(c2.state_dict(), strict=False)
            systems.append(System("PyG", lambda: p2(F.relu(p1(x, ei_pyg)), ei_pyg)))
        yield Case("gnn", f"GCN 2-layer / {g.name}", systems)

        # ---- GraphSAGE (mean)
        torch.manual_seed(1)
        s1, s2 = SAGEConv(fin, hid, cached=True), SAGEConv(hid, fout, cached=True)
        Am = _norm_adj(A, n, "mean")
        Tm, Cm = _csr_coo(Am)

        def torch_sage(M):
            # aggregate in the narrower width, as scorch's and PyG's layers do
            h = F.relu(M @ (x @ s1.lin_l.weight.t()) + s1.lin_l.bias + x @ s1.lin_r.weight.t())
            return M @ (h @ s2.lin_l.weight.t()) + s2.lin_l.bias + h @ s2.lin_r.weight.t()
        systems = [System("scorch", lambda: s2(F.relu(s1(x, A)), A)),
                   System("torch.sparse CSR", lambda: torch_sage(Tm), baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch_sage(Cm), baseline=True)]
        if dense_ok:
            Dm = Tm.to_dense()
            systems.append(System("dense torch", lambda: torch_sage(Dm)))
        if _pyg is not None:
            q1, q2 = _pyg.SAGEConv(fin, hid, aggr="mean"), _pyg.SAGEConv(hid, fout, aggr="mean")
            q1.load_state_dict(s1.state_dict(), strict=False)
            q2.load_state_dict(s2.state_dict(), strict=False)
            systems.append(System("PyG", lambda: q2(F.relu(q1(x, ei_pyg)), ei_pyg)))
        yield Case("gnn", f"GraphSAGE 2-layer / {g.name}", systems)

        # ---- GAT (4 heads x 8 concat, then 1 head)
        torch.manual_seed(2)
        heads = 4
        hid_g = max(1, hid // heads)
        g1, g2 = GATConv(fin, hid_g, heads=heads, cached=True), GATConv(hid_g * heads, fout, heads=1, cached=True)
        loops = torch.arange(n)
        keep = ei[0] != ei[1]
        pat = scorch.from_coo(torch.stack([torch.cat([ei[0][keep], loops]), torch.cat([ei[1][keep], loops])]),
                                torch.ones(int(keep.sum()) + n), (n, n), format="csr")
        Tp, Cp = _csr_coo(pat)
        row, col = Cp.indices()
        crow = Tp.crow_indices()
        idx = Cp.indices()

        def torch_gat_layer(layer, h_in, route, Dmask=None):
            H, Co = layer.heads, layer.out_channels
            h = (h_in @ layer.lin.weight.t()).view(n, H, Co)
            a_src, a_dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
            outs = []
            for k in range(H):
                if Dmask is not None:
                    e = F.leaky_relu(a_dst[:, k, None] + a_src[None, :, k], layer.negative_slope)
                    alpha = torch.softmax(e.masked_fill(~Dmask, float("-inf")), dim=1)
                    outs.append(alpha @ h[:, k])
                    continue
                e = F.leaky_relu(a_dst[row, k] + a_src[col, k], layer.negative_slope)
                S = torch.sparse_coo_tensor(idx, e, (n, n), is_coalesced=True)
                P = torch.sparse.softmax(S, 1)
                if route == "csr":   # coalesced COO order == CSR order
                    P = torch.sparse_csr_tensor(crow, Tp.col_indices(), P.values(), (n, n))
                    outs.append(P @ h[:, k])
                else:
                    outs.append(torch.sparse.mm(P, h[:, k]))
            out = torch.cat(outs, 1) if layer.concat else torch.stack(outs).mean(0)
            return out + layer.bias

        def torch_gat(route, Dmask=None):
            h = F.elu(torch_gat_layer(g1, x, route, Dmask))
            return torch_gat_layer(g2, h, route, Dmask)
        systems = [System("scorch", lambda: g2(F.elu(g1(x, A)), A)),
                   System("torch.sparse CSR", lambda: torch_gat("csr"), baseline=True, reference=True),
                   System("torch.sparse COO", lambda: torch_gat("coo"), baseline=True)]
        # dense GAT holds ~3 n x n score matrices per head (4-5 GB on PubMed / ca-AstroPh, 10 s a
        # call): beyond 1 GiB it is left out -- freeing that much heap stalls whichever system
        # runs next (glibc trimming it under keep_freed_memory: 0.2-0.7 s, measured)
        if dense_ok and 3 * n * n * 4 <= 2**30:
            Dmask = Tp.to_dense() != 0
            systems.append(System("dense torch", lambda: torch_gat("dense", Dmask)))
        if _pyg is not None:
            r1 = _pyg.GATConv(fin, hid_g, heads=heads)
            r2 = _pyg.GATConv(hid_g * heads, fout, heads=1)
            r1.load_state_dict(g1.state_dict(), strict=False)
            r2.load_state_dict(g2.state_dict(), strict=False)
            systems.append(System("PyG", lambda: r2(F.elu(r1(x, ei_pyg)), ei_pyg)))
        yield Case("gnn", f"GAT 2-layer / {g.name}", systems)


# ---------------------------------------------------------------- 3. MoE

def moe(cfg):
    from scorch.nn import MoE
    B, d = (512, 128) if cfg.quick else (4096, 512)
    for n_exp in (8, 64):
        for k in (1, 2):
            torch.manual_seed(10 + n_exp + k)
            m = MoE(d, d, n_experts=n_exp, k=k).eval()
            x = torch.randn(B, d, generator=_gen(6))

            def gather(m=m, x=x):
                idx, w = m.route(x)                        # B x k experts and gate values
                expert = idx.reshape(-1)
                token = torch.arange(x.shape[0]).repeat_interleave(m.k)
                order = torch.argsort(expert, stable=True)
                counts = torch.bincount(expert, minlength=m.n_experts).tolist()
                tok = token[order]
                ws = w.reshape(-1)[order].unsqueeze(1)
                out = torch.zeros(x.shape[0], m.d_out)
                start = 0
                for e, c in enumerate(counts):
                    if c:
                        t = tok[start:start + c]
                        out.index_add_(0, t, (torch.addmm(m.bias[e], x[t], m.E[e])) * ws[start:start + c])
                    start += c
                return out
            systems = [System("scorch", lambda m=m, x=x: m(x)),
                       System("dense_reference (one-hot)", lambda m=m, x=x: m.dense_reference(x),
                              baseline=True, reference=True),
                       System("torch index-gather", gather)]
            yield Case("moe", f"MoE E={n_exp} top-{k} B={B} d={d}", systems, atol=1e-4, rtol=1e-3)


# ---------------------------------------------------------------- 4. sparse attention

def attention(cfg):
    from scorch.nn import SparseAttention
    E, H, W = 256, 4, 256
    for L in ((1024,) if cfg.quick else (1024, 4096)):
        torch.manual_seed(20)
        m = SparseAttention(E, num_heads=H, pattern="window", window=W).eval()
        x = torch.randn(L, E, generator=_gen(7))
        rows, cols = m.pattern_coords(L)
        M = scorch.from_coo(torch.stack([rows, cols]), torch.ones(rows.numel()), (L, L), format="csr")
        Tm, Cm = _csr_coo(M)
        idx = Cm.indices()
        scale = 1.0 / math.sqrt(m.head_dim)

        def torch_route(route, m=m, x=x, Tm=Tm, idx=idx, L=L):
            q, k, v = m._heads(x.unsqueeze(0))
            outs = []
            for h in range(q.shape[0]):
                S = torch.sparse.sampled_addmm(Tm, q[h], k[h].t(), beta=0.0, alpha=scale)   # CSR
                P = torch.sparse.softmax(torch.sparse_coo_tensor(idx, S.values(), (L, L), is_coalesced=True), 1)
                if route == "csr":
                    P = torch.sparse_csr_tensor(Tm.crow_indices(), Tm.col_indices(), P.values(), (L, L))
                    outs.append(P @ v[h])
                else:
                    outs.append(torch.sparse.mm(P, v[h]))
            return m._merge(torch.stack(outs), 1, L).squeeze(0)
        systems = [System("scorch", lambda m=m, x=x: m(x)),
                   System("dense_reference (masked)", lambda m=m, x=x: m.dense_reference(x), reference=True),
                   System("torch.sparse CSR", lambda: torch_route("csr"), baseline=True),
                   System("torch.sparse COO", lambda: torch_route("coo"), baseline=True)]
        yield Case("attention", f"window attention L={L} w={W} h={H} E={E}", systems)


# ---------------------------------------------------------------- 5. pruned MLP

def mlp(cfg):
    import torch.nn.functional as F
    from scorch.nn import SparseLinear
    width, batch = (1024, 256)
    for sparsity in (0.95, 0.99):
        Ws = [pruned_weight(width, width, sparsity, seed=30 + i) for i in range(3)]
        bs = [torch.randn(width, generator=_gen(40 + i)) * 0.01 for i in range(3)]
        dense_layers, sparse_layers, csr, coo = [], [], [], []
        for W, b in zip(Ws, bs):
            lin = torch.nn.Linear(width, width)
            with torch.no_grad():
                lin.weight.copy_(W.to_dense())
                lin.bias.copy_(b)
            dense_layers.append(lin)
            sparse_layers.append(SparseLinear.from_dense(lin, mask=W.to_dense() != 0))
            T, C = _csr_coo(W)
            csr.append(T)
            coo.append(C)
        x = torch.randn(batch, width, generator=_gen(8))

        def run(layers):
            h = x
            for i, f in enumerate(layers):
                h = f(h)
                if i < len(layers) - 1:
                    h = F.relu(h)
            return h

        def torch_sparse(mats):
            # (W @ h^T)^T + b: torch.sparse has sparse @ dense, not dense @ sparse
            return run([lambda h, M=M, b=b: (M @ h.t()).t() + b for M, b in zip(mats, bs)])
        systems = [System("scorch SparseLinear", lambda: run(sparse_layers)),
                   System("dense nn.Linear", lambda: run(dense_layers), reference=True),
                   System("torch.sparse CSR", lambda: torch_sparse(csr), baseline=True),
                   System("torch.sparse COO", lambda: torch_sparse(coo), baseline=True)]
        yield Case("mlp", f"pruned MLP 3x{width} {int(sparsity * 100)}% B={batch}", systems)


# ---------------------------------------------------------------- 6. recommender (multi-hot embedding lookup)

def recsys(cfg):
    """Sum-pooled embedding lookup of power-law multi-hot rows: ``X (B x F, 32 per row) @ Emb (F x 64)``."""
    B, F_, nnz, d = (1024, 20_000, 32, 64) if cfg.quick else (8192, 200_000, 32, 64)
    X = multi_hot(B, F_, nnz, seed=50)
    T, C = _csr_coo(X)
    emb = torch.randn(F_, d, generator=_gen(9))
    bag = torch.nn.EmbeddingBag.from_pretrained(emb, mode="sum")
    cols, offsets = T.col_indices().long(), T.crow_indices()[:-1].long()
    systems = [System("scorch", lambda: X @ emb),
               System("torch.sparse CSR", lambda: T @ emb, baseline=True, reference=True),
               System("torch.sparse COO", lambda: torch.sparse.mm(C, emb), baseline=True),
               System("nn.EmbeddingBag (sum)", lambda: bag(cols, offsets))]
    if B * F_ <= 50_000_000:
        D = T.to_dense()
        systems.append(System("dense torch", lambda: D @ emb))
    yield Case("recsys", f"multi-hot embedding-bag B={B} F={F_} nnz/row={nnz} d={d}", systems)
    yield from _lightfm(cfg)


def _lightfm(cfg):
    """LightFM-style scoring of candidate pairs: ``scorch.nn.Recommender`` against the same
    model written with torch.sparse (CSR SpMM / SpMV, ``sampled_addmm``, bias gathers)."""
    from scorch.nn import Recommender
    nU, nI, Fu, Fi, nu, ni, d, cand = (1024, 512, 20_000, 5_000, 32, 16, 64, 50) if cfg.quick else \
        (8192, 4096, 200_000, 50_000, 32, 16, 64, 100)
    torch.manual_seed(60)
    model = Recommender(Fu, Fi, d).eval()
    with torch.no_grad():
        model.user_bias.normal_(0, 0.1)
        model.item_bias.normal_(0, 0.1)
    Xu, Xi = multi_hot(nU, Fu, nu, seed=61), multi_hot(nI, Fi, ni, seed=62)
    g = _gen(63)
    items = torch.rand(nU, nI, generator=g).topk(cand, dim=1).indices.sort(1).values
    pairs = scorch.from_coo(torch.stack([torch.arange(nU).repeat_interleave(cand), items.reshape(-1)]),
                              torch.ones(nU * cand), (nU, nI), format="csr")
    Tu, Cu = _csr_coo(Xu)
    Ti, Ci = _csr_coo(Xi)
    Tp, Cp = _csr_coo(pairs)
    rows, cols = Cp.indices()
    Eu, Ei, bu, bi = (p.detach() for p in (model.user_embedding, model.item_embedding, model.user_bias,
                                           model.item_bias))

    def torch_csr():
        Ur, Vr = Tu @ Eu, Ti @ Ei
        S = torch.sparse.sampled_addmm(Tp, Ur, Vr.t(), beta=0.0)
        vals = S.values() + (Tu @ bu)[rows] + (Ti @ bi)[cols]
        return torch.sparse_csr_tensor(Tp.crow_indices(), Tp.col_indices(), vals, Tp.shape)

    def torch_coo():
        Ur, Vr = torch.sparse.mm(Cu, Eu), torch.sparse.mm(Ci, Ei)
        ub, ib = torch.sparse.mm(Cu, bu.unsqueeze(1)).squeeze(1), torch.sparse.mm(Ci, bi.unsqueeze(1)).squeeze(1)
        vals = (Ur[rows] * Vr[cols]).sum(1) + ub[rows] + ib[cols]
        return torch.sparse_coo_tensor(Cp.indices(), vals, Cp.shape, is_coalesced=True)
    systems = [System("scorch Recommender", lambda: model(Xu, Xi, pairs)),
               System("torch.sparse CSR", torch_csr, baseline=True, reference=True),
               System("torch.sparse COO", torch_coo, baseline=True)]
    yield Case("recsys", f"LightFM scoring U={nU} I={nI} features {Fu}/{Fi} d={d} candidates/user={cand}", systems)


WORKLOADS = {"kernels": kernels, "gnn": gnn, "moe": moe, "attention": attention, "mlp": mlp, "recsys": recsys}
