"""Reductions built from :mod:`.reduce`'s per-fibre primitives: ``nansum`` / ``nanmean``,
``logsumexp``, ``aminmax``, ``var_mean`` / ``std_mean`` and ``dist``.

Absent entries are zeros, as in the dense tensor: they count in ``nanmean``'s denominator
and add ``exp(0)`` each to ``logsumexp``.  All are computed from the stored values (no dense
copy) and differentiable w.r.t. them.
"""

from __future__ import annotations

import torch

from .._dispatch import implements
from ..errors import ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from .reduce import _dims, _fibres, _shaped, amax, amin, mean, std, sum_, var

__all__ = ["nansum", "nanmean", "logsumexp", "aminmax", "var_mean", "std_mean", "dist"]


def _without_nan(x: SparseTensor) -> SparseTensor:
    v = x.values()
    return x.with_values(torch.where(torch.isnan(v), torch.zeros((), dtype=v.dtype), v)) \
        if v.dtype.is_floating_point else x


@implements(torch.nansum, torch.Tensor.nansum)
def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """The sum with NaNs taken as zero."""
    return sum_(_without_nan(input), dim, keepdim, dtype=dtype)


@implements(torch.nanmean, torch.Tensor.nanmean)
def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """The mean of the non-NaN elements (absent entries count: they are zeros)."""
    if not (input.dtype.is_floating_point or (dtype is not None and dtype.is_floating_point)):
        raise ScorchTypeError(f"nanmean: needs a floating dtype, got {input.dtype} (pass dtype=)")
    dims = _dims(dim, input.dim(), "nanmean")
    total = nansum(input, dims, keepdim, dtype=dtype)
    nans = sum_(input.with_values(torch.isnan(input.values().detach())), dims, keepdim)
    count = 1
    for d in dims:
        count *= input.shape[d]
    return total / (count - nans).to(total.dtype)


@implements(torch.logsumexp, torch.Tensor.logsumexp)
def logsumexp(input, dim, keepdim=False, *, out=None):
    """``log(sum(exp(x)))`` over ``dim``, shifted by each fibre's largest element (an absent
    entry is 0: it adds ``exp(0 - shift)``)."""
    if out is not None:
        raise ScorchValueError("logsumexp: out= is not supported with a SparseTensor input")
    if not input.dtype.is_floating_point:
        input = input.to(torch.get_default_dtype())   # torch's integer logsumexp gives the default float
    dims = _dims(dim, input.dim(), "logsumexp")
    key, groups, n, vals = _fibres(input, dims)
    stored = torch.bincount(key, minlength=groups)
    shift = torch.full((groups,), float("-inf"), dtype=vals.dtype).scatter_reduce(
        0, key, vals.detach(), "amax", include_self=True)
    shift = torch.where(stored < n, torch.clamp(shift, min=0), shift)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros((), dtype=vals.dtype))
    total = torch.zeros(groups, dtype=vals.dtype).index_add(0, key, torch.exp(vals - shift[key])) \
        + (n - stored) * torch.exp(-shift)
    return _shaped(torch.log(total) + shift, input, dims, keepdim)


@implements(torch.aminmax)
def aminmax(input, *, dim=None, keepdim=False):
    d = () if dim is None else dim
    return torch.return_types.aminmax((amin(input, d, keepdim), amax(input, d, keepdim)))


@implements(torch.var_mean)
def var_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    return (var(input, dim, correction=correction, keepdim=keepdim, unbiased=unbiased),
            mean(input, dim, keepdim))


@implements(torch.std_mean)
def std_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    return (std(input, dim, correction=correction, keepdim=keepdim, unbiased=unbiased),
            mean(input, dim, keepdim))


@implements(torch.dist, torch.Tensor.dist)
def dist(input, other, p=2):
    """``norm(input - other, p)``: sparse - sparse is their union, so no dense copy then."""
    return torch.linalg.vector_norm(input - other, p)
