"""Ops that replicate stored entries: ``repeat`` / ``tile`` / ``expand`` / ``expand_as`` /
``broadcast_to`` / ``repeat_interleave`` and ``kron``.

Each copy of an entry lands at its coordinates offset by the copy's position times the
input's size along each dim (``kron``: the other operand's entries scaled by one operand's
values).  The result is sparse, in the input's format adapted to the result's dims
(:func:`scorch.ops.shape.result_format`), with ``nnz`` times the number of copies entries;
nothing is densified.  Unlike torch's ``expand`` (a view with stride 0) the result is a new
SparseTensor.  All are differentiable w.r.t. the stored values (each result value is a
gather of source values; ``kron``'s a product of two).
"""

from __future__ import annotations

import math

import torch

from .._dispatch import accepts_out, implements, implements_aten
from ..errors import ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from .shape import _dim, _int, _one_or_many, _sizes, assemble, dense_entries, entries, unravel_coords

__all__ = ["repeat", "tile", "expand", "expand_as", "broadcast_to", "repeat_interleave", "kron"]

_I64 = torch.int64


def _replicated(x: SparseTensor, copies: list):
    """``x`` (with leading dims of size 1 added up to ``len(copies)`` dims) repeated ``copies[d]``
    times along each dim ``d``: ``x.repeat(*copies)``."""
    n = len(copies)
    base = [1] * (n - x.dim()) + list(x.shape)
    coords, ids = entries(x)
    nnz, total = ids.numel(), math.prod(copies)
    coords = torch.cat([torch.zeros((n - x.dim(), nnz), dtype=_I64), coords])
    copy = torch.stack(unravel_coords(torch.arange(total), copies)) if n else torch.zeros((0, total), dtype=_I64)
    offset = copy * torch.tensor(base, dtype=_I64)[:, None]
    coords = (coords[:, :, None] + offset[:, None, :]).reshape(n, nnz * total)
    ids = ids[:, None].expand(nnz, total).reshape(-1)
    shape = [c * s for c, s in zip(copies, base)]
    return assemble(x._format, shape, coords, ids, x.values(), x.index_dtype)


@implements(torch.Tensor.repeat)
def repeat(self, *sizes):
    """``self`` repeated ``sizes[d]`` times along each dim (extra leading sizes add dims)."""
    sizes = _sizes(sizes, "repeat")
    if len(sizes) < self.dim():
        raise ScorchValueError(f"repeat: expected at least {self.dim()} sizes (one per dim of the input, "
                               f"shape {tuple(self.shape)}), got {len(sizes)}: {tuple(sizes)}")
    if any(s < 0 for s in sizes):
        raise ScorchValueError(f"repeat: sizes must be >= 0, got {tuple(sizes)}")
    return _replicated(self, sizes)


@implements_aten(torch.ops.aten.repeat.default)
def _aten_repeat(self, repeats):
    return repeat(self, list(repeats))


@implements(torch.tile, torch.Tensor.tile)
def tile(input, *dims, **kwargs):
    """``repeat`` with ``dims`` padded by leading 1s to the input's number of dims (``x.tile(2, 1)``
    as ``x.tile((2, 1))``)."""
    dims = _sizes((_one_or_many("tile", "dims", dims, kwargs),), "tile")
    return repeat(input, [1] * (input.dim() - len(dims)) + dims)


@implements(torch.Tensor.expand)
def expand(self, *sizes, implicit=False):
    """``self`` broadcast to ``sizes`` (-1 keeps a dim; only size-1 dims grow; extra leading sizes
    add dims): a new SparseTensor holding each entry once per copy."""
    sizes = _sizes(sizes, "expand")
    n, shape = len(sizes), tuple(self.shape)
    if n < len(shape):
        raise ScorchValueError(f"expand: the number of sizes ({n}) must be at least the number of dims "
                               f"of the input ({len(shape)}, shape {shape})")
    lead = n - len(shape)
    copies = []
    for d, s in enumerate(sizes):
        own = shape[d - lead] if d >= lead else None
        if s == -1 and own is not None:
            copies.append(1)
        elif s < 0:
            raise ScorchValueError(f"expand: size {s} at dim {d} is invalid (-1 only for an existing dim, "
                                   f"else >= 0): sizes {tuple(sizes)}")
        elif own is None or own == 1:
            copies.append(s)
        elif s == own:
            copies.append(1)
        else:
            raise ScorchValueError(f"expand: dim {d - lead} of the input has size {own}, which is not 1 and "
                                   f"differs from the requested {s} (input shape {shape}, sizes {tuple(sizes)})")
    return _replicated(self, copies)


@implements_aten(torch.ops.aten.expand.default)
def _aten_expand(self, size, *, implicit=False):
    return expand(self, list(size))


@implements(torch.Tensor.expand_as)
def expand_as(self, other):
    return expand(self, tuple(other.shape))


@implements(torch.broadcast_to, torch.Tensor.broadcast_to)
def broadcast_to(input, size):
    return expand(input, tuple(size))


@implements(torch.repeat_interleave, torch.Tensor.repeat_interleave)
def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each position along ``dim`` repeated ``repeats`` times in place (an int, or one count per
    position); ``dim=None`` works on the flattened input."""
    if not isinstance(input, SparseTensor):
        raise ScorchTypeError(f"repeat_interleave: expected a SparseTensor input, got {type(input).__name__} "
                              "(a SparseTensor as repeats is not supported)")
    if repeats is None:
        raise ScorchValueError("repeat_interleave: repeats is required for a SparseTensor input")
    if dim is None:
        return repeat_interleave(input.reshape(-1), repeats, 0, output_size=output_size)
    d = _dim(dim, input.dim(), "repeat_interleave")
    size = input.shape[d]
    if isinstance(repeats, torch.Tensor) and repeats.dim() == 1 and repeats.numel() != 1:
        if repeats.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ScorchTypeError(f"repeat_interleave: repeats must hold integers, got {repeats.dtype}")
        if repeats.numel() != size:
            raise ScorchValueError(f"repeat_interleave: repeats has {repeats.numel()} counts, expected one per "
                                   f"position of dim {d} (size {size})")
        counts = repeats.to(_I64)
    else:
        r = _int(repeats.item() if isinstance(repeats, torch.Tensor) and repeats.numel() == 1 else repeats,
                 "repeat_interleave", "repeats")
        counts = torch.full((size,), r, dtype=_I64)
    if bool((counts < 0).any()):
        raise ScorchValueError("repeat_interleave: repeats must be >= 0")
    start = torch.zeros(size + 1, dtype=_I64)
    torch.cumsum(counts, 0, out=start[1:])
    total = int(start[-1])
    if output_size is not None and _int(output_size, "repeat_interleave", "output_size") != total:
        raise ScorchValueError(f"repeat_interleave: output_size={output_size} but the repeats sum to {total}")
    coords, ids = entries(input)
    along = coords[d]
    each = counts[along]                         # copies of each entry
    owner = torch.repeat_interleave(torch.arange(ids.numel()), each)
    first = torch.zeros(ids.numel() + 1, dtype=_I64)
    torch.cumsum(each, 0, out=first[1:])
    step = torch.arange(owner.numel()) - first[owner]
    coords = coords[:, owner]
    coords[d] = start[along[owner]] + step
    shape = list(input.shape)
    shape[d] = total
    return assemble(input._format, shape, coords, ids[owner], input.values(), input.index_dtype)


def padded_entries(t, n: int, dtype, op: str):
    """Coordinates (``n`` dims, leading ones padded), differentiable values (as ``dtype``) and the
    padded shape of ``t``'s entries: a SparseTensor's stored ones, or every element of a dense
    tensor (its zeros too, when it needs a gradient), else its nonzeros (``kron``, ``block_diag``)."""
    shape = [1] * (n - t.dim()) + list(t.shape)
    if isinstance(t, SparseTensor):
        coords, ids = entries(t)
        vals = t.values()[ids]
    elif isinstance(t, torch.Tensor):
        coords, vals = dense_entries(t)
    else:
        raise ScorchTypeError(f"{op}: expected tensors, got {type(t).__name__}")
    coords = torch.cat([torch.zeros((n - t.dim(), coords.shape[1]), dtype=_I64), coords])
    return coords, vals.to(dtype), shape


@implements(torch.kron, torch.Tensor.kron)
@accepts_out
def kron(input, other):
    """The Kronecker product (sparse: zero wherever a sparse operand is); shapes padded with
    leading 1s to the same number of dims."""
    n = max(input.dim(), other.dim())
    dtype = torch.result_type(input, other)
    ca, va, sa = padded_entries(input, n, dtype, "kron")
    cb, vb, sb = padded_entries(other, n, dtype, "kron")
    coords = (ca[:, :, None] * torch.tensor(sb, dtype=_I64)[:, None, None] + cb[:, None, :]).reshape(n, -1)
    vals = (va[:, None] * vb[None, :]).reshape(-1)
    fmt = (input if isinstance(input, SparseTensor) else other)._format
    index_dtype = (input if isinstance(input, SparseTensor) else other).index_dtype
    shape = [a * b for a, b in zip(sa, sb)]
    return assemble(fmt, shape, coords, torch.arange(vals.numel()), vals, index_dtype)
