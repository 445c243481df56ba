"""``matmul`` / ``mm`` / ``bmm`` / ``@`` as einsums (torch's shape rules)."""

from __future__ import annotations

import functools
import math
import warnings

import torch

from .._dispatch import accepts_out, broadcast_shapes, implements
from ..compiler import permute
from ..errors import NotSupportedError, ScorchTypeError, ScorchValueError
from ..format import Format, compressed, dense
from ..interop import as_sparse, is_sparse
from ..tensor import SparseTensor
from .einsum import einsum, einsum_add
from .reduce import _entries

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


@implements(torch.matmul, torch.Tensor.matmul)
@accepts_out
def matmul(input, other):
    """``input @ other`` with torch's rules (1-d promotion, batch broadcasting); sparse operands
    run compiled kernels: SpMV, SpMM, batched SpMM, SpGEMM.

    >>> import torch, scorch
    >>> A = scorch.as_sparse(torch.eye(2), "csr")
    >>> (A @ torch.ones(2, 3)).shape
    torch.Size([2, 3])
    """
    if not (is_sparse(input) or is_sparse(other)):
        return torch.matmul(input, other)
    return einsum(_equation(_ndim(input), _ndim(other)), input, other)


def _ndim(x) -> int:
    """Number of dims without a torch-function round trip for SparseTensors (hot path)."""
    return len(x._shape) if isinstance(x, SparseTensor) else x.dim()


implements(torch.Tensor.__matmul__)(matmul.__wrapped__)   # `A @ x` takes no out=: one call less


@implements(torch.Tensor.__rmatmul__)
def _rmatmul(a, b):
    return matmul(b, a)


# products of fixed ranks: name, torch's argument names, the ranks, what the error says they must be
_RANKED = (("mm", ("input", "mat2"), (2, 2), "2-d operands"), ("bmm", ("input", "mat2"), (3, 3), "3-d operands"),
           ("mv", ("input", "vec"), (2, 1), "a 2-d matrix and a 1-d vector"),
           ("dot", ("input", "tensor"), (1, 1), "two 1-d tensors"))


def _ranked_product(name, names, ranks, what):
    """``torch.<name>``: :func:`matmul` of two operands of ``ranks`` (positional or by torch's names)."""
    def op(*args, **kwargs):
        a, b = args + tuple(kwargs.pop(n) for n in names[len(args):] if n in kwargs)
        if kwargs:
            raise ScorchTypeError(f"{name}() got unexpected keyword arguments {sorted(kwargs)}")
        if (a.dim(), b.dim()) != ranks:
            raise ScorchValueError(f"{name}: expects {what}, got {a.dim()}-d and {b.dim()}-d")
        return matmul(a, b)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``torch.{name}``: ``{names[0]} @ {names[1]}`` for {what}."
    return op


for _name, _names, _ranks, _what in _RANKED:
    implements(getattr(torch, _name), getattr(torch.Tensor, _name))(accepts_out(_ranked_product(_name, _names,
                                                                                                _ranks, _what)))


@implements(torch.inner, torch.Tensor.inner)
@accepts_out
def inner(a, b):
    """``torch.inner``: the last dims contracted."""
    if a.dim() == 0 or b.dim() == 0:
        return a * b
    if a.shape[-1] != b.shape[-1]:
        raise ScorchValueError(f"inner: the last dims differ: {tuple(a.shape)} and {tuple(b.shape)}")
    letters = iter(_BATCH + "ijklmnopqrstuvwxyz")
    ta = "".join(next(letters) for _ in range(a.dim() - 1))
    tb = "".join(next(letters) for _ in range(b.dim() - 1))
    return einsum(f"{ta}z,{tb}z->{ta}{tb}", a, b)


# ``beta * input + alpha * product``: name, its einsum, the two factors' names and ranks (what
# the error says they must be), the torch functions it serves.  ``input`` broadcasts to the product.
_SCALED_PRODUCTS = (
    ("addmm", "ij,jk->ik", ("mat1", "mat2"), (2, 2), "2-d matrices",
     (torch.addmm, torch.Tensor.addmm, torch.sparse.addmm)),
    ("addmv", "ij,j->i", ("mat", "vec"), (2, 1), "a 2-d matrix and a 1-d vector", (torch.addmv, torch.Tensor.addmv)),
    ("baddbmm", "bij,bjk->bik", ("batch1", "batch2"), (3, 3), "3-d batches", (torch.baddbmm, torch.Tensor.baddbmm)),
    ("addbmm", "bij,bjk->ik", ("batch1", "batch2"), (3, 3), "3-d batches", (torch.addbmm, torch.Tensor.addbmm)),
    ("addr", "i,j->ij", ("vec1", "vec2"), (1, 1), "1-d vectors", (torch.addr, torch.Tensor.addr)),
)


def _scaled_product(name, equation, names, ranks, what):
    """torch's ``name(input, <names>, *, beta=1, alpha=1)``: ``beta * input + alpha *
    einsum(equation, ...)``, either factor sparse (the factors positional or by torch's names)."""
    def op(input, *factors, beta=1, alpha=1, **named):
        factors = factors + tuple(named.pop(n) for n in names[len(factors):] if n in named)
        if named or len(factors) != 2:
            raise ScorchTypeError(f"{name}() takes input, {names[0]} and {names[1]} (and beta=, alpha=), got "
                                  f"{len(factors)} factors{' and ' + ', '.join(named) if named else ''}")
        a, b = factors
        if (a.dim(), b.dim()) != ranks:
            raise ScorchValueError(f"{name}: expects {what}, got {a.dim()}-d and {b.dim()}-d")
        return _scaled_sum(name, equation, input, a, b, beta, alpha)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``torch.{name}``: ``beta * input + alpha * einsum({equation!r}, {names[0]}, {names[1]})``."
    return op


_SCALED = {}   # name -> its implementation (out= and the in-place form wrap it)
for _name, _eq, _names, _ranks, _what, _funcs in _SCALED_PRODUCTS:
    _SCALED[_name] = _scaled_product(_name, _eq, _names, _ranks, _what)
    implements(*_funcs)(accepts_out(_SCALED[_name]))


def _written_into_self(name: str, op):
    """The in-place form ``self.<name>(...)`` of the out-of-place ``op`` for a dense ``self``
    (``dense.addmm_(A, X)``): the result copied into ``self``, whose shape it must keep."""
    def in_place(self, *args, **kwargs):
        if is_sparse(self):
            raise NotSupportedError(f"{name}: writing a product into a sparse tensor in place is not supported "
                                    f"(its pattern would change); use torch.{name[:-1]}, or x.to_dense() first")
        result = op(self, *args, **kwargs)
        if is_sparse(result):
            result = result.to_dense()
        if tuple(result.shape) != tuple(self.shape):
            raise ScorchValueError(f"{name}: the result has shape {tuple(result.shape)}, but self has "
                                   f"{tuple(self.shape)} (an in-place op cannot broadcast self)")
        if not torch.can_cast(result.dtype, self.dtype):
            raise ScorchValueError(f"{name}: the result has dtype {result.dtype}, which self's {self.dtype} "
                                   "cannot hold")
        return self.copy_(result)
    in_place.__name__ = name
    return in_place


for _name, _op in _SCALED.items():
    implements(getattr(torch.Tensor, _name + "_"))(_written_into_self(_name + "_", _op))


def _scaled_sum(name, equation, input, a, b, beta, alpha):
    """``beta * input + alpha * einsum(equation, a, b)``, torch's addmm rules: ``input`` broadcasts
    to the product's shape; with ``beta == 0`` it is ignored (NaNs too), and so is the product with
    ``alpha == 0`` where torch's BLAS-backed forms ignore it (addmm, addmv, addbmm); integer
    operands take the scalars as integers (torch casts them: ``beta=0.5`` is 0), and bool ones as
    bools (``beta=3`` is True: an or of the and-ed terms, a bool result, where multiplying by 3
    promoted it to int64); a dense ``input`` with both factors 1 starts the kernel's accumulators."""
    common = torch.promote_types(torch.promote_types(a.dtype, b.dtype), input.dtype)
    if not (common.is_floating_point or common.is_complex):
        if name == "addr" and any(isinstance(s, float) for s in (alpha, beta)):
            raise ScorchTypeError("addr: for integral input tensors, alpha and beta must not be floating point "
                                  f"numbers (as torch's), got alpha={alpha!r}, beta={beta!r}")
        alpha, beta = (bool(alpha), bool(beta)) if common == torch.bool else (_as_integer(alpha), _as_integer(beta))
    if beta == 1 and alpha == 1 and isinstance(input, torch.Tensor) and not is_sparse(input) \
            and (is_sparse(a) or is_sparse(b)):
        return einsum_add(equation, (a, b), (input,))  # input starts the accumulators
    prod = einsum(equation, a, b) if (is_sparse(a) or is_sparse(b)) else torch.einsum(equation, a, b)
    if broadcast_shapes(input.shape, prod.shape) != tuple(prod.shape):
        raise ScorchValueError(f"{name}: input of shape {tuple(input.shape)} does not broadcast to the product's "
                               f"shape {tuple(prod.shape)}")
    if alpha == 0 and name in ("addmm", "addmv", "addbmm"):   # (an inf or NaN in a factor stays out;
        prod = torch.nan_to_num(prod, nan=0.0, posinf=0.0, neginf=0.0) * 0   # zeros kept in the graph)
    elif alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return (input if beta == 1 else input * beta) + prod


def _as_integer(scalar):
    """A float ``alpha`` / ``beta`` of an integer product, cast as torch casts it (towards zero)."""
    return int(scalar) if isinstance(scalar, float) else scalar


@implements(torch.sparse.mm)
def sparse_mm(mat1, mat2, reduce="sum"):
    """``torch.sparse.mm``: ``mat1 @ mat2``; with ``reduce`` ("sum", "mean", "amax", "amin") each
    output row reduces the products of the stored entries of ``mat1``'s row (a row with none: 0)."""
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise ScorchValueError(f"sparse.mm: expects 2-d matrices, got {mat1.dim()}-d and {mat2.dim()}-d")
    if reduce == "sum":
        return matmul(mat1, mat2)
    if reduce not in ("mean", "amax", "amin"):
        raise ScorchValueError(f"sparse.mm: reduce must be 'sum', 'mean', 'amax' or 'amin', got {reduce!r}")
    if not isinstance(mat1, SparseTensor) or mat1.format.ndim != 2 or is_sparse(mat2):
        raise ScorchValueError(f"sparse.mm: reduce={reduce!r} needs a 2-d sparse mat1 and a dense mat2 "
                               f"(as torch's CSR kernel), got {type(mat1).__name__} and {type(mat2).__name__}")
    if mat1.shape[1] != mat2.shape[0]:
        raise ScorchValueError(f"sparse.mm: mat1 {tuple(mat1.shape)} and mat2 {tuple(mat2.shape)} do not chain")
    (rows, cols), vals = _entries(mat1)
    if reduce == "mean":
        count = torch.zeros(mat1.shape[0], dtype=mat2.dtype).index_add_(0, rows, torch.ones_like(vals, dtype=mat2.dtype))
        return matmul(mat1, mat2) / count.clamp(min=1).unsqueeze(1)
    prods = vals.unsqueeze(1).to(mat2.dtype) * mat2.index_select(0, cols)
    out = torch.zeros(mat1.shape[0], mat2.shape[1], dtype=prods.dtype)
    return out.scatter_reduce_(0, rows.unsqueeze(1).expand_as(prods), prods, reduce, include_self=False)


@implements(torch.sparse.sampled_addmm)
@accepts_out
def sampled_addmm(input, mat1, mat2, *, beta=1.0, alpha=1.0):
    """``torch.sparse.sampled_addmm``: ``alpha * (mat1 @ mat2) + beta * input`` at the stored
    entries of the sparse ``input`` only (an SDDMM), in ``input``'s pattern."""
    if not isinstance(input, SparseTensor) or input.dim() != 2 or mat1.dim() != 2 or mat2.dim() != 2:
        raise ScorchValueError("sparse.sampled_addmm: expects a 2-d sparse input and 2-d dense mat1, mat2, got "
                               f"{type(input).__name__} {input.dim()}-d, {mat1.dim()}-d and {mat2.dim()}-d")
    pattern = input.with_values(torch.ones_like(input.values()))
    prod = einsum("ij,ik,kj->ij", pattern, mat1, mat2)
    values = prod.values() * alpha if alpha != 1 else prod.values()
    if beta != 0:
        values = values + (input.values() * beta if beta != 1 else input.values())
    return input.with_values(values)


def _sparse_times(name: str, mat1, mat2, format):
    """``mat1 @ mat2`` kept sparse: the rows ``mat1`` stores, every column of ``mat2`` (torch.sparse's
    ``smm`` / ``hspmm`` / ``sspaddmm``), in ``format`` (None: ``mat1``'s)."""
    if not isinstance(mat2, torch.Tensor):
        raise ScorchTypeError(f"{name}: mat2 must be a tensor, got {type(mat2).__name__}")
    if not is_sparse(mat1) or mat1.dim() != 2 or mat2.dim() != 2:
        raise ScorchValueError(f"{name}: expects a 2-d sparse mat1 and a 2-d mat2, got {type(mat1).__name__} "
                               f"{mat1.dim()}-d and {type(mat2).__name__} {mat2.dim()}-d")
    if mat1.shape[1] != mat2.shape[0]:
        raise ScorchValueError(f"{name}: mat1 {tuple(mat1.shape)} and mat2 {tuple(mat2.shape)} do not chain")
    if not isinstance(mat1, SparseTensor):
        mat1 = as_sparse(mat1, "coo")   # a torch.sparse operand beside a SparseTensor mat2
    format = format or mat1.format
    if format.block and any(n % b for n, b in zip((mat1.shape[0], mat2.shape[1]), format.block)):
        format = "csr"   # blocks that do not tile the product's shape
    return einsum("ij,jk->ik", mat1, mat2, format=format)


@implements(torch.smm, torch.Tensor.smm)
def smm(input, mat2):
    """``torch.smm``: ``input @ mat2`` as a SparseTensor in ``input``'s format (torch's is COO): the
    rows ``input`` stores, each with every column."""
    return _sparse_times("smm", input, mat2, None)


@implements(torch.hspmm)
def hspmm(mat1, mat2):
    """``torch.hspmm``: ``mat1 @ mat2`` as torch's hybrid COO holds it -- the rows ``mat1`` stores,
    each a dense row: a SparseTensor in ``Format([compressed, dense])``."""
    return _sparse_times("hspmm", mat1, mat2, Format([compressed, dense]))


@implements(torch.sspaddmm, torch.Tensor.sspaddmm)
def sspaddmm(input, mat1, mat2, *, beta=1, alpha=1):
    """``torch.sspaddmm``: ``beta * input + alpha * (mat1 @ mat2)``, sparse (the union of ``input``'s
    pattern and the rows ``mat1`` stores) in ``input``'s format."""
    if not is_sparse(input) or input.dim() != 2:
        raise ScorchValueError(f"sspaddmm: expects a 2-d sparse input, got {type(input).__name__} {input.dim()}-d")
    if not isinstance(input, SparseTensor):
        input = as_sparse(input, "coo")
    prod = _sparse_times("sspaddmm", mat1, mat2, input.format)
    if tuple(input.shape) != tuple(prod.shape):
        raise ScorchValueError(f"sspaddmm: input {tuple(input.shape)} must have the product's shape "
                               f"{tuple(prod.shape)}")
    out = (input if beta == 1 else input * beta) + (prod if alpha == 1 else prod * alpha)
    return out if out.format == input.format else out.asformat(input.format)   # (a union may pick another)


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
        # The bias is added in place after the kernel (a fresh result: no second buffer).
        flat = input.reshape(math.prod(input.shape[:-1]), input.shape[-1])   # (-1 is ambiguous beside a 0)
        ops = (weight, permute.transposed(flat))
        fused = bias is not None and not is_sparse(bias) and bias.dim() == 1
        out = einsum_add("oi,ib->ob", ops, (bias[:, None],)) if fused else einsum("oi,ib->ob", *ops)
        # 2-d input: the transposed view, no copy (the next layer reads it as it is); a batch of
        # more dims would get strides no dense linear gives, and ``.view`` of it fails: contiguous
        out = out.t() if input.dim() == 2 else out.t().reshape(*input.shape[:-1], weight.shape[0]).contiguous()
        return out + bias if bias is not None and not fused else out
    elif bias is not None and not is_sparse(weight) and not is_sparse(bias):
        return einsum_add("...i,oi->...o", (input, weight), (bias,))
    else:
        out = einsum("...i,oi->...o", input, weight)
    if isinstance(out, torch.Tensor) and is_sparse(out) and bias is not None:
        out = out.to_dense()
    return out if bias is None else out + bias


@implements(torch.tensordot)
@accepts_out
def tensordot(a, b, dims=2):
    """``torch.tensordot`` as an einsum: ``dims`` an int (last dims of a with first of b) or two lists."""
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


@implements(torch.nn.functional.bilinear)
def bilinear(input1, input2, weight, bias=None):
    """``y[..., o] = sum_ij input1[..., i] weight[o, i, j] input2[..., j] + bias[o]`` (``nn.Bilinear``)
    as one three-operand einsum: any of them sparse."""
    if weight.dim() != 3:
        raise ScorchValueError(f"bilinear: weight must be 3-d (out, in1, in2), got {weight.dim()}-d")
    if input1.dim() == 0 or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise ScorchValueError(f"bilinear: input1 {tuple(input1.shape)} and input2 {tuple(input2.shape)} must be "
                               "at least 1-d with the same leading dims")
    if (input1.shape[-1], input2.shape[-1]) != tuple(weight.shape[1:]):
        raise ScorchValueError(f"bilinear: weight {tuple(weight.shape)} does not match the inputs' last dims "
                               f"{input1.shape[-1]} and {input2.shape[-1]}")
    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else out + bias


@implements(torch.linalg.cross)
@accepts_out
def linalg_cross(input, other, *, dim=-1):
    """``torch.linalg.cross`` of 3-vectors along ``dim`` (other dims broadcast): each component a
    difference of two products of the operands' other components (sparse operands: sparse)."""
    if input.dim() != other.dim():
        raise ScorchValueError(f"linalg.cross: the operands must have the same number of dims (as in torch), got "
                               f"{input.dim()}-d and {other.dim()}-d")
    for name, x in (("input", input), ("other", other)):
        if not -x.dim() <= dim < x.dim() or x.shape[dim] != 3:
            raise ScorchValueError(f"linalg.cross: {name} {tuple(x.shape)} must have size 3 at dim {dim}")
    i1, i2 = torch.tensor([1, 2, 0]), torch.tensor([2, 0, 1])
    d = dim % input.dim()
    a1, a2 = input.index_select(d, i1), input.index_select(d, i2)
    b1, b2 = other.index_select(d, i1), other.index_select(d, i2)
    return a1 * b2 - a2 * b1


@implements(torch.cross, torch.Tensor.cross)
@accepts_out
def cross(input, other, dim=None):
    """``torch.cross``: ``dim=None`` takes the first dim of size 3, with torch's warning."""
    if dim is None:
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated.\nPlease either pass the dim "
                      "explicitly or simply use torch.linalg.cross.\nThe default value of dim will change to agree "
                      "with that of linalg.cross in a future release.", UserWarning, stacklevel=2)
        shape = broadcast_shapes(input.shape, other.shape)
        dim = next((d for d, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise ScorchValueError(f"cross: no dim of size 3 in {tuple(shape)}")
        dim -= len(shape)
    return linalg_cross.__wrapped__(input, other, dim=dim)
