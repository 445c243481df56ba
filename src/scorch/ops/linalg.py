"""``matmul`` / ``mm`` / ``bmm`` / ``@`` as einsums (torch's shape rules)."""

from __future__ import annotations

import torch

from .._dispatch import implements
from ..errors import ScorchValueError
from ..interop import is_sparse
from .einsum import einsum

_BATCH = "abcdefgh"


def _equation(na: int, nb: int) -> str:
    """The einsum of ``torch.matmul`` for operands of ``na`` and ``nb`` dims."""
    if na == 0 or nb == 0:
        raise ScorchValueError(f"matmul: both operands need at least 1 dim, got {na}-d and {nb}-d")
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
    return einsum(_equation(a.dim(), b.dim()), a, b)


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
