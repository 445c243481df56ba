"""Matrix-shaped ops on coordinates: ``diag``, ``diagflat``, ``diag_embed``, ``block_diag``, ``rot90``, and
``matrix_power`` (SpGEMMs).

Each places the stored entries at new coordinates (a diagonal, a block of a bigger matrix, a
rotation); results are sparse, in the input's format adapted to the result's dims
(:func:`scorch.ops.shape.result_format`), differentiable w.r.t. the stored values.
``diag`` of a matrix is its diagonal, dense (as :func:`scorch.ops.reduce.diagonal`).
"""

from __future__ import annotations

import torch

from .._dispatch import accepts_out, implements
from ..errors import ScorchValueError
from ..tensor import SparseTensor
from .reduce import diagonal as _diagonal
from .replicate import padded_entries
from .shape import _dim, _int, assemble, entries, flip

__all__ = ["diag", "diagflat", "diag_embed", "block_diag", "matrix_power", "rot90"]

_I64 = torch.int64


@implements(torch.diag, torch.Tensor.diag)
@accepts_out
def diag(input, diagonal=0):
    """A 1-d input on the ``diagonal``-th diagonal of a square matrix (sparse); a 2-d input's
    ``diagonal``-th diagonal (dense 1-d)."""
    k = _int(diagonal, "diag", "diagonal")
    if input.dim() == 2:
        return _diagonal(input, k)
    if input.dim() != 1:
        raise ScorchValueError(f"diag: expects a 1-d or 2-d input, got {input.dim()}-d")
    return diag_embed(input, k, 0, 1)


@implements(torch.diagflat, torch.Tensor.diagflat)
def diagflat(input, offset=0):
    """The flattened input on the ``offset``-th diagonal of a square matrix (sparse; it ran densely)."""
    return diag_embed(input.flatten() if input.dim() != 1 else input, _int(offset, "diagflat", "offset"), 0, 1)


@implements(torch.linalg.matrix_power, torch.matrix_power, torch.Tensor.matrix_power)
@accepts_out
def matrix_power(A, n):
    """``A`` multiplied by itself ``n`` times (SpGEMMs, by squaring); ``n = 0``: the identity in
    ``A``'s pattern's kind of format (sparse; it was a dense identity); negative ``n`` needs the
    inverse, a dense matrix: computed densely (within the dense size limit)."""
    from .._dispatch import densified
    n = _int(n, "matrix_power", "n")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ScorchValueError(f"matrix_power: expects a square matrix (or a batch of them), got shape "
                               f"{tuple(A.shape)}")
    if n < 0:
        return densified(torch.linalg.matrix_power, (A, n), {})
    if n == 0:
        k = A.shape[-1]
        eye = torch.arange(k)
        lead = A.shape[:-2]
        idx = torch.cartesian_prod(*[torch.arange(s) for s in lead], eye) if lead else eye.unsqueeze(1)
        idx = idx.reshape(-1, len(lead) + 1).t()
        coords = torch.cat([idx, idx[-1:]])
        from ..interop import from_coo
        eye = from_coo(coords, torch.ones(coords.shape[1], dtype=A.dtype), tuple(A.shape),
                       format=A.format if not A.format.block else "csr")
        if A._needs_grad():   # in the graph, as torch's (its gradient is zero)
            return eye.with_values(eye._vals + 0 * A.values().sum())
        return eye
    out, base = None, A
    while n:
        if n & 1:
            out = base if out is None else out @ base
        n >>= 1
        if n:
            base = base @ base
    return A.clone() if out is A else out   # (n = 1: a new tensor, as torch's)


@implements(torch.diag_embed, torch.Tensor.diag_embed)
def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """Each last-dim vector of ``input`` on the ``offset``-th diagonal of the matrix spanned by
    the result's dims ``dim1`` and ``dim2`` (size ``n + |offset|`` each)."""
    n = input.dim() + 1
    d1, d2 = _dim(dim1, n, "diag_embed", "dim1"), _dim(dim2, n, "diag_embed", "dim2")
    if d1 == d2:
        raise ScorchValueError(f"diag_embed: dim1 and dim2 must differ, got {dim1} and {dim2}")
    offset = _int(offset, "diag_embed", "offset")
    m = input.shape[-1] + abs(offset)
    coords, ids = entries(input)
    lead, i = coords[:-1], coords[-1]
    rest = iter(range(lead.shape[0]))
    rows, shape = [], []
    for d in range(n):
        if d in (d1, d2):
            rows.append(i + max(-offset, 0) if d == d1 else i + max(offset, 0))
            shape.append(m)
        else:
            r = next(rest)
            rows.append(lead[r])
            shape.append(input.shape[r])
    new = torch.stack(rows) if rows else torch.zeros((0, ids.numel()), dtype=_I64)
    return assemble(input._format, shape, new, ids, input.values(), input.index_dtype)


@implements(torch.block_diag)
def block_diag(*tensors):
    """The tensors (0-d: 1x1, 1-d: one row) along the diagonal of a matrix; sparse (a dense
    operand contributes its nonzeros, or every element when it needs a gradient)."""
    pieces, rows, cols = [], 0, 0
    dtype = tensors[0].dtype if tensors else torch.get_default_dtype()
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    fmt = next(t for t in tensors if isinstance(t, SparseTensor))
    for k, t in enumerate(tensors):
        if t.dim() > 2:
            raise ScorchValueError(f"block_diag: tensor {k} has {t.dim()} dims, expected at most 2")
        coords, vals, shape = padded_entries(t, 2, dtype, "block_diag")   # 0-d: 1 x 1, 1-d: one row
        pieces.append((coords + torch.tensor([[rows], [cols]]), vals))
        rows, cols = rows + shape[0], cols + shape[1]
    coords = torch.cat([c for c, _ in pieces], 1)
    vals = torch.cat([v for _, v in pieces])
    return assemble(fmt._format, (rows, cols), coords, torch.arange(vals.numel()), vals, fmt.index_dtype)


@implements(torch.rot90, torch.Tensor.rot90)
def rot90(input, k=1, dims=(0, 1)):
    """Rotation by 90 degrees ``k`` times in the plane of ``dims`` (first towards second)."""
    dims = list(dims)
    if len(dims) != 2:
        raise ScorchValueError(f"rot90: dims must name two dims, got {dims}")
    a, b = (_dim(d, input.dim(), "rot90", "dims") for d in dims)
    if a == b:
        raise ScorchValueError(f"rot90: dims must differ, got {dims}")
    k = _int(k, "rot90", "k") % 4
    if k == 0:
        return input.clone()
    if k == 2:
        return flip(input, [a, b])
    return flip(input, [b] if k == 1 else [a]).transpose(a, b)
