"""Reductions built from :mod:`.reduce`'s per-fibre primitives: ``nansum`` / ``nanmean``,
``logsumexp``, ``aminmax``, ``var_mean`` / ``std_mean`` and ``dist``; value statistics
(``unique``, ``histc``, ``bincount``): the stored values' plus one count for the absent zeros.

Absent entries are zeros, as in the dense tensor: they count in ``nanmean``'s denominator
and add ``exp(0)`` each to ``logsumexp``.  All are computed from the stored values (no dense
copy) and differentiable w.r.t. them.
"""

from __future__ import annotations

import torch

from .._dispatch import accepts_out, check_dense_size, implements
from ..errors import ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from .reduce import _dims, _entries, _fibres, _legacy_var_args, _shaped, amax, amin, mean, std, sum_, var
from .shape import _dense_call

__all__ = ["nansum", "nanmean", "logsumexp", "aminmax", "var_mean", "std_mean", "dist", "unique", "histc", "bincount"]


def _without_nan(x: SparseTensor) -> SparseTensor:
    v = x.values()
    return x.with_values(torch.where(torch.isnan(v), torch.zeros((), dtype=v.dtype), v)) \
        if v.dtype.is_floating_point else x


@implements(torch.nansum, torch.Tensor.nansum)
@accepts_out
def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """The sum with NaNs taken as zero."""
    return sum_(_without_nan(input), dim, keepdim, dtype=dtype)


@implements(torch.nanmean, torch.Tensor.nanmean)
@accepts_out
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
@accepts_out
def logsumexp(input, dim, keepdim=False):
    """``log(sum(exp(x)))`` over ``dim``, shifted by each fibre's largest element (an absent
    entry is 0: it adds ``exp(0 - shift)``); complex values stay complex, shifted by their
    largest real part, as torch's (a real shift leaves the log's branch alone)."""
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        input = input.to(torch.get_default_dtype())   # torch's integer logsumexp gives the default float
    dims = _dims(dim, input.dim(), "logsumexp")
    key, groups, n, vals = _fibres(input, dims)
    stored = torch.bincount(key, minlength=groups)
    real = vals.detach().real
    shift = torch.full((groups,), float("-inf"), dtype=real.dtype).scatter_reduce(
        0, key, real, "amax", include_self=True)
    shift = torch.where(stored < n, torch.clamp(shift, min=0), shift)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros((), dtype=real.dtype))
    total = torch.zeros(groups, dtype=vals.dtype).index_add(0, key, torch.exp(vals - shift[key])) \
        + (n - stored) * torch.exp(-shift)
    return _shaped(torch.log(total) + shift, input, dims, keepdim)


@implements(torch.aminmax)
@accepts_out
def aminmax(input, *, dim=None, keepdim=False):
    d = () if dim is None else dim
    return torch.return_types.aminmax((amin(input, d, keepdim), amax(input, d, keepdim)))


@implements(torch.var_mean)
@_legacy_var_args
def var_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    return (var(input, dim, correction=correction, keepdim=keepdim, unbiased=unbiased),
            mean(input, dim, keepdim))


@implements(torch.std_mean)
@_legacy_var_args
def std_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    return (std(input, dim, correction=correction, keepdim=keepdim, unbiased=unbiased),
            mean(input, dim, keepdim))


@implements(torch.dist, torch.Tensor.dist)
def dist(input, other, p=2):
    """``norm(input - other, p)``: sparse - sparse is their union, so no dense copy then."""
    return torch.linalg.vector_norm(input - other, p)


def _zeros(x: SparseTensor) -> int:
    """How many elements of ``x`` are absent (implicit zeros; ELL's padding slots are not entries)."""
    return x.numel() - x.nnz


@implements(torch.unique, torch.Tensor.unique)
def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values (ascending; 0 among them when an element is absent), with their
    counts; ``return_inverse`` / ``dim=`` (results shaped like the input) from the dense tensor."""
    if return_inverse or dim is not None:
        check_dense_size("unique with return_inverse or dim gives a dense result, and", [input])
        return torch.unique(input.to_dense(), sorted=sorted, return_inverse=return_inverse,
                            return_counts=return_counts, dim=dim)
    values, counts = torch.unique(_entries(input)[1].detach(), sorted=True, return_counts=True)
    zeros = _zeros(input)
    if zeros:
        here = values == 0
        if bool(here.any()):
            counts = counts + here * zeros
        else:
            at = int((values < 0).sum())
            values = torch.cat([values[:at], values.new_zeros(1), values[at:]])
            counts = torch.cat([counts[:at], counts.new_full((1,), zeros), counts[at:]])
    return (values, counts) if return_counts else values


@implements(torch.histc, torch.Tensor.histc)
@accepts_out
def histc(input, bins=100, min=0, max=0):
    """The histogram of every element: the stored values' plus the absent zeros in 0's bin (over
    the data's range, implicit zeros included, when ``min == max``, as torch)."""
    vals, zeros = _entries(input)[1].detach(), _zeros(input)
    lo, hi = float(min), float(max)
    if lo == hi and input.numel():
        points = [vals.min(), vals.max()] if vals.numel() else []
        points += [torch.zeros((), dtype=vals.dtype)] * (zeros > 0)
        lo, hi = float(torch.stack(points).min()), float(torch.stack(points).max())
        lo, hi = (lo - 1, hi + 1) if lo == hi else (lo, hi)
    out = torch.histc(vals, bins, lo, hi)
    if zeros and lo != hi:
        out += torch.histc(torch.zeros(1, dtype=vals.dtype), bins, lo, hi) * zeros
    return out


@implements(torch.bincount, torch.Tensor.bincount)
def bincount(input, weights=None, minlength=0):
    """Counts (or summed ``weights``) per value of a 1-d non-negative integer input; the absent
    elements count in bin 0."""
    if not isinstance(input, SparseTensor):   # sparse weights of a dense input: densely
        return _dense_call(torch.bincount, input, weights, minlength)
    if input.dim() != 1:
        raise ScorchValueError(f"bincount: expects a 1-d input, got {input.dim()}-d")
    if minlength < 0:
        raise ScorchValueError(f"bincount: minlength must be >= 0 (as torch's), got {minlength}")
    if isinstance(weights, SparseTensor):
        weights = weights.to_dense()
    coords, vals = _entries(input)
    zeros = _zeros(input)
    w = None if weights is None else weights[coords[0]]
    out = torch.bincount(vals.detach(), w, max(minlength, 1 if zeros else 0))
    if weights is not None and input.numel():   # (no stored entries: torch.bincount forgets the weights' dtype)
        out = out.to(weights.dtype if weights.dtype.is_floating_point else torch.float64)
    if zeros:
        out[0] += zeros if weights is None else _absent_weight(weights, coords[0]).to(out.dtype)
    return out


def _absent_weight(weights: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """The summed weights of the absent elements, added up themselves: ``weights.sum()`` less the
    stored ones' cancels (weights 1e8 stored and 1 absent gave 0)."""
    absent = torch.ones(weights.shape[0], dtype=torch.bool)
    absent[at] = False
    return weights[absent].sum()
