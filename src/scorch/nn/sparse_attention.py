"""Multi-head self-attention with a sparse score pattern: ``SparseAttention``.

Owns the attention patterns (sliding window, BigBird = window + global tokens +
seeded random key blocks, or a user boolean mask), built as ``(row, col)``
coordinate lists by vectorised torch and cached per sequence length; their
expansion to a 3-d CSR SparseTensor mask (``batch * heads x L x L``, dense outer
dim), also cached; and the layer.  The attention itself is three compiled
scorch kernels over the whole batch of heads at once:
``S = einsum("hij,hik,hjk->hij", M, Q, K)`` (batched SDDMM, scores only on the
pattern), ``P = softmax(S * scale, dim=2)`` (absent entries = -inf) and
``P @ V`` (batched SpMM).  Scores outside the pattern are never formed.

A query row whose pattern is empty (possible only with a user mask) attends to
nothing and gets output ``out_proj(0)``; ``dense_reference`` does the same.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import convert
from ..datasets import check_seed
from ..errors import ScorchTypeError, ScorchValueError
from ..interop import is_sparse, from_coo
from ..ops import dense as dense_ops
from ..ops.reduce import scaled_softmax
from ..tensor import SparseTensor

__all__ = ["SparseAttention", "bigbird_pattern", "window_pattern"]

_PATTERNS = ("window", "bigbird")


# ---------------------------------------------------------------- patterns as (row, col)

def window_pattern(L: int, window: int):
    """``(row, col)`` of the band ``|i - j| <= window // 2`` of an ``L x L`` matrix."""
    half = window // 2
    rows = torch.arange(L).unsqueeze(1)
    cols = rows + torch.arange(-half, half + 1).unsqueeze(0)
    keep = (cols >= 0) & (cols < L)
    return rows.expand_as(cols)[keep], cols[keep]


def _block_pairs(L: int, block: int, qb: torch.Tensor, kb: torch.Tensor):
    """Token ``(row, col)`` pairs covering the query-block x key-block pairs ``(qb, kb)``."""
    off = torch.arange(block)
    rows = (qb.view(-1, 1, 1) * block + off.view(1, -1, 1)).expand(-1, block, block)
    cols = (kb.view(-1, 1, 1) * block + off.view(1, 1, -1)).expand(-1, block, block)
    keep = (rows < L) & (cols < L)
    return rows[keep], cols[keep]


def _unique_pairs(rows: torch.Tensor, cols: torch.Tensor, L: int):
    lin = torch.unique(rows * L + cols)
    return lin // L, lin % L


def bigbird_pattern(L: int, window: int, global_tokens: int = 0, random_blocks: int = 0, block: int = 64,
                    seed: int = 0):
    """``(row, col)`` of the BigBird pattern: the window band, the first ``global_tokens``
    tokens attending to and attended by every token, and per query block of ``block``
    tokens ``random_blocks`` distinct key blocks drawn with ``torch.Generator`` seeded by
    ``seed`` (as many as there are when fewer)."""
    parts = [window_pattern(L, window)]
    g = min(global_tokens, L)
    if g:
        gi = torch.arange(g).repeat_interleave(L)
        every = torch.arange(L).repeat(g)
        parts += [(gi, every), (every, gi)]
    nb = -(-L // block)
    r = min(random_blocks, nb)
    if r:
        gen = torch.Generator().manual_seed(check_seed("bigbird_pattern", seed))
        kb = torch.rand(nb, nb, generator=gen).argsort(dim=1)[:, :r]
        parts.append(_block_pairs(L, block, torch.arange(nb).repeat_interleave(r), kb.reshape(-1)))
    return _unique_pairs(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), L)


def _mask_pattern(mask, L: int):
    """``(row, col)`` of a user mask: a boolean ``L x L`` tensor or a 2-d SparseTensor /
    ``torch.sparse`` tensor (its nonzero entries: a stored zero, a block format's padding say,
    masks as an absent one does)."""
    if not isinstance(mask, torch.Tensor):
        raise ScorchTypeError(f"SparseAttention: mask must be a bool tensor or a sparse tensor, got "
                              f"{type(mask).__name__}")
    if tuple(mask.shape) != (L, L):
        raise ScorchValueError(f"SparseAttention: mask must have shape (L, L) = ({L}, {L}) for x with "
                               f"sequence length {L}, got {tuple(mask.shape)}")
    if isinstance(mask, SparseTensor):
        coords, vals = convert.coords_of(mask._format, mask._shape, mask._pos, mask._crd, mask._vals.detach())
        coords = coords[:, vals != 0]
        return _unique_pairs(coords[0].long(), coords[1].long(), L)
    if is_sparse(mask):
        coo = mask.detach().to_sparse_coo().coalesce()
        idx = coo.indices()[:, coo.values() != 0]
        return idx[0], idx[1]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ScorchTypeError(f"SparseAttention: a dense mask must be a torch.bool tensor, "
                              f"got {getattr(mask, 'dtype', type(mask).__name__)}")
    idx = mask.nonzero().t()
    return idx[0], idx[1]


def _stacked_mask(rows: torch.Tensor, cols: torch.Tensor, L: int, n: int, dtype) -> SparseTensor:
    """The pattern repeated ``n`` times as an ``n x L x L`` CSR SparseTensor of ones."""
    nnz = rows.numel()
    h = torch.arange(n).repeat_interleave(nnz)
    idx = torch.stack([h, rows.repeat(n), cols.repeat(n)])
    return from_coo(idx, torch.ones(n * nnz, dtype=dtype), (n, L, L), format="csr")


# ---------------------------------------------------------------- layer

class SparseAttention(nn.Module):
    """Multi-head self-attention whose scores live on a sparse pattern.

    ``pattern="window"``: token ``i`` attends to ``j`` when ``|i - j| <= window // 2``.
    ``pattern="bigbird"``: the window plus ``global_tokens`` global tokens plus
    ``random_blocks`` random key blocks (of ``block`` tokens) per query block, drawn
    once per sequence length from ``seed``.  ``forward(x, mask=None)`` takes ``x`` of
    shape ``(L, embed_dim)`` or ``(B, L, embed_dim)`` and returns the same shape; a
    ``mask`` (boolean ``L x L`` tensor or SparseTensor, ``mask[i, j]`` = query ``i``
    may attend to key ``j``) replaces the layer's pattern for that call.  The pattern is
    shared by all heads.  Parameters: ``in_proj`` (``embed_dim -> 3 * embed_dim``,
    packed q, k, v) and ``out_proj``.
    """

    def __init__(self, embed_dim: int, num_heads: int, pattern: str = "window", window: int = 256,
                 global_tokens: int = 0, random_blocks: int = 0, block: int = 64, bias: bool = True,
                 seed: int = 0):
        super().__init__()
        _check_ints(embed_dim=embed_dim, num_heads=num_heads, window=window, block=block)
        _check_ints(positive=False, global_tokens=global_tokens, random_blocks=random_blocks)
        if embed_dim % num_heads:
            raise ScorchValueError(f"SparseAttention: embed_dim must be divisible by num_heads = {num_heads}, "
                                   f"got {embed_dim}")
        if pattern not in _PATTERNS:
            raise ScorchValueError(f"SparseAttention: pattern must be one of {_PATTERNS}, got {pattern!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.pattern, self.window, self.block = pattern, window, block
        self.seed = check_seed("SparseAttention", seed)
        self.global_tokens, self.random_blocks = global_tokens, random_blocks
        self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self._patterns: dict = {}
        self._masks: dict = {}

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, pattern={self.pattern!r}, "
                f"window={self.window}, global_tokens={self.global_tokens}, "
                f"random_blocks={self.random_blocks}, block={self.block}")

    # ------------------------------------------------------------ patterns

    def pattern_coords(self, L: int):
        """``(row, col)`` of the layer's pattern for sequence length ``L`` (cached)."""
        if L not in self._patterns:
            if self.pattern == "window":
                self._patterns[L] = window_pattern(L, self.window)
            else:
                self._patterns[L] = bigbird_pattern(L, self.window, self.global_tokens, self.random_blocks,
                                                    self.block, self.seed)
        return self._patterns[L]

    def pattern_mask(self, L: int) -> torch.Tensor:
        """The layer's pattern for sequence length ``L`` as a dense boolean ``L x L`` tensor."""
        rows, cols = self.pattern_coords(L)
        out = torch.zeros(L, L, dtype=torch.bool)
        out[rows, cols] = True
        return out

    def _sparse_mask(self, L: int, n: int, dtype, mask) -> SparseTensor:
        if mask is not None:
            return _stacked_mask(*_mask_pattern(mask, L), L, n, dtype)
        key = (L, n, dtype)
        if key not in self._masks:
            self._masks[key] = _stacked_mask(*self.pattern_coords(L), L, n, dtype)
        return self._masks[key]

    # ------------------------------------------------------------ forward

    def _check_x(self, x) -> None:
        if not isinstance(x, torch.Tensor) or isinstance(x, SparseTensor) or x.layout != torch.strided:
            raise ScorchTypeError(f"SparseAttention: x must be a dense torch.Tensor, got {type(x).__name__}")
        if x.dim() not in (2, 3) or x.shape[-1] != self.embed_dim:
            raise ScorchValueError(f"SparseAttention: x must have shape (L, embed_dim) or (B, L, embed_dim) "
                                   f"with embed_dim = {self.embed_dim}, got {tuple(x.shape)}")

    def _heads(self, x3: torch.Tensor, linear=F.linear):
        """``q, k, v`` as ``(B * heads) x L x head_dim`` tensors (``linear``: the projection's
        kernel -- torch's for the dense reference, :func:`scorch.ops.dense.linear` in ``forward``)."""
        B, L, _ = x3.shape
        qkv = linear(x3, self.in_proj.weight, self.in_proj.bias).view(B, L, 3, self.num_heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4).reshape(3, B * self.num_heads, L, self.head_dim)
        return qkv[0], qkv[1], qkv[2]

    def _merge(self, o: torch.Tensor, B: int, L: int, linear=F.linear) -> torch.Tensor:
        o = o.view(B, self.num_heads, L, self.head_dim).transpose(1, 2).reshape(B, L, self.embed_dim)
        return linear(o, self.out_proj.weight, self.out_proj.bias)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        self._check_x(x)
        x3 = x if x.dim() == 3 else x.unsqueeze(0)
        B, L, _ = x3.shape
        q, k, v = self._heads(x3, dense_ops.linear)
        M = self._sparse_mask(L, B * self.num_heads, x.dtype, mask)
        S = torch.einsum("hij,hik,hjk->hij", M, q, k)
        P = scaled_softmax(S, 2, 1.0 / math.sqrt(self.head_dim))
        out = self._merge(P @ v, B, L, dense_ops.linear)
        return out if x.dim() == 3 else out.squeeze(0)

    def dense_reference(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        """Dense masked attention in plain torch with the same parameters: scores ``-inf``
        outside ``mask`` (a dense boolean ``L x L`` tensor; default the layer's pattern)."""
        self._check_x(x)
        x3 = x if x.dim() == 3 else x.unsqueeze(0)
        B, L, _ = x3.shape
        mask = self.pattern_mask(L) if mask is None else mask
        if isinstance(mask, SparseTensor) or is_sparse(mask):
            mask = mask.to_dense() != 0
        q, k, v = self._heads(x3)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(self.head_dim)
        p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=2).nan_to_num(0.0)
        out = self._merge(p @ v, B, L)
        return out if x.dim() == 3 else out.squeeze(0)


def _check_ints(positive: bool = True, **kw) -> None:
    for name, v in kw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if positive else 0):
            raise ScorchValueError(f"SparseAttention: {name} must be a {'positive' if positive else 'non-negative'} "
                                   f"int, got {v!r}")
