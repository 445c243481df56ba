"""``matmul`` / ``mm`` / ``bmm`` / ``@`` as einsums (torch's shape rules)."""

from __future__ import annotations

import functools

import torch

from .._dispatch import implements
from ..errors import ScorchValueError
from ..interop import is_sparse
from ..tensor import SparseTensor
from .einsum import einsum, einsum_add

_BATCH = "abcdefgh"


@functools.lru_cache(maxsize=None)
def _equation(na: int, nb: int) -> str:
    """The einsum of ``torch.matmul`` for operands of ``na`` and ``nb`` dims (per call: cached)."""
    if na == 0 or nb == 0:
        raise ScorchValueError(f"matmul: both operands need at least 1 dim, got {na}-d and {nb}-d")
    if max(na, nb) - 2 > len(_BATCH):
        raise ScorchValueError(f"matmul: at most {len(_BATCH)} batch dims with a sparse operand, got "
                               f"{na}-d and {nb}-d operands")
    if na == 1 and nb == 1:
        return "j,j->"
    if na == 1:
        batch = _BATCH[:nb - 2]
        return f"j,{batch}jk->{batch}k"
    if nb == 1:
        batch = _BATCH[:na - 2]
        return f"{batch}ij,j->{batch}i"
    n = max(na, nb) - 2
    batch = _BATCH[:n]
    return f"{batch[n - (na - 2):]}ij,{batch[n - (nb - 2):]}jk->{batch}ik"


@implements(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def matmul(a, b):
    """``a @ b`` with torch's rules (1-d promotion, batch broadcasting); sparse operands
    run compiled kernels: SpMV, SpMM, batched SpMM, SpGEMM.

    >>> import torch, scorch
    >>> A = scorch.as_sparse(torch.eye(2), "csr")
    >>> (A @ torch.ones(2, 3)).shape
    torch.Size([2, 3])
    """
    if not (is_sparse(a) or is_sparse(b)):
        return torch.matmul(a, b)
    return einsum(_equation(_ndim(a), _ndim(b)), a, b)


def _ndim(x) -> int:
    """Number of dims without a torch-function round trip for SparseTensors (hot path)."""
    return len(x._shape) if isinstance(x, SparseTensor) else x.dim()


@implements(torch.Tensor.__rmatmul__)
def _rmatmul(a, b):
    return matmul(b, a)


@implements(torch.mm, torch.Tensor.mm)
def mm(a, b):
    if a.dim() != 2 or b.dim() != 2:
        raise ScorchValueError(f"mm: expects 2-d operands, got {a.dim()}-d and {b.dim()}-d")
    return matmul(a, b)


@implements(torch.bmm, torch.Tensor.bmm)
def bmm(a, b):
    if a.dim() != 3 or b.dim() != 3:
        raise ScorchValueError(f"bmm: expects 3-d operands, got {a.dim()}-d and {b.dim()}-d")
    return matmul(a, b)


@implements(torch.addmm, torch.Tensor.addmm)
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """``beta * input + alpha * (mat1 @ mat2)`` (either matrix sparse)."""
    if beta == 1 and alpha == 1 and isinstance(input, torch.Tensor) and not is_sparse(input) \
            and mat1.dim() == 2 and mat2.dim() == 2 and (is_sparse(mat1) or is_sparse(mat2)):
        return einsum_add("ij,jk->ik", (mat1, mat2), (input,))  # input starts the accumulators
    prod = mm(mat1, mat2)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:  # torch ignores input then (even NaNs in it), but keeps its broadcast shape
        shape = torch.broadcast_shapes(input.shape, prod.shape)
        return prod if tuple(prod.shape) == tuple(shape) else prod.expand(shape)
    return (input if beta == 1 else input * beta) + prod


@implements(torch.nn.functional.linear)
def linear(input, weight, bias=None):
    """``input @ weight.T + bias`` with a sparse weight (a pruned layer) or a sparse input."""
    if weight.dim() != 2:
        raise ScorchValueError(f"linear: weight must be 2-d (out_features, in_features), got {weight.dim()}-d")
    if input.dim() == 0:
        raise ScorchValueError("linear: input must have at least 1 dim, got 0-d")
    if isinstance(weight, SparseTensor) and not is_sparse(input) and input.dim() >= 2:
        # (W @ x^T)^T: an SpMM whose dense row (the batch) is contiguous and vectorises,
        # instead of one sparse dot product per (row, output) pair.
        flat = input.reshape(-1, input.shape[-1])
        out = einsum("oi,ib->ob", weight, flat.t().contiguous()).t().reshape(*input.shape[:-1], weight.shape[0])
    elif bias is not None and not is_sparse(weight) and not is_sparse(bias):
        return einsum_add("...i,oi->...o", (input, weight), (bias,))
    else:
        out = einsum("...i,oi->...o", input, weight)
    if isinstance(out, torch.Tensor) and is_sparse(out) and bias is not None:
        out = out.to_dense()
    return out if bias is None else out + bias


@implements(torch.tensordot)
def tensordot(a, b, dims=2, out=None):
    """``torch.tensordot`` as an einsum: ``dims`` an int (last dims of a with first of b) or two lists."""
    if out is not None:
        raise ScorchValueError("tensordot: out= is not supported with SparseTensor operands")
    if isinstance(dims, int):
        if dims < 0 or dims > min(a.dim(), b.dim()):
            raise ScorchValueError(f"tensordot: dims={dims} out of range for {a.dim()}-d and {b.dim()}-d operands")
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    else:
        da, db = ([dims[0]] if isinstance(dims[0], int) else list(dims[0])), \
                 ([dims[1]] if isinstance(dims[1], int) else list(dims[1]))
        if len(da) != len(db):
            raise ScorchValueError(f"tensordot: dims lists differ in length: {da} and {db}")
        da, db = [d % a.dim() for d in da], [d % b.dim() for d in db]
    letters = iter(_BATCH + "ijklmnopqrstuvwxyz")
    ta = [next(letters) for _ in range(a.dim())]
    tb = [next(letters) for _ in range(b.dim())]
    for x, y in zip(da, db):
        tb[y] = ta[x]
    out_idx = [c for d, c in enumerate(ta) if d not in da] + [c for d, c in enumerate(tb) if d not in db]
    return einsum(f"{''.join(ta)},{''.join(tb)}->{''.join(out_idx)}", a, b)
