"""Graph neural-network layers on scorch sparse adjacencies: ``GCNConv``, ``SAGEConv``, ``GATConv``.

Owns turning the accepted adjacency inputs (a 2-d SparseTensor, a ``torch.sparse``
tensor, or a PyG-style ``edge_index``) into one CSR SparseTensor per layer kind
(GCN normalisation, SAGE row-mean, GAT pattern with self-loops), the per-input
cache of that matrix, and the layers themselves.  All structure work is
vectorised torch on the stored entries; the adjacency is never densified, and
the products run scorch's compiled kernels (SpMM, sparse softmax).

Convention (as in PyG): row ``i`` of the adjacency is the node that aggregates,
column ``j`` the neighbour it reads, so ``out = A_hat @ h``.  An ``edge_index``
lists ``(source, target)`` pairs, i.e. it holds ``(j, i)``: ``A[i, j]`` is set
for each column ``edge_index[:, e] = (j, i)``.  Edge values of a sparse input are
used as edge weights by GCN and SAGE (weights that require grad get gradients through the
normalisation; a cached layer rebuilds for them); GAT uses only the pattern.  The edges are the
nonzero entries, whatever the format: a stored zero (a BSR block's padding) is no edge -- but
learned weights keep every stored entry (an edge whose weight is 0 now has a gradient).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .. import convert
from ..errors import ScorchTypeError, ScorchValueError
from ..format import Format, compressed, dense, preset
from ..interop import as_sparse, is_sparse, from_coo
from ..ops import dense as dense_ops
from ..ops.einsum import einsum_add
from ..tensor import SparseTensor

__all__ = ["GATConv", "GCNConv", "SAGEConv", "gcn_norm"]


# ---------------------------------------------------------------- adjacency inputs -> (row, col, weight)

def _edges(adj, num_nodes: int, layer: str, pattern_only: bool = False):
    """``(row, col, weight)`` of the edges of ``adj`` (row = aggregating node): its nonzero
    entries -- a stored zero (a block format's padding, say) is no edge, whatever the format --
    or, for learned weights (which require grad) that are read (not ``pattern_only``), every
    stored entry; ``weight`` is None for an ``edge_index``.  Raises naming expected vs actual shapes."""
    row, col, w = _stored_edges(adj, num_nodes, layer, pattern_only)
    if w is None or (w.requires_grad and not pattern_only):
        return row, col, w
    keep = w != 0
    return (row, col, w) if bool(keep.all()) else (row[keep], col[keep], w[keep])


def _stored_edges(adj, num_nodes: int, layer: str, pattern_only: bool):
    if isinstance(adj, SparseTensor) or is_sparse(adj):
        _check_square(adj.shape, num_nodes, layer)
        learned = _learned(adj) and not pattern_only   # learned weights: the normalisation stays in the graph
        if isinstance(adj, SparseTensor):
            if learned:
                adj = adj if adj._format == _CSR2 else adj.asformat("csr")
                coords, vals = _coords(adj)[0], adj.values()
            else:
                coords, vals = _coords(adj)
        else:
            coo = (adj if learned else adj.detach()).to_sparse_coo().coalesce()
            coords, vals = coo.indices(), coo.values()
        if vals.dim() != 1:
            raise ScorchValueError(f"{layer}: adj must hold scalar entries, got values of shape {tuple(vals.shape)}")
        return coords[0], coords[1], vals if learned else vals.detach()
    if isinstance(adj, torch.Tensor):
        return _edge_index(adj, num_nodes, layer)
    raise ScorchTypeError(f"{layer}: adj must be a SparseTensor, a torch.sparse tensor or an edge_index "
                          f"(2 x E int64 tensor), got {type(adj).__name__}")


def _learned(adj, grad_mode_only: bool = True) -> bool:
    """Whether ``adj``'s values are learned: they require grad (with grad mode on, unless not
    ``grad_mode_only``: a cache must not keep them under ``no_grad`` either -- they change)."""
    if (grad_mode_only and not torch.is_grad_enabled()) or not isinstance(adj, torch.Tensor):
        return False
    with torch._C.DisableTorchFunctionSubclass():
        return adj.requires_grad


def _coords(A: SparseTensor):
    """``(2 x nnz int64 coordinates, values)`` of ``A``'s stored entries in storage order; a
    CSR's rows from the pattern's entry rows (a generated kernel, kept with the pattern: 80 ->
    10 us on Cora, where the general path expands every level)."""
    if A._format == _CSR2:
        return torch.stack([convert.entry_parents(A._pos[1]).to(torch.int64), A._crd[1].to(torch.int64)]), A._vals
    return convert.coords_of(A._format, A._shape, A._pos, A._crd, A._vals)


def _check_square(shape, n: int, layer: str) -> None:
    if tuple(shape) != (n, n):
        raise ScorchValueError(f"{layer}: adj must have shape (num_nodes, num_nodes) = ({n}, {n}) "
                               f"for x with {n} rows, got {tuple(shape)}")


def _edge_index(ei: torch.Tensor, n: int, layer: str):
    if ei.dtype.is_floating_point or ei.dtype.is_complex or ei.dtype == torch.bool:
        raise ScorchTypeError(f"{layer}: a dense adj is read as edge_index and must be an integer tensor, "
                              f"got dtype {ei.dtype} (pass a SparseTensor for a weighted adjacency)")
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ScorchValueError(f"{layer}: edge_index must have shape (2, E), got {tuple(ei.shape)}")
    ei = ei.to(torch.int64)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
        raise ScorchValueError(f"{layer}: edge_index entries must lie in [0, num_nodes) = [0, {n}), "
                               f"got [{int(ei.min())}, {int(ei.max())}]")
    return ei[1], ei[0], None  # (source j, target i) -> A[i, j]


def _add_remaining_self_loops(row, col, w, n: int):
    """Self-loops of weight 1 on every node without one; existing loops keep their weight."""
    loop = row == col
    loop_w = torch.ones(n, dtype=w.dtype)
    loop_w[row[loop]] = w[loop]
    nodes = torch.arange(n)
    keep = ~loop
    return torch.cat([row[keep], nodes]), torch.cat([col[keep], nodes]), torch.cat([w[keep], loop_w])


def _csr(row, col, w, n: int) -> SparseTensor:
    return from_coo(torch.stack([row, col]), w, (n, n), format="csr")


def gcn_norm(adj, num_nodes: int, *, add_self_loops: bool = True, normalize: bool = True,
             dtype=torch.float32, _layer: str = "gcn_norm") -> SparseTensor:
    """``D^-1/2 (A + I) D^-1/2`` as a CSR SparseTensor (``D`` the row sums of ``A + I``);
    duplicate edges are summed.  ``normalize=False`` returns ``A (+ I)``."""
    row, col, w = _edges(adj, num_nodes, _layer)
    w = torch.ones(row.numel(), dtype=dtype) if w is None else w.to(dtype)
    if add_self_loops:
        row, col, w = _add_remaining_self_loops(row, col, w, num_nodes)
    if normalize:
        deg = torch.zeros(num_nodes, dtype=dtype).index_add_(0, row, w)
        dinv = deg.pow(-0.5).masked_fill_(deg == 0, 0)
        w = dinv[row] * w * dinv[col]
    return _csr(row, col, w, num_nodes)


def _mean_adj(adj, n: int, dtype) -> SparseTensor:
    """Row-normalised adjacency (weighted mean over each node's neighbours)."""
    row, col, w = _edges(adj, n, "SAGEConv")
    w = torch.ones(row.numel(), dtype=dtype) if w is None else w.to(dtype)
    deg = torch.zeros(n, dtype=dtype).index_add_(0, row, w)
    none = deg == 0   # weights summing to 0: no mean (0, as no neighbours); 1 / 1 there keeps the gradient finite
    inv = torch.where(none, 0, torch.where(none, 1, deg).reciprocal())
    return _csr(row, col, w * inv[row], n)


def _gat_pattern(adj, n: int, add_self_loops: bool, heads: int, dtype):
    """``(A, row, col)``: the pattern (self-loops replaced by one per node when asked) as an
    ``n x n x heads`` tensor of levels (dense, compressed, dense) -- CSR with one value per head
    at each stored entry, so all heads' scores are one tensor, one softmax and one SpMM; an
    ``n x n`` CSR for one head -- and the coordinates of its stored entries, in storage order."""
    row, col, _ = _edges(adj, n, "GATConv", pattern_only=True)
    keys = row * n + col   # the entries' linear keys: sorted and distinct make storage order
    if add_self_loops:   # key r * n + c is on the diagonal iff it is a multiple of n + 1
        keys = torch.cat([keys[keys % (n + 1) != 0], torch.arange(n, dtype=keys.dtype) * (n + 1)])
    if add_self_loops or not (isinstance(adj, SparseTensor) and adj._format == _CSR2):  # a CSR's are
        keys = convert.sorted_unique(keys)
    row = torch.div(keys, n, rounding_mode="floor")
    col = keys - row * n
    (pos, crd), ones = convert.coo_to_csr((n, n), None, (row, col), torch.ones(row.numel(), dtype=dtype))
    A = SparseTensor(_CSR2, (n, n), pos, crd, ones)   # in order, in range, distinct: nothing to check
    if heads > 1:   # one head: the plain CSR (its SpMM locates nothing per entry: 1.1-1.5x faster)
        nnz = A._vals.numel()
        A = SparseTensor(_HEADS_FORMAT, (n, n, heads), (None, A._pos[1], None), (None, A._crd[1], None),
                         torch.ones(nnz * heads, dtype=dtype), nnz=nnz * heads)
    return A, row, col


_HEADS_FORMAT = Format((dense, compressed, dense))
_CSR2 = preset("csr", 2)


# ---------------------------------------------------------------- cache and shared checks

class _AdjCache:
    """Built adjacencies keyed by the input object (held weakly) and a key (dtype, n)."""

    def __init__(self):
        self._store: dict = {}

    def get(self, adj, key, build):
        k = (id(adj), *key)
        hit = self._store.get(k)
        if hit is not None and hit[0]() is adj:
            return hit[1]
        value = build()
        self._store = {kk: v for kk, v in self._store.items() if v[0]() is not None}
        self._store[k] = (weakref.ref(adj), value)
        return value

    def clear(self):
        self._store = {}

    def __getstate__(self):   # a cache: not pickled (its weak references cannot be), rebuilt on use
        return {"_store": {}}


def _features(x, in_channels: int, layer: str):
    """``x`` checked: dense, or sparse (a SparseTensor, or a torch.sparse tensor taken as one,
    zero-copy where the layout allows) -- bag-of-words features: the first product is an SpMM."""
    if isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) and is_sparse(x):
        x = as_sparse(x)
    if not isinstance(x, torch.Tensor) or (x.layout != torch.strided and not isinstance(x, SparseTensor)):
        raise ScorchTypeError(f"{layer}: x must be a dense torch.Tensor or a sparse tensor, got {type(x).__name__}"
                              + ("" if not isinstance(x, torch.Tensor) else f" of layout {x.layout}"))
    if x.dim() != 2 or x.shape[1] != in_channels:
        raise ScorchValueError(f"{layer}: x must have shape (num_nodes, in_channels) = (N, {in_channels}), "
                               f"got {tuple(x.shape)}")
    return x


def _check_positive(layer: str, **kw) -> None:
    for name, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ScorchValueError(f"{layer}: {name} must be a positive int, got {v!r}")


def _check_flags(layer: str, **kw) -> None:
    for name, v in kw.items():
        if not isinstance(v, bool):
            raise ScorchTypeError(f"{layer}: {name} must be a bool, got {v!r}")


def _glorot(t: torch.Tensor) -> None:
    nn.init.xavier_uniform_(t) if t.dim() == 2 else _glorot_flat(t)


def _glorot_flat(t: torch.Tensor) -> None:
    bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-bound, bound)


class _GraphConv(nn.Module):
    """Shared parts: the adjacency cache and its lookup."""

    def __init__(self, cached: bool):
        super().__init__()
        self.cached = cached
        self._cache = _AdjCache()

    def _adjacency(self, adj, x, build):
        if not self.cached or _learned(adj, grad_mode_only=False):   # (learned edge weights change: never cached)
            return build()
        return self._cache.get(adj, (x.dtype, x.shape[0]), build)


# ---------------------------------------------------------------- layers

class GCNConv(_GraphConv):
    """Graph convolution (Kipf & Welling): ``out = D^-1/2 (A + I) D^-1/2 @ (x @ W^T) + b``.

    ``forward(x, adj)``: ``x`` is ``N x in_channels`` (dense, or sparse -- a SparseTensor or a
    torch.sparse tensor: the product with the weight then runs as an SpMM); ``adj`` a SparseTensor or
    ``torch.sparse`` tensor (``N x N``, values are edge weights) or an
    ``edge_index`` (``2 x E``).  With ``cached=True`` the normalised adjacency is
    built once per adjacency object (and dtype).  Parameter names follow PyG
    (``lin.weight``, ``bias``).
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, add_self_loops: bool = True,
                 normalize: bool = True, cached: bool = False):
        super().__init__(cached)
        _check_positive("GCNConv", in_channels=in_channels, out_channels=out_channels)
        _check_flags("GCNConv", bias=bias, add_self_loops=add_self_loops, normalize=normalize, cached=cached)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.add_self_loops, self.normalize = add_self_loops, normalize
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.lin.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cache.clear()

    def forward(self, x: torch.Tensor, adj) -> torch.Tensor:
        x = _features(x, self.in_channels, "GCNConv")
        A = self._adjacency(adj, x, lambda: gcn_norm(
            adj, x.shape[0], add_self_loops=self.add_self_loops, normalize=self.normalize, dtype=x.dtype,
            _layer="GCNConv"))
        # the bias starts the SpMM's row accumulators: no separate pass over the output
        h = dense_ops.linear(x, self.lin.weight)
        return einsum_add("ij,jk->ik", (A, h), () if self.bias is None else (self.bias,))

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, normalize={self.normalize}, cached={self.cached}"


class SAGEConv(_GraphConv):
    """GraphSAGE with mean aggregation: ``out = lin_l(mean_{j in N(i)} x_j) + lin_r(x_i)``.

    The mean is the row-normalised adjacency times ``x`` (weighted by edge
    values for a sparse input; a node without neighbours aggregates zeros).
    ``lin_l`` carries the bias, ``lin_r`` (root weight) has none, as in PyG.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, cached: bool = False):
        super().__init__(cached)
        _check_positive("SAGEConv", in_channels=in_channels, out_channels=out_channels)
        _check_flags("SAGEConv", bias=bias, cached=cached)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin_l = nn.Linear(in_channels, out_channels, bias=bias)
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for lin in (self.lin_l, self.lin_r):
            _glorot(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        self._cache.clear()

    def forward(self, x: torch.Tensor, adj) -> torch.Tensor:
        x = _features(x, self.in_channels, "SAGEConv")
        A = self._adjacency(adj, x, lambda: _mean_adj(adj, x.shape[0], x.dtype))
        bias = () if self.lin_l.bias is None else (self.lin_l.bias,)
        if self.out_channels < self.in_channels:
            # mean(x) @ W^T == mean(x @ W^T): aggregate in the narrower width.  One GEMM gives
            # both x @ W_l^T and the root term x @ W_r^T; the SpMM reads the first half and
            # starts its row accumulators from the second half plus the bias.
            o = self.out_channels
            h = dense_ops.linear(x, torch.cat([self.lin_l.weight, self.lin_r.weight]))
            return einsum_add("ij,jk->ik", (A, h[:, :o]), (h[:, o:],) + bias)
        root = dense_ops.linear(x, self.lin_r.weight, *bias)
        return torch.addmm(root, A @ x, self.lin_l.weight.t())

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr='mean', cached={self.cached}"


class GATConv(_GraphConv):
    """Graph attention (Velickovic et al.), PyG's ``GATConv`` formula.

    Per head ``h = x @ W^T``; on each stored entry ``(i, j)`` of the pattern
    ``e_ij = LeakyReLU(att_dst . h_i + att_src . h_j)``; ``alpha = softmax`` over
    row ``i`` (a sparse softmax: absent entries are -inf); ``out_i = sum_j alpha_ij h_j``.
    Heads are concatenated (``concat=True``) or averaged.  Self-loops are
    replaced by one per node when ``add_self_loops``.  ``dropout`` drops
    attention coefficients in training.
    """

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, add_self_loops: bool = True, bias: bool = True,
                 dropout: float = 0.0, cached: bool = False):
        super().__init__(cached)
        _check_positive("GATConv", in_channels=in_channels, out_channels=out_channels, heads=heads)
        _check_flags("GATConv", concat=concat, add_self_loops=add_self_loops, bias=bias, cached=cached)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ScorchValueError(f"GATConv: dropout must be a probability in [0, 1], got {dropout!r}")
        if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)):
            raise ScorchTypeError(f"GATConv: negative_slope must be a number, got {negative_slope!r}")
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.concat, self.negative_slope = concat, negative_slope
        self.add_self_loops, self.dropout = add_self_loops, dropout
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        width = heads * out_channels if concat else out_channels
        self.bias = nn.Parameter(torch.empty(width)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.lin.weight)
        _glorot_flat(self.att_src)
        _glorot_flat(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cache.clear()

    def forward(self, x: torch.Tensor, adj) -> torch.Tensor:
        x = _features(x, self.in_channels, "GATConv")
        n, H, C = x.shape[0], self.heads, self.out_channels
        A, row, col = self._adjacency(adj, x, lambda: _gat_pattern(adj, n, self.add_self_loops, H, x.dtype))
        h = dense_ops.linear(x, self.lin.weight).view(n, H, C)
        a_src, a_dst = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)   # n x H
        if H == 1:   # gathers of single floats: 3x faster from 1-d tensors than rows of n x 1
            a_src, a_dst = a_src.view(n), a_dst.view(n)
        scores = F.leaky_relu(a_dst.index_select(0, row).add_(a_src.index_select(0, col)),
                              self.negative_slope)                          # nnz x H, one row per entry
        # every head at once: a softmax over each row of each head (the heads interleaved), then
        # out[i, h, :] = sum_j alpha[i, j, h] h[j, h, :], written straight into the concatenated layout
        alpha = torch.softmax(A.with_values(scores.reshape(-1)), dim=1)
        if self.dropout and self.training:
            alpha = alpha.with_values(F.dropout(alpha.values(), self.dropout, training=True))
        eq, hh = ("ijh,jhk->ihk", h) if H > 1 else ("ij,jk->ik", h.view(n, C))
        if self.concat or H == 1:
            bias = () if self.bias is None else (self.bias.view(hh.shape[1:]),)
            return einsum_add(eq, (alpha, hh), bias).reshape(n, H * C)
        out = einsum_add(eq, (alpha, hh), ()).mean(1)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}"
