"""Reductions and softmax over SparseTensors.

``sum`` / ``mean`` / ``amax`` / ``amin`` over any ``dim`` (int or tuple) with
``keepdim``: absent entries count as zeros, exactly as in the dense tensor;
results are dense.  ``sum`` is a compiled einsum; ``amax`` / ``amin`` reduce
the stored values per output position and fold in the implicit zero wherever
a fibre is not full.

``softmax`` / ``log_softmax`` along a dim follow torch.sparse: absent entries
are -inf, so the result keeps the pattern (any format, CSR included).

Everything is vectorised torch over the stored values, and differentiable; a softmax
along the innermost compressed level (CSR rows) that needs no gradient runs one
generated kernel instead (:mod:`scorch.compiler.segments`).
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings

import torch

from .._dispatch import accepts_out, as_torch_runs, check_dense_size, implements, write_out
from ..compiler import build, segments
from ..convert import coords_of, sort_keys
from ..errors import ScorchIndexError, ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from ._pattern import stored
from .einsum import einsum
from .shape import ravel_coords

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_HALF = (torch.float16, torch.bfloat16)   # reduced in float32, as torch's CPU reductions do


def _dims(dim, n: int, op: str) -> tuple:
    """``dim`` (None, an int, or a sequence: empty means every dim, as torch reads it) as sorted
    non-negative dims."""
    if isinstance(dim, torch.Tensor) and dim.dim() == 0 and not dim.is_floating_point():
        dim = int(dim)   # torch takes a 0-d integer tensor as a dim
    dims = () if dim is None else (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
    if not dims:
        return tuple(range(n))
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ScorchTypeError(f"{op}: dim must be an int or a tuple of ints, got {dim!r}")
        d = int(d)   # (numpy's integers too)
        if not -n <= d < n:
            raise ScorchIndexError(f"{op}: dim {d} out of range for a {n}-d tensor (expected [{-n}, {n - 1}])")
        out.append(d % n)
    if len(set(out)) != len(out):
        raise ScorchValueError(f"{op}: dim {dim!r} repeats a dimension")
    return tuple(sorted(out))


def _keep(out: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    for d in dims if keepdim else ():
        out = out.unsqueeze(d)
    return out


def _entries(x: SparseTensor):
    """Coordinates and (differentiable) values of the stored entries."""
    coords, _, where = coords_of(x._format, x._shape, x._pos, x._crd, x._vals, positions=True)
    return coords, x.values()[where]


def _group(coords, shape, dims):
    """Linear index of each entry over the dims that are kept, and the number of groups."""
    key = torch.zeros(coords.shape[1], dtype=torch.int64)
    n = 1
    for d, size in enumerate(shape):
        if d not in dims:
            key = key * size + coords[d]
            n *= size
    return key, n


@implements(torch.sum, torch.Tensor.sum)
@accepts_out
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    exact = not x.dtype.is_floating_point and not x.dtype.is_complex
    if dtype is not None and dtype != x.dtype and (dtype.is_floating_point or dtype.is_complex or not exact):
        return sum_(x.to(dtype), dim, keepdim, dtype=dtype)   # torch casts the input first (a float16 sum into float32)
    if exact:
        # bool / integer values: summed exactly as int64, like torch's (a float64 sum rounds past 2**53)
        dims = _dims(dim, x.dim(), "sum")
        key, groups, _, vals = _fibres(x, dims)
        out = torch.zeros(groups, dtype=torch.int64).index_add_(0, key, vals.to(torch.int64))
        out = _shaped(out, x, dims, keepdim)
        return out if dtype is None else out.to(dtype)
    if x.dtype in _HALF:   # accumulated in float32, as torch's reductions of half floats are
        return sum_(x.to(torch.float32), dim, keepdim).to(x.dtype)
    dims = _dims(dim, x.dim(), "sum")
    idx = _LETTERS[:x.dim()]
    out = einsum(f"{idx}->{''.join(c for d, c in enumerate(idx) if d not in dims)}", x, format="dense")
    return _keep(out, dims, keepdim)


@implements(torch.sparse.sum, torch._sparse_sum)
def sparse_sum(x, dim=None, dtype=None):
    """``torch.sparse.sum``: a dense 0-d tensor over all dims, else a sparse result (as torch's)."""
    if isinstance(dim, torch.dtype):  # torch._sparse_sum(x, dtype) overload
        dim, dtype = None, dim
    out = sum_(x, dim, dtype=dtype)
    if dim is None:
        return out
    from ..interop import as_sparse
    return as_sparse(out, "coo") if out.dim() else out


@implements(torch.mean, torch.Tensor.mean)
@accepts_out
def mean(x, dim=None, keepdim=False, *, dtype=None):
    if not (x.dtype.is_floating_point or x.dtype.is_complex or dtype is not None):
        raise ScorchTypeError(f"mean: needs a floating point or complex dtype, got {x.dtype} (pass dtype=)")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise ScorchTypeError(f"mean: dtype= must be a floating point or complex dtype (as torch's), got {dtype}")
    dims = _dims(dim, x.dim(), "mean")
    count = 1
    for d in dims:
        count *= x.shape[d]
    wanted = dtype if dtype is not None else x.dtype
    if wanted in _HALF:   # the sum and the division in float32, as torch's
        return (sum_(x, dims, keepdim, dtype=torch.float32) / count).to(wanted)
    return sum_(x, dims, keepdim, dtype=dtype) / count


def _fibres(x: SparseTensor, dims):
    """The stored entries grouped by output position when reducing ``dims``: each entry's group,
    the number of groups, the elements per group (``fibre``) and the (differentiable) values."""
    coords, vals = _entries(x)
    key, groups = _group(coords, x.shape, dims)
    return key, groups, math.prod(x.shape[d] for d in dims), vals


def _shaped(out: torch.Tensor, x: SparseTensor, dims, keepdim: bool) -> torch.Tensor:
    """One value per group (:func:`_fibres`) in the reduction's result shape."""
    return _keep(out.reshape([s for d, s in enumerate(x.shape) if d not in dims]), dims, keepdim)


def _identity(dtype: torch.dtype, op: str):
    """The start of a max (``op == "amax"``) or min over values of ``dtype``: its lowest / highest
    value (False / True for bool; an integer type has no infinity)."""
    if dtype == torch.bool:
        return op != "amax"
    if dtype.is_floating_point:
        return float("-inf") if op == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if op == "amax" else info.max


def _extreme(x, dim, keepdim, op: str, nan_ties: bool = False):
    """amax / amin over ``dim``: the stored values' extreme per fibre, the implicit zero folded in
    where a fibre is not full.  Its gradient is torch's: shared evenly by every element equal to
    the result -- the absent zeros too, whose shares are simply not stored (a stored 0 tied with
    two absent ones gets 1/3) -- where no element ties (a NaN result) NaN, as torch's amax; with
    ``nan_ties`` (``max()`` / ``min()``, as torch's) the NaNs tie with a NaN result instead."""
    _refuse_complex(x, op)
    dims = _dims(dim, x.dim(), op)
    key, n, fibre, vals = _fibres(x, dims)
    if fibre == 0:
        d = next(d for d in dims if x.shape[d] == 0)
        raise ScorchIndexError(f"{op}: cannot reduce over the zero-size dim {d} of a tensor of shape "
                               f"{tuple(x.shape)} (the operation has no identity)")
    present = None
    if n > 4 * key.numel():  # most results are fibres with nothing stored (0): reduce the others only
        present, key = torch.unique(key, return_inverse=True)
    m = n if present is None else present.numel()
    init = torch.full((m,), _identity(vals.dtype, op), dtype=vals.dtype)
    out = init.scatter_reduce(0, key, vals.detach(), reduce=op, include_self=True)
    counts = torch.bincount(key, minlength=m)
    # A fibre with fewer stored entries than its length holds an implicit zero.
    zero = torch.zeros((), dtype=vals.dtype)
    out = torch.where(counts < fibre, (torch.maximum if op == "amax" else torch.minimum)(out, zero), out)
    if vals.requires_grad and torch.is_grad_enabled():
        out = _TieShare.apply(vals, out, key, _tie_shares(vals.detach(), out, key, fibre - counts, nan_ties))
    if present is not None:  # a 10^8-row hypersparse matrix: 6.2 s and 2 GB of temporaries before
        out = torch.zeros(n, dtype=vals.dtype).index_put((present,), out)
    return _shaped(out, x, dims, keepdim)


def _refuse_complex(x, op: str) -> None:
    """Complex numbers have no order: torch's max / min / argmax... refuse them, so do scorch's."""
    if x.dtype.is_complex:
        raise ScorchTypeError(f"{op}: not implemented for complex tensors (as torch's), got {x.dtype}")


def _tie_shares(v, best, key, absent, nan_ties: bool) -> torch.Tensor:
    """Each stored entry's share of its fibre's gradient: 1 / (the elements equal to the result,
    ``absent`` zeros included where it is 0) at a tie, else 0; NaN throughout a fibre where
    nothing ties (a NaN result, unless ``nan_ties``)."""
    b = best[key]
    tie = (v == b) | (v.isnan() & b.isnan()) if nan_ties else v == b
    ties = torch.zeros(best.shape, dtype=v.dtype).index_add_(0, key, tie.to(v.dtype))
    ties = ties + torch.where(best == 0, absent, 0).to(v.dtype)
    return tie.to(v.dtype) / ties[key]


class _TieShare(torch.autograd.Function):
    """``best`` (the reduced values) with the gradient ``shares`` per stored value: a scatter-reduce's
    own backward splits only among the stored ties, and one built from the values (``best + (s - s.detach())``)
    would turn a non-finite value outside the ties into a NaN result."""

    @staticmethod
    def forward(ctx, vals, best, key, shares):
        ctx.save_for_backward(key, shares)
        return best.clone()

    @staticmethod
    def backward(ctx, grad):
        key, shares = ctx.saved_tensors
        return grad[key] * shares, None, None, None


@implements(torch.amax, torch.Tensor.amax)
@accepts_out
def amax(x, dim=(), keepdim=False):
    return _extreme(x, dim, keepdim, "amax")


@implements(torch.amin, torch.Tensor.amin)
@accepts_out
def amin(x, dim=(), keepdim=False):
    return _extreme(x, dim, keepdim, "amin")


def _softmax(x: SparseTensor, dim, log: bool, dtype=None, op="softmax", scale: float = 1.0):
    """softmax / log_softmax of ``scale * x`` along ``dim`` (absent entries -inf)."""
    if dim is None:
        raise ScorchValueError(f"{op}: pass dim= explicitly")
    (d,) = _dims(dim, x.dim(), op)
    vals = x.values()
    if dtype is not None:
        vals = vals.to(dtype)
    if not vals.dtype.is_floating_point:   # (an integer one overflowed in the -inf fill)
        raise ScorchTypeError(f"{op}: not implemented for {vals.dtype} (as torch's): expects a floating dtype; "
                              f"pass dtype= or convert the input")
    runs = _row_runs(x, d)
    if runs is not None and vals.dtype in (torch.float32, torch.float64) and build.have_compiler() \
            and not (torch.is_grad_enabled() and vals.requires_grad):
        # runs of d's level: one generated kernel (max, exp-sum, scale per run and column)
        res = segments.softmax(runs[0], vals, scale, log, runs[1])
        return x._like(values=res, nnz=x._stored)
    if scale != 1.0:
        vals = vals * scale
    if runs is not None:  # each group is one contiguous run (CSR rows), per column of the width
        lengths = (runs[0][1:] - runs[0][:-1]).to(torch.int64)
        cols = vals.view(-1, runs[1])
        m = torch.segment_reduce(cols.detach(), "max", lengths=lengths, axis=0, unsafe=True)
        shifted = cols - m.repeat_interleave(lengths, dim=0, output_size=cols.shape[0])
        e = shifted.exp()
        group = torch.repeat_interleave(torch.arange(lengths.numel()), lengths, output_size=cols.shape[0])
        # (index_add, not segment_reduce's sum: its backward has no derivative, double backward needs one)
        total = torch.zeros((lengths.numel(), cols.shape[1]), dtype=e.dtype).index_add(0, group, e)[group]
        res = (shifted - total.log() if log else e / total).reshape(-1)
        return x.detach().with_values(res) if res.requires_grad else x._like(values=res, nnz=x._stored)
    coords, _, where = coords_of(x._format, x._shape, x._pos, x._crd, x._vals, positions=True)
    v = vals[where]
    key, n = _group(coords, x.shape, (d,))
    m = torch.full((n,), float("-inf"), dtype=v.dtype).scatter_reduce(0, key, v.detach(), "amax")
    shifted = v - m[key]
    e = shifted.exp()
    total = torch.zeros(n, dtype=v.dtype).index_add(0, key, e)
    res = shifted - total.log()[key] if log else e / total[key]
    full = torch.zeros(vals.shape, dtype=res.dtype).index_put((where,), res)
    return x.detach().with_values(full) if full.requires_grad else x._like(values=full, nnz=x._stored)


def _row_runs(x: SparseTensor, d: int):
    """``(pos, width)`` when softmax along ``d`` is over runs ``pos[r] : pos[r+1]`` of stored
    entries: ``d``'s level compressed, the levels above it dense or compressed (CSR rows, CSC
    columns, CSF fibres), any below it dense, ``width`` entries per position (a CSR pattern
    with a dense vector per stored entry, e.g. one score per attention head); None otherwise."""
    f = x._format
    if f.block or d not in f.order:
        return None
    at = f.order.index(d)
    if f.levels[at].kind != "compressed" or any(lv.kind not in ("dense", "compressed") for lv in f.levels[:at]) \
            or any(lv.kind != "dense" for lv in f.levels[at + 1:]):
        return None
    return x._pos[at], math.prod(x._shape[k] for k in f.order[at + 1:])


def scaled_softmax(x: SparseTensor, dim: int, scale: float) -> SparseTensor:
    """``torch.softmax(scale * x, dim)`` with the scaling inside the kernel (attention scores)."""
    return _softmax(x, dim, False, scale=scale)


@implements(torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax, torch.sparse.softmax)
def softmax(x, dim=None, *args, dtype=None, **kwargs):
    return _softmax(x, dim, False, dtype)


@implements(torch.nn.functional.softmin)
def softmin(x, dim=None, _stacklevel=3, dtype=None):
    """``softmax(-x, dim)``, torch.sparse's semantics as :func:`softmax` (absent entries take no part)."""
    return _softmax(-x, dim, False, dtype)


@implements(torch.log_softmax, torch.Tensor.log_softmax, torch.nn.functional.log_softmax, torch.sparse.log_softmax)
def log_softmax(x, dim=None, *args, dtype=None, **kwargs):
    return _softmax(x, dim, True, dtype, "log_softmax")


# ------------------------------------------------------------------ norms

def _norm(x: SparseTensor, ord, dim, keepdim: bool, dtype, dense_norm):
    """An entrywise ``ord``-norm, ``ord > 0``, from the stored values (the absent zeros add
    nothing), over every dim or over ``dim`` (per output position: a sum of ``|v| ** ord``, or
    the largest ``|v|``); any other norm from the dense tensor (``dense_norm(dense)``), within
    ``config.dense_fallback_max_bytes``.  Differentiable, the gradient in ``x``'s pattern
    (torch's own backward of a norm wrote into its sparse input in place)."""
    if not (isinstance(ord, (int, float)) and not isinstance(ord, bool) and ord > 0):
        return dense_norm(_bounded_dense(x, "norm"))
    if dtype is None and x.dtype in _HALF:   # accumulated in float32, as torch's
        return _norm(x.to(torch.float32), ord, dim, keepdim, None, dense_norm).to(x.dtype)
    if ord == float("inf") and x.numel() == 0 and (dim is None or any(x.shape[d] == 0 for d in _dims(dim, x.dim(),
                                                                                             "norm"))):
        raise ScorchValueError("linalg.vector_norm cannot compute the inf norm on an empty tensor because the "
                               "operation does not have an identity")
    if dtype is not None and x.dtype.is_complex and not dtype.is_complex:
        raise ScorchValueError(f"vector_norm: dtype should be complex for complex inputs (as torch's), got {dtype}")
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise ScorchTypeError(f"norm: expects a floating point or complex tensor (as torch's), got {x.dtype}")
    values = x.values() if dtype is None else x.values().to(dtype)
    if dim is None:
        if x._stored != values.numel():   # (ELL's unused slots: whatever was written there is not an entry)
            values = values[stored(x)[1]]
        # nothing stored: a zero that stays in the values' graph, as a dense norm does (a fresh zero
        # left it: a backward raised); abs: a complex tensor's norm is real
        out = torch.linalg.vector_norm(values, ord) if values.numel() else values.abs().sum()
        return out.reshape((1,) * x.dim()) if keepdim else out
    dims = _dims(dim, x.dim(), "norm")
    size = x.with_values(values.abs())
    if ord == float("inf"):   # torch's gradient: to the largest |v| or, in a fibre holding NaNs, to them
        return _extreme(size, dims, keepdim, "amax", nan_ties=True)
    # |v| ** ord: for ord < 1 a root of each stored |v| (a stored 0 out of the graph, as torch's)
    total = sum_(size if ord == 1 else size.with_values(_root(size.values(), ord) if ord < 1 else size.values() ** ord),
                 dims, keepdim)
    return total if ord == 1 else _root(total, 1.0 / ord)


def _bounded_dense(x: SparseTensor, op: str) -> torch.Tensor:
    """``x.to_dense()`` when it fits ``config.dense_fallback_max_bytes`` (else a clear error)."""
    check_dense_size(f"{op}: this case needs the dense tensor, and", [x])
    return x.to_dense()


@implements(torch.norm, torch.Tensor.norm)
def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if out is not None:
        return accepts_out(norm)(input, p, dim, keepdim, dtype=dtype, out=out)
    ord = 2 if p in ("fro", None) else p
    return _norm(input, ord, dim, keepdim, dtype,
                 lambda d: torch.norm(d, p=p, dim=dim, keepdim=keepdim, dtype=dtype))


@implements(torch.linalg.vector_norm)
@accepts_out
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _norm(x, ord, dim, keepdim, dtype,
                 lambda d: torch.linalg.vector_norm(d, ord, dim, keepdim, dtype=dtype))


@implements(torch.linalg.norm)
@accepts_out
def linalg_norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    entrywise = 2 if dim is None and (ord is None or (ord == "fro" and A.dim() == 2)) else None
    return _norm(A, entrywise, dim, keepdim, dtype,
                 lambda d: torch.linalg.norm(d, ord, dim, keepdim, dtype=dtype))


# ------------------------------------------------------------------ max / min / any / all / count_nonzero / nonzero

@implements(torch.max, torch.Tensor.max)
def max_(input, *args, **kwargs):
    """``max(A)`` over every entry from the stored values (an implicit zero counts where the
    tensor is not full); ``max(A, dim)`` and ``max(A, B)`` as torch runs them."""
    if not isinstance(input, SparseTensor) or not _one_dim(args, kwargs):
        return as_torch_runs(torch.max, input, *args, **kwargs)
    if not args and not kwargs:
        return _whole(input, "amax")
    return torch.return_types.max(_extreme_along(input, *_dim_keepdim(args, kwargs), "amax"))


@implements(torch.min, torch.Tensor.min)
def min_(input, *args, **kwargs):
    if not isinstance(input, SparseTensor) or not _one_dim(args, kwargs):
        return as_torch_runs(torch.min, input, *args, **kwargs)
    if not args and not kwargs:
        return _whole(input, "amin")
    return torch.return_types.min(_extreme_along(input, *_dim_keepdim(args, kwargs), "amin"))


def _one_dim(args, kwargs) -> bool:
    """No arguments (the whole tensor) or an int ``dim`` with ``keepdim`` (not ``max(A, B)``)."""
    if not args and not kwargs:
        return True
    dim = args[0] if args else kwargs.get("dim")
    return isinstance(dim, numbers.Integral) and not isinstance(dim, bool) and set(kwargs) <= {"dim", "keepdim"} \
        and len(args) <= 2


def _dim_keepdim(args, kwargs):
    dim = args[0] if args else kwargs["dim"]
    keepdim = args[1] if len(args) > 1 else kwargs.get("keepdim", False)
    return dim, bool(keepdim)


def _whole(x: SparseTensor, op: str):
    if x.numel() == 0:
        raise ScorchValueError(f"{'max' if op == 'amax' else 'min'}: the tensor has no elements "
                               f"(shape {tuple(x.shape)}); pass dim= to reduce along one")
    _refuse_complex(x, "max" if op == "amax" else "min")
    return _extreme(x, None, False, op, nan_ties=True)   # torch's max() backward: the NaNs tie with a NaN result


@implements(torch.count_nonzero, torch.Tensor.count_nonzero)
def count_nonzero(input, dim=None):
    """Nonzero elements (stored entries holding 0 do not count), over ``dim`` (int or tuple)."""
    return sum_(input.with_values(input.values() != 0), _dims(dim, input.dim(), "count_nonzero"), False)


@implements(torch.any, torch.Tensor.any)
def any_(input, *args, **kwargs):
    """Whether any element is nonzero, over every dim or along ``dim`` (int or tuple) with
    ``keepdim``: from the stored values (absent entries are zeros), a dense bool result."""
    found = _bool_reduce_args("any", input, args, kwargs)
    if found is None:
        return as_torch_runs(torch.any, input, *args, **kwargs)
    dims, keepdim = found
    if dims == ():   # each element alone
        return _as_uint8_if(input, _bounded_dense(input, "any") != 0)
    if dims is None:
        return _as_uint8_if(input, (input.values() != 0).any())
    return _as_uint8_if(input, _keep(count_nonzero(input, dims) > 0, dims, keepdim))


def _as_uint8_if(input, result: torch.Tensor) -> torch.Tensor:
    """torch's ``any`` / ``all`` of uint8 values give uint8 (of any other dtype, bool)."""
    return result.to(torch.uint8) if input.dtype == torch.uint8 else result


@implements(torch.all, torch.Tensor.all)
def all_(input, *args, **kwargs):
    """Whether every element is nonzero (so every position stored), as :func:`any_`."""
    found = _bool_reduce_args("all", input, args, kwargs)
    if found is None:
        return as_torch_runs(torch.all, input, *args, **kwargs)
    dims, keepdim = found
    if dims == ():   # each element alone
        return _as_uint8_if(input, _bounded_dense(input, "all") != 0)
    if dims is None:
        return _as_uint8_if(input, torch.tensor(int(count_nonzero(input)) == input.numel()))
    need = math.prod(input.shape[d] for d in dims)
    return _as_uint8_if(input, _keep(count_nonzero(input, dims) == need, dims, keepdim))


def _bool_reduce_args(op, input, args, kwargs):
    """``(dims, keepdim)`` of ``any`` / ``all`` (dims None: the whole tensor to a 0-d result),
    or None for what torch runs itself (``out=``, a dense input)."""
    if not isinstance(input, SparseTensor) or set(kwargs) - {"dim", "keepdim"} or len(args) > 2:
        return None
    dim = args[0] if args else kwargs.get("dim")
    keepdim = bool(args[1] if len(args) > 1 else kwargs.get("keepdim", False))
    if dim is None and not keepdim:
        return None, False
    if isinstance(dim, (tuple, list)) and not dim:
        return (), keepdim   # torch's any / all reduce nothing over dim=() (sum reads it as every dim)
    return _dims(dim, input.dim(), op), keepdim


@implements(torch.nonzero, torch.Tensor.nonzero)
@accepts_out
def nonzero(input, *, as_tuple=False):
    """Coordinates of the nonzero elements in row-major order, as torch gives them."""
    coords, vals = _entries(input)
    coords = coords[:, vals.detach() != 0]
    if coords.shape[1] > 1:  # level order is not row-major for every format (CSC, permuted views)
        key = ravel_coords(coords, list(input.shape), coords.shape[1])
        coords = coords[:, sort_keys(key, max(1, math.prod(input.shape)))[1]]
    return tuple(coords) if as_tuple else coords.t().contiguous()


@implements(torch.where)
def where(condition, input=None, other=None, *, out=None):
    """``torch.where(condition)`` is ``nonzero(condition, as_tuple=True)``, read off the stored
    entries; the select ``torch.where(condition, input, other)`` goes on as torch runs it."""
    if input is None and other is None and out is None:
        return nonzero(condition, as_tuple=True)
    return as_torch_runs(torch.where, condition, input, other, **({} if out is None else {"out": out}))


# ------------------------------------------------------------------ var / std / diagonal / trace

def _legacy_var_args(fn):
    """torch's positional forms of var / std: ``(unbiased)``, ``(dim, unbiased[, keepdim])``,
    ``(dim, keepdim=...)``, besides the keyword ``correction=`` form."""
    @functools.wraps(fn)
    def run(input, *args, **kwargs):
        if args and isinstance(args[0], bool):   # var(x, False): unbiased
            args, kwargs = args[1:], {**kwargs, "unbiased": args[0]}
        if len(args) > 1:
            names = ("dim", "unbiased", "keepdim")[:len(args)]
            if len(args) > 3 or any(n in kwargs for n in names):
                raise ScorchTypeError(f"{fn.__name__}: takes (input, dim, unbiased, keepdim) positionally, "
                                      f"got {len(args) + 1} positional arguments")
            args, kwargs = (), {**kwargs, **dict(zip(names, args))}
        return fn(input, *args, **kwargs)
    return run


@implements(torch.var, torch.Tensor.var)
@accepts_out
@_legacy_var_args
def var(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    """Variance over ``dim`` (absent entries are zeros), two passes over the stored values: the
    means, then the squared deviations of the stored values plus those of the absent zeros
    (``count * |mean|**2``); no dense copy, no cancellation of a sum of squares.  Complex values
    have a real variance, as torch's: the mean of ``|v - mean|**2`` (the parts' variances summed)."""
    if unbiased is not None:
        correction = 1 if unbiased else 0
    if not (input.dtype.is_floating_point or input.dtype.is_complex):
        raise ScorchTypeError(f"var: needs a floating point or complex dtype, got {input.dtype}")
    wide = torch.complex128 if input.dtype.is_complex else torch.float64
    if input.dtype != wide:   # accumulated in float64, as torch's CPU var (1e38 values overflow float32)
        out = var(input.to(wide), dim, correction=correction, keepdim=keepdim)
        return out.to(input.dtype.to_real())
    dims = _dims(dim, input.dim(), "var")
    key, groups, n, vals = _fibres(input, dims)
    mean = torch.zeros(groups, dtype=vals.dtype).index_add(0, key, vals) / max(n, 1)
    stored = torch.bincount(key, minlength=groups).to(torch.float64)
    squares = torch.zeros(groups, dtype=torch.float64).index_add(0, key, _abs2(vals - mean[key])) \
        + (n - stored) * _abs2(mean)
    if n - correction <= 0:   # as torch: divided by 0 (inf, NaN where every deviation is 0), warned
        warnings.warn("var(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
                      "factor (input numel divided by output numel).", stacklevel=3)
    out = squares / max(n - correction, 0)
    return _shaped(out, input, dims, keepdim)


@implements(torch.std, torch.Tensor.std)
@accepts_out
@_legacy_var_args
def std(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    if input.dtype in _HALF + (torch.float32, torch.complex64):   # the root in float64 too, as torch's
        wide = torch.complex128 if input.dtype.is_complex else torch.float64
        return std(input.to(wide), dim, correction=correction, keepdim=keepdim,
                   unbiased=unbiased).to(input.dtype.to_real())
    return _root(var(input, dim, correction=correction, keepdim=keepdim, unbiased=unbiased), 0.5)


def _abs2(v: torch.Tensor) -> torch.Tensor:
    """``|v| ** 2`` without a root (a complex value's squared parts summed: abs() would round and,
    at 0, cut the gradient's path)."""
    return (v * v.conj()).real if v.is_complex() else v * v


def _root(total: torch.Tensor, power: float) -> torch.Tensor:
    """``total ** power`` (``power < 1``: a root, whose gradient at 0 is infinite) with zero totals
    out of the graph: their gradient 0, as torch's norm and std backward mask it (a NaN stays)."""
    positive = total != 0
    return torch.where(positive, torch.where(positive, total, 1.0) ** power, 0.0)


@implements(torch.diagonal, torch.Tensor.diagonal)
def diagonal(input, offset=0, dim1=0, dim2=1):
    """The ``offset``-th diagonal of a 2-d SparseTensor as a dense 1-d tensor (a copy, not a view)."""
    if input.dim() != 2 or dim1 % 2 == dim2 % 2:
        return as_torch_runs(torch.diagonal, input, offset, dim1, dim2)
    if dim1 % 2 == 1:
        input = input.t()
    rows, cols = input.shape
    length = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    coords, vals = _entries(input)
    on = coords[1] - coords[0] == offset
    out = torch.zeros(length, dtype=input.dtype)
    return out.index_add(0, coords[0][on] if offset >= 0 else coords[1][on], vals[on])


def refuse_bool(x, op: str) -> None:
    """torch's ``op`` has no bool form (argmax, trace, topk, median...): neither has scorch's."""
    if x.dtype == torch.bool:
        raise ScorchTypeError(f"{op}: does not support bool input (as torch's); convert it first (x.int())")


@implements(torch.trace, torch.Tensor.trace)
def trace(input):
    refuse_bool(input, "trace")
    if input.dim() != 2:
        raise ScorchValueError(f"trace: expects a 2-d tensor, got {input.dim()}-d")
    return diagonal(input).sum()


@implements(torch.isin)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """``torch.isin`` with SparseTensor ``elements``: where 0 is not in (for ``invert``: is in)
    ``test_elements`` the absent entries are False, so the result is a bool SparseTensor in the
    pattern; otherwise it is dense by definition, computed densely.  A sparse ``test_elements``
    counts its stored values and, unless full, 0."""
    if isinstance(test_elements, SparseTensor):
        full = test_elements._stored == test_elements.numel()
        test_elements = test_elements.values() if full else torch.cat([test_elements.values(),
                                                                        test_elements.values().new_zeros(1)])
    if not isinstance(elements, SparseTensor):
        return as_torch_runs(torch.isin, elements, test_elements, assume_unique=assume_unique, invert=invert)
    zero_hit = bool(torch.isin(torch.zeros((), dtype=elements.dtype), test_elements, invert=invert))
    if zero_hit:
        check_dense_size("isin is True at the absent entries here, so its result is dense, and", [elements])
        return torch.isin(elements.to_dense(), test_elements, assume_unique=assume_unique, invert=invert)
    hits = torch.isin(elements.values(), test_elements, assume_unique=assume_unique, invert=invert)
    return elements.detach()._like(values=hits, nnz=elements._stored)


@implements(torch.nn.functional.normalize)
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """``input / max(norm(input, p, dim), eps)``: for a SparseTensor a sparse result in its pattern
    (each row of a CSR adjacency scaled to unit norm, say), the norm from the stored values;
    ``out=`` takes the result as :func:`~scorch._dispatch.write_out` writes one."""
    if out is not None:
        return write_out("normalize", normalize(input, p, dim, eps), out, densify=True)
    if not isinstance(input, SparseTensor):
        return as_torch_runs(torch.nn.functional.normalize, input, p, dim, eps)
    norm = _norm(input, p, dim, True, None, lambda d: torch.linalg.vector_norm(d, p, dim, True))
    return input / norm.clamp_min(eps)


def _difference_loss(name, input, target, reduction, per_entry, torch_args, plain):
    """A loss of ``input - target`` entrywise, ``per_entry(d)`` with ``per_entry(0) == 0``: on
    the stored values of a sparse difference (the union of two sparse operands' patterns; never
    densified), on the dense one against a dense operand, then reduced.  Unless ``plain`` (torch's
    deprecated arguments, ``weight=``), broadcasting and mixed dtypes: as torch runs the loss,
    with ``torch_args`` after ``input, target``."""
    if not plain or not isinstance(target, torch.Tensor) or input.shape != target.shape \
            or input.dtype != target.dtype:
        return as_torch_runs(getattr(torch.nn.functional, name), input, target, *torch_args)
    if reduction not in ("none", "mean", "sum"):
        raise ScorchValueError(f"{name}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    diff = input - target
    loss = diff.with_values(per_entry(diff.values())) if isinstance(diff, SparseTensor) else per_entry(diff)
    return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()


@implements(torch.nn.functional.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """Mean squared error with SparseTensor operands (see :func:`_difference_loss`)."""
    return _difference_loss("mse_loss", input, target, reduction, lambda d: d * d,
                            (size_average, reduce, reduction, weight),
                            size_average is None and reduce is None and weight is None)


@implements(torch.nn.functional.smooth_l1_loss)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Smooth L1 loss with SparseTensor operands (see :func:`_difference_loss`)."""
    f = lambda d: torch.nn.functional.smooth_l1_loss(d, torch.zeros_like(d), reduction="none", beta=beta)  # noqa: E731
    return _difference_loss("smooth_l1_loss", input, target, reduction, f, (size_average, reduce, reduction, beta),
                            size_average is None and reduce is None)


@implements(torch.nn.functional.huber_loss)
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """Huber loss with SparseTensor operands (see :func:`_difference_loss`)."""
    f = lambda d: torch.nn.functional.huber_loss(d, torch.zeros_like(d), reduction="none", delta=delta)  # noqa: E731
    return _difference_loss("huber_loss", input, target, reduction, f, (reduction, delta, weight), weight is None)


@implements(torch.prod, torch.Tensor.prod)
@accepts_out
def prod(input, dim=None, keepdim=False, *, dtype=None):
    """Product over ``dim`` (int or None): the stored values' product where a fibre is full, 0
    where it holds an implicit zero; bool / integer values multiply as int64, as torch's do."""
    values_dtype = dtype if dtype is not None else input.dtype if input.dtype.is_floating_point \
        or input.dtype.is_complex else torch.int64
    dims = _dims(dim, input.dim(), "prod")
    key, groups, fibre, vals = _fibres(input, dims)
    out = torch.ones(groups, dtype=values_dtype).scatter_reduce(0, key, vals.to(values_dtype), reduce="prod",
                                                                include_self=True)
    full = torch.bincount(key, minlength=groups) == fibre
    # a fibre holding an implicit zero: 0 -- NaN where a stored value is NaN or infinite (0 * inf), not
    # where the stored values' product merely overflows
    if values_dtype.is_floating_point:
        bad = torch.zeros(groups, dtype=torch.bool).index_put_((key,), ~torch.isfinite(vals.detach()),
                                                               accumulate=True)
        out_absent = torch.where(bad, float("nan"), out * 0)
        out_absent = torch.where(bad | torch.isfinite(out), out_absent, torch.zeros((), dtype=values_dtype))
    else:
        out_absent = torch.zeros_like(out)   # (out * 0 made a bool product int64)
    return _shaped(torch.where(full, out, out_absent), input, dims, keepdim)


@implements(torch.argmax, torch.Tensor.argmax)
@accepts_out
def argmax(input, dim=None, keepdim=False):
    """The flat index of the first largest element (``dim=None``); along a dim as torch runs it."""
    return _arg_extreme(input, dim, keepdim, "amax")


@implements(torch.argmin, torch.Tensor.argmin)
@accepts_out
def argmin(input, dim=None, keepdim=False):
    return _arg_extreme(input, dim, keepdim, "amin")


def _arg_extreme(x, dim, keepdim, op: str):
    name = "argmax" if op == "amax" else "argmin"
    if not isinstance(x, SparseTensor):
        return as_torch_runs(torch.argmax if op == "amax" else torch.argmin, x, dim, keepdim)
    refuse_bool(x, name)
    _refuse_complex(x, name)
    if dim is not None:
        return _extreme_along(x, dim, keepdim, op)[1]
    if keepdim:
        return _arg_extreme(x, None, False, op).reshape((1,) * x.dim())
    if x.numel() == 0:   # (an IndexError, as torch's)
        raise ScorchIndexError(f"{name}: the tensor has no elements (shape {tuple(x.shape)}); pass dim= to reduce "
                               f"along a nonempty one")
    return _extreme_along(x.reshape(-1), 0, False, op)[1]   # the flat index: along the flattened tensor


def _extreme_along(x: SparseTensor, dim, keepdim: bool, op: str):
    """``(values, indices)`` of max / min along one ``dim``: the first position of the extreme,
    a stored value or an implicit zero (the fibre's first unstored position), as torch gives."""
    name = "max" if op == "amax" else "min"
    _refuse_complex(x, name)
    d = _dims(dim, x.dim(), name)[0]
    if x.shape[d] == 0:   # (an IndexError, as torch's)
        raise ScorchIndexError(f"{name}: cannot reduce over the zero-size dim {d} of shape {tuple(x.shape)}")
    values = _extreme(x, d, False, op)
    coords, vals = _entries(x)
    key, groups = _group(coords, x.shape, (d,))
    along = coords[d]
    best = values.reshape(-1)[key]
    big = torch.full((groups,), x.shape[d], dtype=torch.int64)
    v = vals.detach()
    hit = (v == best) | (v.isnan() & best.isnan())   # a NaN is the extreme: its first position
    first_hit = big.scatter_reduce(0, key[hit], along[hit], "amin")
    # the first unstored position of each fibre: entries sorted by (fibre, position), the first
    # whose position differs from its rank in the fibre
    order = sort_keys(key * x.shape[d] + along, max(1, groups * x.shape[d]))[1]
    k, a = key[order], along[order]
    start = torch.zeros(groups + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(k, minlength=groups), 0, out=start[1:])
    rank = torch.arange(k.numel()) - start[k]
    counts = start[1:] - start[:-1]
    missing = counts.clone().scatter_reduce(0, k[a != rank], rank[a != rank], "amin")
    zero_wins = (values.reshape(-1) == 0) & (counts < x.shape[d])
    index = torch.where(zero_wins, torch.minimum(first_hit, missing), first_hit)
    if vals.requires_grad and torch.is_grad_enabled():   # the value at the index returned (torch's gradient
        chosen = along == index[key]                      # goes there alone; amax's splits among ties)
        values = torch.zeros(groups, dtype=vals.dtype).index_put((key[chosen],), vals[chosen]).reshape(values.shape)
    index = index.reshape([s for i, s in enumerate(x.shape) if i != d])
    if keepdim:
        values, index = values.unsqueeze(d), index.unsqueeze(d)
    return values, index
