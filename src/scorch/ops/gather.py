"""Reading elements at given positions: ``take``, ``gather`` / ``take_along_dim`` and
``masked_select`` on a SparseTensor, all as point lookups (``x[i, j, ...]``, see
:func:`scorch.ops.shape.getitem`): each position is searched among the stored entries (zero
where none is stored).  Results are dense, as torch's; differentiable w.r.t. the stored values.

Writing a SparseTensor's elements into a dense tensor: ``index_add`` from the stored entries,
``scatter`` / ``scatter_add`` / ``scatter_reduce`` from the part of the source the index covers;
into a SparseTensor, in place, the changed positions join its pattern.
``F.embedding`` / ``F.embedding_bag`` in a SparseTensor table look up its rows the same way
(``index_select``).
"""

from __future__ import annotations

import torch

from .._dispatch import accepts_out, broadcast_shapes, check_dense_size, dense_fallback, implements, implements_aten
from ..errors import ScorchIndexError, ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from ..interop import as_sparse, is_torch_sparse
from ._pattern import in_pattern, project
from .reduce import _entries
from .assign import _densified, mask_points, refuse_grad, values_at, write_points
from .shape import _dense_call, _dim, along, dense_entries, getitem

__all__ = ["take", "gather", "take_along_dim", "masked_select", "index_add", "index_add_", "embedding", "embedding_bag"]


def _integer(index, op: str) -> torch.Tensor:
    if not isinstance(index, torch.Tensor) or isinstance(index, SparseTensor):
        raise ScorchTypeError(f"{op}: index must be a dense integer tensor, got {type(index).__name__}")
    if index.dtype == torch.bool or index.dtype.is_floating_point or index.dtype.is_complex:
        raise ScorchTypeError(f"{op}: index must hold integers, got dtype {index.dtype}")
    return index


def _dense(out):
    """A lookup's result as torch gives it: dense (one 1-d index is index_select's sparse form)."""
    return out.to_dense() if isinstance(out, SparseTensor) else out


@implements(torch.take, torch.Tensor.take)
@accepts_out
def take(input, index):
    """The elements at flat (row-major) positions ``index``, in ``index``'s shape."""
    if not isinstance(input, SparseTensor) or isinstance(index, SparseTensor):   # a sparse index: densely
        return _dense_call(torch.take, input, index)
    x = input
    return _dense(getitem(x.reshape(-1), (_integer(index, "take"),)))


@implements(torch.gather, torch.Tensor.gather)
@accepts_out
def gather(input, dim, index, *, sparse_grad=False):
    """``out[p] = input[p with its dim-th coordinate replaced by index[p]]``."""
    if not isinstance(input, SparseTensor) or isinstance(index, SparseTensor):   # a sparse index: densely
        return _dense_call(torch.gather, input, dim, index, sparse_grad=sparse_grad)
    x = input
    index = _integer(index, "gather")
    d = _dim(dim, x.dim(), "gather")
    if index.dim() != x.dim():
        raise ScorchValueError(f"gather: index needs as many dims as the input ({x.dim()}), got {index.dim()}")
    for e in range(x.dim()):
        if e != d and index.shape[e] > x.shape[e]:
            raise ScorchIndexError(f"gather: index's size {index.shape[e]} at dim {e} exceeds the input's "
                                   f"{x.shape[e]}")
    if index.numel() == 0:   # (in the graph: an empty read of the values, as torch's empty gather is)
        empty = torch.zeros(index.shape, dtype=x.dtype)
        return empty + x.values()[:0].sum() if x._needs_grad() else empty
    if int(index.min()) < 0 or int(index.max()) >= x.shape[d]:
        bad = int(index.min()) if int(index.min()) < 0 else int(index.max())
        raise ScorchIndexError(f"gather: index {bad} is out of range for dim {d} of size {x.shape[d]} "
                               f"(expected [0, {x.shape[d] - 1}])")
    key = tuple(index if e == d else torch.arange(index.shape[e]).reshape([-1 if f == e else 1
                                                                          for f in range(x.dim())])
                for e in range(x.dim()))
    return _dense(getitem(x, key))


@implements(torch.take_along_dim, torch.Tensor.take_along_dim)
@accepts_out
def take_along_dim(input, indices, dim=None):
    """``gather`` with ``indices`` broadcast against the input along the other dims (no ``dim``:
    ``take`` on the flattened input)."""
    if not isinstance(input, SparseTensor) or isinstance(indices, SparseTensor):   # a sparse index: densely
        return _dense_call(torch.take_along_dim, input, indices, dim)
    indices = _integer(indices, "take_along_dim")
    if indices.dtype != torch.int64:
        raise ScorchTypeError(f"take_along_dim: indices must be int64 (as torch requires), got {indices.dtype}")
    x = input
    if dim is None:   # (torch does not wrap a negative flat index here)
        return take(x, _in_range(indices.reshape(-1), x.numel(), "take_along_dim", "the flattened input"))
    d = _dim(dim, x.dim(), "take_along_dim")
    if indices.dim() != x.dim():
        raise ScorchValueError(f"take_along_dim: input and indices should have the same number of dimensions, got "
                               f"{x.dim()} for input and {indices.dim()} for indices")
    both = list(broadcast_shapes(*[tuple(t.shape[:d]) + (1,) + tuple(t.shape[d + 1:]) for t in (x, indices)]))
    if tuple(x.shape) != tuple(both[:d] + [x.shape[d]] + both[d + 1:]):
        x = x.expand(both[:d] + [x.shape[d]] + both[d + 1:])   # (the input broadcast: its entries repeated)
    return gather(x, d, indices.expand(both[:d] + [indices.shape[d]] + both[d + 1:]))


@implements(torch.masked_select, torch.Tensor.masked_select)
@accepts_out
def masked_select(input, mask):
    """The elements where ``mask`` is True, ``input`` and ``mask`` broadcast together, row-major, 1-d."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ScorchTypeError(f"masked_select: mask must be a bool tensor, got "
                              f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if not isinstance(input, SparseTensor):   # a dense input with a sparse mask: densely
        return _dense_call(torch.masked_select, input, mask)
    shape = broadcast_shapes(tuple(input.shape), tuple(mask.shape))
    if tuple(input.shape) != shape:
        input = input.expand(shape)
    if mask_points(mask, shape) is None:   # (a sparse mask of the input's shape stays sparse)
        mask = _densified(mask, "masked_select: a sparse mask that broadcasts").expand(shape)
    return _dense(getitem(input, mask))


@implements(torch.Tensor.sparse_mask)
def sparse_mask(input, mask):
    """``input`` (dense or sparse) read at ``mask``'s stored positions, in ``mask``'s pattern (its
    values ignored), as torch's ``sparse_mask``: zero where ``input`` stores nothing there;
    differentiable w.r.t. ``input``.  A torch.sparse ``input`` or ``mask`` is taken as scorch's."""
    input, mask = (as_sparse(t) if is_torch_sparse(t) else t for t in (input, mask))
    if not isinstance(mask, SparseTensor):
        dense = "a dense " if isinstance(mask, torch.Tensor) else ""
        raise ScorchTypeError(f"sparse_mask: mask must be a sparse tensor, got {dense}{type(mask).__name__}")
    if not isinstance(input, torch.Tensor) or tuple(input.shape) != tuple(mask.shape):
        raise ScorchValueError(f"sparse_mask: input and mask must have the same shape, got "
                               f"{tuple(getattr(input, 'shape', ()))} and {tuple(mask.shape)}")
    return in_pattern(mask.detach(), project(input, mask))


# ---------------------------------------------------------------- writes from a SparseTensor into a dense tensor

def _on_sparse_self(fn, op: str, self: SparseTensor, args, kwargs):
    """``fn(self, *args)`` (a scatter, ``index_add`` or ``index_reduce``) with a SparseTensor ``self``:
    out of place, torch's op on the dense copy (the warned dense fallback); in place (``op`` ends in
    ``_``), on the positions it touches only (:func:`_touched`): their values read from ``self``, torch's
    op run on them as a 1-d tensor, the results written back (a new nonzero joins the pattern, as
    ``x[key] = v``) -- work for ``self.nnz`` plus the index's (or source's) elements, never the dense shape."""
    if not op.endswith("_"):
        return dense_fallback(fn, (self, *args), kwargs)
    refuse_grad(op, self, *args)
    if op == "index_add_":   # a sum: the source's entries accumulated at their coordinates
        return _index_add_into(self, *args, kwargs.get("alpha", 1), op)
    lin, args = _touched(op, self, args)
    uniq, inverse = torch.unique(lin, return_inverse=True)
    after = fn(values_at(self, uniq), 0, inverse, *args, **kwargs)
    write_points(self, uniq, after, op)
    return self


def _touched(op: str, self: SparseTensor, args):
    """``(lin, args)``: the linear position in ``self`` each contribution of the op lands on and the
    op's arguments past its index for the same op on a 1-d tensor (the contributions flattened),
    after torch's checks of the arguments."""
    dim, index, *rest = args
    d = _dim(dim, self.dim(), op)
    if op == "index_reduce_":   # (dim, index, source, reduce): one contribution per source element
        source, *rest = rest
        source = _densified(source, f"{op}: a sparse source")
        index = _integer(index, op)
        torch.empty(self.shape, dtype=self.dtype, device="meta").index_reduce_(
            d, index.to("meta"), source.to("meta"), *rest)
        index = _in_range(index.reshape(-1), self.shape[d], op, f"dimension {d}")
        return _positions(self.shape, source.shape, d, index[along(source.shape, d)]), (source.reshape(-1), *rest)
    index = _integer(index, op)   # scatter family: (dim, index, src or value, ...), one per index element
    src = rest.pop(0) if rest else None   # (None: scatter_(dim, index, value=v))
    if index.dim() != self.dim() and index.numel():
        raise ScorchValueError(f"{op}: index needs as many dims as self ({self.dim()}), got {index.dim()}")
    if isinstance(src, torch.Tensor):
        if isinstance(src, SparseTensor):
            src = src[tuple(slice(0, n) for n in index.shape)]
        src = _densified(src, f"{op}: a sparse src")
        torch.empty(self.shape, dtype=self.dtype, device="meta").scatter_(d, index.to("meta"), src.to("meta"))
        src = src[tuple(slice(0, n) for n in index.shape)].reshape(-1)
    for e in range(index.dim()):
        if e != d and index.shape[e] > self.shape[e]:
            raise ScorchIndexError(f"{op}: index's size {index.shape[e]} at dim {e} exceeds self's {self.shape[e]}")
    index = _in_range(index, self.shape[d], op, f"dimension {d}")
    return _positions(self.shape, index.shape, d, index), (*([] if src is None else [src]), *rest)


def _in_range(index: torch.Tensor, size: int, op: str, where: str) -> torch.Tensor:
    """``index`` (int64) checked within ``[0, size)`` of ``where`` (a dimension, the flattened
    input): torch's scatters, index_add and take_along_dim do not wrap negatives."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        bad = int(index.min()) if int(index.min()) < 0 else int(index.max())
        raise ScorchIndexError(f"{op}: index {bad} is out of bounds for {where} with size {size}")
    return index.to(torch.int64)


def _positions(shape, box, d: int, at: torch.Tensor) -> torch.Tensor:
    """The row-major linear positions in ``shape`` of the elements of a tensor of shape ``box``, their
    ``d``-th coordinate replaced by ``at`` (of shape ``box``); 1-d."""
    lin = torch.zeros(at.numel(), dtype=torch.int64)
    for e, n in enumerate(shape):
        lin = lin * n + (at if e == d else along(box, e)).reshape(-1)
    return lin


def _index_add_into(self, dim, index, source, alpha, op: str):
    """``self[..., index[j], ...] += alpha * source[..., j, ...]`` from ``source``'s stored entries."""
    d = _dim(dim, self.dim(), op)
    index = _integer(index, op).reshape(-1)
    if tuple(index.shape) != (source.shape[d],) or self.dim() != source.dim():
        raise ScorchValueError(f"{op}: index needs one position per slice of source along dim {d} "
                               f"({source.shape[d]}), got {index.numel()}; source dims {source.dim()}, self dims "
                               f"{self.dim()}")
    if self.numel() == 0:   # (torch adds nothing, whatever the index)
        return self
    index = _in_range(index, self.shape[d], op, f"dimension {d}")
    coords, vals = _entries(source) if isinstance(source, SparseTensor) else dense_entries(source)
    coords = coords.clone()
    coords[d] = index[coords[d]]
    return self.index_put_(tuple(coords), (vals if alpha == 1 else vals * alpha).to(self.dtype), accumulate=True)


@implements(torch.Tensor.index_add_)
def index_add_(self, dim, index, source, *, alpha=1):
    """A dense tensor plus a SparseTensor's slices at ``index`` (its stored entries only)."""
    if isinstance(self, SparseTensor):
        return _on_sparse_self(torch.Tensor.index_add_, "index_add_", self, (dim, index, source), {"alpha": alpha})
    return _index_add_into(self, dim, index, source, alpha, "index_add_")


@implements(torch.index_add, torch.Tensor.index_add)
@accepts_out
def index_add(input, dim, index, source, *, alpha=1):
    if isinstance(input, SparseTensor):
        return _on_sparse_self(torch.index_add, "index_add", input, (dim, index, source), {"alpha": alpha})
    return _index_add_into(input.clone(), dim, index, source, alpha, "index_add")


@implements(torch.Tensor.index_reduce_)
def index_reduce_(self, dim, index, source, reduce, *, include_self=True):
    """In place, as ``index_add_``: into a SparseTensor the positions it changes are written (its dense
    copy computed on); into a dense tensor from a sparse source, on the source's dense copy."""
    if isinstance(self, SparseTensor):
        return _on_sparse_self(torch.Tensor.index_reduce_, "index_reduce_", self, (dim, index, source, reduce),
                               {"include_self": include_self})
    check_dense_size("index_reduce_ reads the source's dense copy, and", [source])
    return _dense_call(torch.Tensor.index_reduce_, self, dim, index,
                       source.to_dense() if isinstance(source, SparseTensor) else source, reduce,
                       include_self=include_self)


def _scatter(fn, op: str):
    """``fn(self, dim, index, src, ...)`` with a sparse ``src``: the part of ``src`` that ``index``
    covers, densified (the same size as ``index``); a dense ``self``."""
    def run(self, dim, index, src=None, *args, **kwargs):
        rest = args if src is None else (src, *args)   # (scatter(dim, index, value=v) has no src)
        if isinstance(self, SparseTensor):
            return _on_sparse_self(fn, op, self, (dim, index, *rest), kwargs)
        if isinstance(index, SparseTensor):   # a sparse index: densely
            return _dense_call(fn, self, dim, index, *rest, **kwargs)
        if isinstance(src, SparseTensor):
            index = _integer(index, op)
            if index.dim() != src.dim():
                raise ScorchValueError(f"{op}: index needs as many dims as src ({src.dim()}), got {index.dim()}")
            rest = (src[tuple(slice(0, n) for n in index.shape)].to_dense(), *args)
        return fn(self, dim, index, *rest, **kwargs)
    run.__name__ = op
    return run


for _name in ("scatter", "scatter_add", "scatter_reduce"):
    for _owner in (torch, torch.Tensor):
        implements(getattr(_owner, _name))(_scatter(getattr(_owner, _name), _name))
    implements(getattr(torch.Tensor, _name + "_"))(_scatter(getattr(torch.Tensor, _name + "_"), _name + "_"))
    # the aten forms, which torch's composites issue on a SparseTensor they made (gumbel_softmax's
    # hard one-hot: zeros_like(logits).scatter_(...) fell to the dense fallback, which refuses writes)
    for _op in getattr(torch.ops.aten, _name + "_").overloads():
        implements_aten(getattr(getattr(torch.ops.aten, _name + "_"), _op))(
            _scatter(getattr(torch.Tensor, _name + "_"), _name + "_"))


# ---------------------------------------------------------------- embedding lookups in a sparse table

def _table_rows(input, weight, max_norm, norm_type, scale_grad_by_freq, op: str):
    """``(index, rows)``: the checked index and the table's rows it looks up, one per index entry,
    densified (never the whole table); differentiable w.r.t. the stored values."""
    if not isinstance(weight, SparseTensor) or isinstance(input, SparseTensor):
        raise ScorchTypeError(f"{op}: a SparseTensor is only supported as the weight (the table)")
    if weight.dim() != 2:
        raise ScorchValueError(f"{op}: weight must be 2-d (num_embeddings, dim), got {weight.dim()}-d")
    index = _integer(input, op)
    flat = index.reshape(-1)
    if max_norm is not None:
        _renorm_rows(weight, flat, max_norm, norm_type)
    rows = _dense(weight.index_select(0, flat))
    if scale_grad_by_freq and rows.requires_grad:   # each row's gradient over its count in the batch
        uniq, inverse, counts = torch.unique(flat, return_inverse=True, return_counts=True)
        scale = (1 / counts.to(rows.dtype))[inverse].unsqueeze(1)
        rows.register_hook(lambda g: g * scale)
    return index, rows


def _renorm_rows(weight: SparseTensor, flat: torch.Tensor, max_norm, norm_type) -> None:
    """torch's ``embedding_renorm_``, in place and untracked: each looked-up row whose
    ``norm_type``-norm exceeds ``max_norm`` is scaled to ``max_norm / (norm + 1e-7)`` of itself."""
    with torch.no_grad():
        uniq = torch.unique(flat)
        norms = torch.linalg.vector_norm(_dense(weight.index_select(0, uniq)).double(), norm_type, dim=1)
        big = norms > max_norm
        if bool(big.any()):
            scale = torch.ones(weight.shape[0], 1, dtype=torch.float64)
            scale[uniq[big], 0] = max_norm / (norms[big] + 1e-7)
            weight.mul_(scale.to(weight.dtype))


@implements(torch.nn.functional.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """``F.embedding`` with a SparseTensor table (a pruned ``nn.Embedding``): the looked-up rows
    only, densified -- a dense result of ``input.shape + (dim,)`` as torch's, never the whole
    table -- differentiable w.r.t. the stored values; ``padding_idx``'s rows get no gradient."""
    index, rows = _table_rows(input, weight, max_norm, norm_type, scale_grad_by_freq, "embedding")
    out = rows.reshape(*index.shape, weight.shape[1])
    if padding_idx is not None and out.requires_grad:
        pad = padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
        out = torch.where((index == pad).unsqueeze(-1), out.detach(), out)
    return out


@implements(torch.nn.functional.embedding_bag)
def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """``F.embedding_bag`` with a SparseTensor table: the looked-up rows densified (one per index,
    as torch reads them from a dense table), then torch's own bag reduction over them -- its
    modes, offsets and per-sample weights, unchanged; differentiable w.r.t. the stored values."""
    if scale_grad_by_freq and mode == "max":
        raise ScorchValueError("embedding_bag: max mode does not support scaling the gradient by the frequency "
                               "(scale_grad_by_freq=True), as torch's")
    index, rows = _table_rows(input, weight, max_norm, norm_type, scale_grad_by_freq, "embedding_bag")
    flat = index.reshape(-1)
    # the rows as a table of their own, one per position (a padding position: a zero row after them)
    local = torch.arange(flat.numel()).reshape(index.shape)
    pad = None
    if padding_idx is not None:
        pad = flat.numel()
        rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
        local = torch.where(index == (padding_idx % weight.shape[0]), pad, local)
    return torch.nn.functional.embedding_bag(local, rows, offsets, mode=mode, per_sample_weights=per_sample_weights,
                                             include_last_offset=include_last_offset, padding_idx=pad)
