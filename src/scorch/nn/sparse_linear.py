"""``SparseLinear``: a linear layer whose weight is a sparse ``nn.Parameter(SparseTensor)``.

Owns the layer, its fixed sparsity pattern (random, from a mask, or by magnitude
pruning of a dense ``nn.Linear`` via :meth:`SparseLinear.from_dense`), and its
initialisation.  The forward pass is ``F.linear`` with the sparse weight, which
runs scorch's compiled kernel; the weight's gradient is a SparseTensor in the
same pattern, so torch optimizers update the stored values and never the pattern.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ScorchTypeError, ScorchValueError
from ..interop import from_coo
from ..tensor import SparseTensor

__all__ = ["SparseLinear"]


def _check_sparsity(sparsity) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0 <= sparsity < 1:
        raise ScorchValueError(f"SparseLinear: sparsity must be a float in [0, 1), got {sparsity!r}")
    return float(sparsity)


def _check_mask(mask, shape) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise ScorchTypeError(f"SparseLinear: mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ScorchValueError(f"SparseLinear: mask must have shape (out_features, in_features) = {tuple(shape)}, "
                               f"got {tuple(mask.shape)}")
    return mask.to(torch.bool)


def _random_mask(shape, sparsity: float) -> torch.Tensor:
    """Exactly ``round((1 - sparsity) * numel)`` (at least 1) entries, uniformly at random."""
    numel = math.prod(shape)
    keep = max(1, round((1 - sparsity) * numel))
    mask = torch.zeros(numel, dtype=torch.bool)
    mask[torch.randperm(numel)[:keep]] = True
    return mask.view(shape)


def _magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The largest-|w| ``1 - sparsity`` fraction (at least 1 entry); ties broken by topk."""
    keep = max(1, round((1 - sparsity) * weight.numel()))
    mask = torch.zeros(weight.numel(), dtype=torch.bool)
    mask[weight.detach().abs().reshape(-1).topk(keep).indices] = True
    return mask.view(weight.shape)


def _masked_sparse(values: torch.Tensor, mask: torch.Tensor, format) -> SparseTensor:
    """Every masked entry stored (even an exact zero), in ``format``."""
    idx = mask.nonzero().t()
    return from_coo(idx, values.detach()[mask], tuple(mask.shape), format=format)


class SparseLinear(nn.Module):
    """``y = x @ W^T + b`` with ``W`` (``out_features x in_features``) a SparseTensor parameter.

    The pattern is ``mask`` when given, else a random ``1 - sparsity`` fraction
    of the entries (drawn from torch's global RNG).  The stored values are
    initialised like ``nn.Linear`` (uniform in ``+-1/sqrt(in_features)``).  A
    blocked ``format`` (BSR) stores every block the mask touches whole: its other
    entries are stored zeros that train like the rest (``sparsity`` then reports
    the blocks' storage).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, format="csr", *,
                 sparsity: float = 0.9, mask: torch.Tensor | None = None, dtype=None):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ScorchValueError(f"SparseLinear: {name} must be a positive int, got {v!r}")
        self.in_features, self.out_features = in_features, out_features
        shape = (out_features, in_features)
        mask = _random_mask(shape, _check_sparsity(sparsity)) if mask is None else _check_mask(mask, shape)
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(_masked_sparse(torch.zeros(shape, dtype=dtype), mask, format))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        self.reset_parameters()

    @property
    def format(self):
        return self.weight.format

    @property
    def sparsity(self) -> float:
        return 1.0 - self.weight.nnz / (self.in_features * self.out_features)

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)   # (the stored values; ELL's padding stays 0)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    @classmethod
    def from_dense(cls, linear: nn.Linear, sparsity: float = 0.9, *, mask: torch.Tensor | None = None,
                   format="csr") -> SparseLinear:
        """A SparseLinear keeping ``linear``'s largest-magnitude ``1 - sparsity`` fraction of
        weights (or exactly the entries of ``mask``), with its bias copied."""
        if not isinstance(linear, nn.Linear):
            raise ScorchTypeError(f"SparseLinear.from_dense: linear must be a torch.nn.Linear, "
                                  f"got {type(linear).__name__}")
        w = linear.weight
        mask = _magnitude_mask(w, _check_sparsity(sparsity)) if mask is None else _check_mask(mask, w.shape)
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, format=format,
                    mask=mask, dtype=w.dtype)
        layer.weight = nn.Parameter(_masked_sparse(w, mask, format))
        if linear.bias is not None:
            with torch.no_grad():
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T + bias``, computed as ``(weight @ x^T)^T`` (an SpMM whose batch is the
        vectorised dimension): for a 2-d batch of rows the result is that transposed view,
        feature dim outermost in memory, as torch.sparse's ``(W @ x.t()).t()`` gives; the next
        layer reads it without a copy (call ``.contiguous()`` before a ``.view`` that merges its
        two dims).  A batch of more dims comes back contiguous, as from ``nn.Linear``."""
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] != self.in_features:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ScorchValueError(f"SparseLinear: input must have shape (..., in_features) = "
                                   f"(..., {self.in_features}), got {got}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, format={self.weight.format}, "
                f"sparsity={self.sparsity:.3f}, nnz={self.weight.nnz}")
