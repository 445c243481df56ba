"""Writes into SparseTensors, done on coordinates: ``x[key] = value`` and the in-place index ops
(``index_put_``, ``index_fill_``, ``fill_diagonal_``, ``index_copy_``, ``put_``,
``masked_scatter_``).

A write touches the positions its key selects, never the dense shape: :func:`key_points` turns
any key torch takes into the selected positions' row-major linear indices (checked by torch on a
meta tensor and stride-0 aranges), :func:`values_at` reads the values there and
:func:`write_points` / :func:`store_at` write them.  A stored position takes the value in place;
a nonzero (or NaN) written where nothing is stored joins the pattern (the tensor takes new
storage, in its format and index width), a written zero there does not.  Writes are not recorded
by autograd (:func:`refuse_grad`).  The helpers here serve :mod:`scorch.ops.pointwise` and
:mod:`scorch.ops.gather` too.
"""

from __future__ import annotations

import math

import torch

from .. import config
from .._dispatch import broadcast_shapes, check_dense_size, check_write, implements
from ..errors import NotSupportedError, ScorchIndexError, ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from ._pattern import stored
from .shape import (_I64, _check_linear, _dense_call, _dim, _int, _numpy_as_tensors, _stack_rows, along, rebuild,
                    ravel_coords, unravel_coords)

__all__ = ["setitem", "index_put_", "index_put", "index_fill_", "index_fill", "fill_diagonal_", "index_copy_",
           "put_", "masked_scatter_"]


@implements(torch.Tensor.__setitem__)
def setitem(x, key, value):
    """``x[key] = value`` with a SparseTensor ``x``: the stored entries the key selects take the
    value (broadcast as torch broadcasts it; any key torch takes); a nonzero written where ``x``
    stores nothing joins the pattern (:func:`store_at`, as ``copy_`` takes its source's).
    (torch.sparse refuses every assignment.)  A dense ``x`` with a sparse key or value: on their
    dense values."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.__setitem__, x, key, value)
    check_write("setitem", x)
    if torch.is_grad_enabled() and (x.requires_grad or (isinstance(value, torch.Tensor) and value.requires_grad)):
        raise NotSupportedError("setitem: writing into a SparseTensor that requires grad, or a value that does, is "
                                "not recorded by autograd; assign under torch.no_grad() (a parameter update), or "
                                "build a new tensor (torch.where, x.with_values)")
    key = _numpy_as_tensors(key)
    if isinstance(key, tuple) and len(key) == 1 and isinstance(key[0], SparseTensor):
        key = key[0]   # (index_put_'s one-mask tuple)
    at = mask_points(key, x._shape)
    if at is not None and (not isinstance(value, torch.Tensor) or value.dim() == 0):
        return _set_points(x, at, value)   # x[x < 0] = 0: the mask's stored True entries, nothing dense
    dense = lambda k: _densified(k, "setitem: a sparse key or value")  # noqa: E731
    key = tuple(map(dense, key)) if isinstance(key, tuple) else dense(key)
    value = dense(value)
    if isinstance(value, torch.Tensor) and value.dtype != x.dtype:
        value = value.to(x.dtype)   # as torch casts an assigned tensor to the destination's dtype
    scalar = not isinstance(value, torch.Tensor) or value.dim() == 0
    if scalar and value != value:
        value = float("nan")
    coords, where = stored(x)
    points = key if isinstance(key, tuple) else (key,)
    if scalar and len(points) == x.dim() and all(isinstance(k, int) and not isinstance(k, bool) for k in points):
        # one position: found among the stored entries, no dense marks
        point = [_int(k, "setitem", "index") for k in points]
        for d, k in enumerate(point):
            if not -x._shape[d] <= k < x._shape[d]:
                raise ScorchIndexError(f"setitem: index {k} is out of range for dim {d} of size {x._shape[d]}")
        at = torch.tensor([k % x._shape[d] for d, k in enumerate(point)], dtype=_I64)
        hit = (coords == at[:, None]).all(0)
        if not bool(hit.any()) and value != 0:
            return store_at(x, at[:, None], _scalars(value, x.dtype, 1), "setitem")
        x._vals[where[hit]] = value
    elif scalar and (items := _basic_items(key, x.dim())) is not None:
        # ints and slices (a row, a column, a block): the selection read off the coordinates
        hit, positions = torch.ones(where.numel(), dtype=torch.bool), 1
        for d, (kind, v) in enumerate(items):
            size = x._shape[d]
            if kind == "int":
                k = _int(v, "setitem", "index")
                if not -size <= k < size:
                    raise ScorchIndexError(f"setitem: index {k} is out of range for dim {d} of size {size}")
                hit &= coords[d] == k % size
            else:
                start, stop, step = v.indices(size)
                positions *= len(range(start, stop, step))
                hit &= (coords[d] >= start) & (coords[d] < stop) & ((coords[d] - start) % step == 0)
        if value != 0 and int(hit.sum()) < positions:
            _check_store_size(x, positions, "setitem")
            axes = [torch.tensor([_int(v, "setitem", "index") % n]) if kind == "int"
                    else torch.arange(*v.indices(n)) for (kind, v), n in zip(items, x._shape)]
            at = torch.stack([a.reshape(-1) for a in torch.meshgrid(*axes, indexing="ij")])
            return store_at(x, at, _scalars(value, x.dtype, at.shape[1]), "setitem")
        x._vals[where[hit]] = value
    else:   # tensor keys, tensor values: the selected positions' coordinates, nothing of the dense shape
        lin, shape = key_points(x, key, "setitem")
        write_points(x, lin, _scalars(value, x.dtype, lin.numel()) if scalar else
                     broadcast_value(value, shape, x.dtype, "setitem"), "setitem")
        return
    torch.autograd.graph.increment_version(x)   # a tensor saved for backward sees the write


# ---------------------------------------------------------------- writes at points, on coordinates

def _bools_as_indices(key):
    """``key`` with its bool masks (bool tensors, lists of bools) as the integer tensors of their
    True positions -- torch's meaning of a mask -- so the selection's shape is known before any
    position is read (a meta tensor cannot index with a mask); ``key`` itself when it holds none."""
    keys = key if isinstance(key, tuple) else (key,)

    def as_indices(k):
        if isinstance(k, list) and k and all(isinstance(i, bool) for i in k):
            k = torch.tensor(k)
        if isinstance(k, torch.Tensor) and k.dtype == torch.bool:
            return k.nonzero(as_tuple=True) if k.dim() else (bool(k),)
        return (k,)
    out = [as_indices(k) for k in keys]
    if all(len(o) == 1 and o[0] is k for o, k in zip(out, keys)):
        return key
    return tuple(i for o in out for i in o)


def key_points(x: SparseTensor, key, op: str):
    """``(lin, shape)``: the row-major linear positions (int64, 1-d) that ``x[key]`` selects, in the
    order of its elements, and its shape -- any key torch takes, checked by torch (on a meta tensor
    for the shape, on stride-0 aranges for the positions): memory for the selected positions
    only, never the dense shape."""
    masks = _bools_as_indices(key)
    if masks is not key:   # torch's own checks of a mask's shape (IndexError), on a stride-0 tensor
        torch.zeros((), dtype=torch.bool).expand(x._shape)[key]
    key = masks
    shape = tuple(torch.empty(x._shape, device="meta")[key].shape)
    k = math.prod(shape)
    _check_store_size(x, k, op)
    _check_linear(x._shape)
    lin = torch.zeros(k, dtype=_I64)
    for d, n in enumerate(x._shape):
        lin = lin * n + along(x._shape, d)[key].reshape(-1)
    return lin, shape



def broadcast_value(value, shape, dtype, op: str) -> torch.Tensor:
    """``value`` as written into ``x[key]`` of ``shape``: cast to ``dtype``, its leading size-1 dims
    dropped and broadcast, as torch's assignment does; flattened (one value per selected position)."""
    value = torch.as_tensor(value).to(dtype)
    while value.dim() > len(shape) and value.shape[0] == 1:
        value = value[0]
    try:
        return value.expand(shape).reshape(-1)
    except RuntimeError:
        raise ScorchValueError(f"{op}: a value of shape {tuple(value.shape)} cannot be broadcast to the selection's "
                               f"shape {tuple(shape)}") from None


def write_points(x: SparseTensor, lin: torch.Tensor, vals: torch.Tensor, op: str, accumulate: bool = False) -> None:
    """Write ``vals`` at the linear positions ``lin`` of ``x`` (repeats allowed: the last one wins,
    or with ``accumulate`` they all add, as torch's ``index_put_``): the stored positions take the
    new value in place; a nonzero (or NaN) at a position ``x`` does not store joins the pattern
    (new storage, as :func:`store_at`).  Work and memory: ``x.nnz + lin.numel()``."""
    vals = vals.to(x.dtype)
    uniq, inverse = torch.unique(lin, return_inverse=True)
    if accumulate:
        new = torch.zeros(uniq.numel(), dtype=x.dtype).index_put_((inverse,), vals, accumulate=True)
    else:
        last = torch.full((uniq.numel(),), -1, dtype=_I64).scatter_reduce(
            0, inverse, torch.arange(lin.numel(), dtype=_I64), "amax")
        new = vals[last]
    coords, where = stored(x)
    slot, hit = _find_linear(ravel_coords(coords, x._shape, coords.shape[1]), uniq)
    if accumulate:
        new[hit] += x._vals[where[slot]]
    grow = ~hit & ((new != 0) | new.isnan())
    if not bool(grow.any()):
        x._vals[where[slot]] = new[hit]
        torch.autograd.graph.increment_version(x)
        return
    _check_store_size(x, int(grow.sum()), op)
    values = x._vals[where].clone()
    values[slot] = new[hit]
    added = _stack_rows(unravel_coords(uniq[grow], list(x._shape)), int(grow.sum()))
    x._restore(rebuild(x._format, x._shape, torch.cat([coords, added], 1), torch.cat([values, new[grow]]),
                       x.index_dtype))
    torch.autograd.graph.increment_version(x)


def _find_linear(old: torch.Tensor, lin: torch.Tensor):
    """``(slot, hit)``: which of the linear positions ``lin`` are among ``old`` (unique), and for
    those, their index in ``old`` -- a sorted search, no dense marks."""
    order = torch.argsort(old)
    ranked = old[order]
    pos = torch.searchsorted(ranked, lin).clamp(max=max(old.numel() - 1, 0))
    hit = ranked[pos] == lin if old.numel() else torch.zeros(lin.numel(), dtype=torch.bool)
    return order[pos[hit]], hit


def values_at(x: SparseTensor, lin: torch.Tensor) -> torch.Tensor:
    """``x``'s values at the linear positions ``lin`` (0 where nothing is stored), dense, 1-d."""
    coords, where = stored(x)
    slot, hit = _find_linear(ravel_coords(coords, x._shape, coords.shape[1]), lin)
    out = torch.zeros(lin.numel(), dtype=x.dtype)
    out[hit] = x._vals[where[slot]]
    return out


def mask_points(mask, shape) -> torch.Tensor | None:
    """The coordinates (``ndim x k``, unique, in storage order) where ``mask`` -- a bool SparseTensor
    of exactly ``shape`` -- is True: its stored True entries (the dense shape never made); None for
    any other mask (a dense one, or one that broadcasts)."""
    if not isinstance(mask, SparseTensor) or mask.dtype != torch.bool or tuple(mask._shape) != tuple(shape):
        return None
    coords, where = stored(mask)
    return coords[:, mask._vals[where]]


def stored_hits(x: SparseTensor, at: torch.Tensor) -> tuple:
    """``(where, hit)``: the positions of ``x``'s stored entries in its values array (:func:`stored`)
    and, per entry, whether its coordinate is among ``at`` (``ndim x k``)."""
    coords, where = stored(x)
    return where, torch.isin(ravel_coords(coords, x._shape, coords.shape[1]), ravel_coords(at, x._shape, at.shape[1]))


def _set_points(x: SparseTensor, at: torch.Tensor, value) -> None:
    """``x`` takes the scalar ``value`` at the coordinates ``at``: the stored ones in place; a
    nonzero (or NaN) at ones ``x`` does not store joins the pattern (:func:`store_at`)."""
    value = fill_scalar(value, x.dtype)
    where, hit = stored_hits(x, at)
    if int(hit.sum()) < at.shape[1] and value != 0:   # (NaN too)
        store_at(x, at, _scalars(value, x.dtype, at.shape[1]), "setitem")
        return
    x._vals[where[hit]] = value
    torch.autograd.graph.increment_version(x)


def fill_scalar(value, dtype):
    """A scalar written into values of ``dtype``: a 0-d tensor's item, cast as torch's writes cast it
    (``fill_``'s checks: 300 into int8, 1e40 into float32 or 1+2j into a real type raise)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    return torch.empty((), dtype=dtype).fill_(value).item()


def _scalars(value, dtype, k: int) -> torch.Tensor:
    """``k`` copies of the scalar ``value`` written into values of ``dtype`` (:func:`fill_scalar`; a
    Python float never passes through the default dtype: 0.1 into float64 stays 0.1)."""
    return torch.full((k,), fill_scalar(value, dtype), dtype=dtype)


def _densified(t, what: str):
    """``t``'s dense copy when it is a SparseTensor (size-checked), else ``t``."""
    if not isinstance(t, SparseTensor):
        return t
    check_dense_size(f"{what} is used densely, and", [t])
    return t.to_dense()


def _check_store_size(x: SparseTensor, k: int, name: str) -> None:
    limit = config.dense_fallback_max_bytes
    if limit is not None and k * (8 * len(x._shape) + x._vals.element_size()) > limit:
        raise NotSupportedError(f"{name}: writing {k} positions the SparseTensor does not all store would add "
                                f"them to its pattern, over scorch.config.dense_fallback_max_bytes = "
                                f"{limit / 2**30:.1f} GiB; use x.to_dense() if you mean it, or raise the limit")


def store_at(x: SparseTensor, at: torch.Tensor, values: torch.Tensor, name: str) -> None:
    """Write ``values`` at the coordinates ``at`` (``ndim x k``, unique) of ``x`` where some land on
    positions ``x`` does not store: ``x`` takes new storage (in its format and index width) holding
    its stored entries, explicit zeros too, and the written ones -- a written 0 only where one
    was stored.  The selection's size, not the dense shape's, bounds the work."""
    _check_store_size(x, at.shape[1], name)
    coords, where = stored(x)
    old = ravel_coords(coords, x._shape, coords.shape[1])
    new = ravel_coords(at, x._shape, at.shape[1])
    values = values.to(x.dtype)
    keep = (values != 0) | values.isnan() | torch.isin(new, old)
    ids = torch.cat([old, new[keep]])
    uniq, inverse = torch.unique(ids, return_inverse=True)
    last = torch.full((uniq.numel(),), -1, dtype=_I64).scatter_reduce(   # a written value wins over a stored one
        0, inverse, torch.arange(ids.numel(), dtype=_I64), "amax")
    every = torch.cat([coords, at[:, keep]], 1)[:, last]
    x._restore(rebuild(x._format, x._shape, every, torch.cat([x._vals[where], values[keep]])[last], x.index_dtype))
    torch.autograd.graph.increment_version(x)


def _basic_items(key, ndim: int):
    """The key as one ``("int" | "slice", value)`` item per dim when it holds only ints, slices
    with a positive step and at most one Ellipsis; else None."""
    keys = key if isinstance(key, tuple) else (key,)
    if not all(k is Ellipsis or isinstance(k, slice) or (isinstance(k, int) and not isinstance(k, bool))
               for k in keys) or sum(k is Ellipsis for k in keys) > 1:
        return None
    if any(isinstance(k, slice) and k.step is not None and k.step <= 0 for k in keys):
        return None
    items = [("slice", k) if isinstance(k, slice) else ("int", k) for k in keys if k is not Ellipsis]
    if len(items) > ndim:
        return None
    at = next((i for i, k in enumerate(keys) if k is Ellipsis), len(keys))
    fill = [("slice", slice(None))] * (ndim - len(items))
    return items[:at] + fill + items[at:]


def refuse_grad(op: str, x: SparseTensor, *values) -> None:
    """An in-place write into ``x`` is not recorded by autograd: refused in grad mode when ``x`` or a
    written tensor requires grad (as :func:`setitem` refuses it); and into a copy that torch would
    make a view (``x.real``: :func:`~scorch._dispatch.check_write`)."""
    check_write(op, x)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, *values)):
        raise NotSupportedError(f"{op}: writing into a SparseTensor that requires grad, or a value that does, is "
                                "not recorded by autograd; write under torch.no_grad() (a parameter update), or "
                                "build a new tensor (torch.where, x.with_values)")


@implements(torch.Tensor.index_put_)
def index_put_(x, indices, values, accumulate=False):
    """``x.index_put_(indices, v)`` is ``x[indices] = v`` (:func:`setitem`); with ``accumulate``
    the selected positions add ``v`` (summed where an index repeats, as torch sums): the selected
    positions' coordinates only (:func:`key_points`), a nonzero sum at an absent one joining the pattern."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.index_put_, x, indices, values, accumulate)
    key = tuple(indices)
    if isinstance(values, torch.Tensor) and values.dtype != x.dtype:   # (setitem casts; index_put_ does not)
        raise ScorchTypeError(f"index_put_: values must have the tensor's dtype {x.dtype} (index put requires the "
                              f"source and destination dtypes match, as torch's), got {values.dtype}")
    if not accumulate:
        setitem(x, key, values)
        return x
    refuse_grad("index_put_", x, values)
    key = tuple(map(lambda k: _densified(k, "index_put_: a sparse index"), key))
    lin, shape = key_points(x, key, "index_put_")
    values = _densified(values, "index_put_: a sparse value")
    write_points(x, lin, broadcast_value(values, shape, x.dtype, "index_put_"), "index_put_", accumulate=True)
    return x


@implements(torch.index_put, torch.Tensor.index_put)
def index_put(x, indices, values, accumulate=False):
    """Out of place: see :func:`_written_copy`."""
    return _written_copy(index_put_, torch.index_put, x, indices, values, accumulate)


def _written_copy(in_place, dense_op, x, *args):
    """The out-of-place form of a write (``index_put``, ``index_fill``): ``in_place`` on a copy of
    ``x`` -- a SparseTensor in its pattern -- where the writes land on stored positions (or are 0);
    else (a write to an absent position, dense by definition; or under autograd) torch's
    ``dense_op`` on the dense value."""
    if isinstance(x, SparseTensor) and not (torch.is_grad_enabled() and x.requires_grad):
        try:
            return in_place(x.clone(), *args)
        except NotSupportedError:
            pass
    return _dense_call(dense_op, x, *args)


def _long_index(index, x: SparseTensor, d: int, op: str, *, wrap: bool) -> torch.Tensor:
    """``index`` as torch's ``index_fill_`` / ``index_copy_`` take it: an int64 tensor of at most 1 dim,
    in range of ``x``'s dim ``d`` (negatives wrapping when ``wrap``); 1-d.  (None is out of range in a
    zero-size ``x``: torch writes nothing there, whatever the index.)"""
    if not isinstance(index, torch.Tensor) or isinstance(index, SparseTensor) or index.dtype != _I64:
        got = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        raise ScorchIndexError(f"{op}: index must be an int64 tensor (Expected dtype int64 for index), got {got}")
    if index.dim() > 1:
        raise ScorchValueError(f"{op}: index has to be a vector or a scalar, got shape {tuple(index.shape)}")
    index, size = index.reshape(-1), x._shape[d]
    lo = -size if wrap else 0
    bad = (index < lo) | (index >= size)
    if x.numel() and bool(bad.any()):
        raise ScorchIndexError(f"{op}: index {int(index[bad][0])} is out of bounds for dimension {d} with size {size}")
    return index % size if size else index


@implements(torch.Tensor.index_fill_)
def index_fill_(x, dim, index, value):
    """``x.index_fill_(dim, index, v)`` is ``x[..., index, ...] = v`` (:func:`setitem`); a 0 only
    touches the stored entries of those slices (no position of a slice is made)."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.index_fill_, x, dim, index, value)
    d = _dim(dim, x.dim(), "index_fill_")
    index = _long_index(index, x, d, "index_fill_", wrap=True)
    if isinstance(value, torch.Tensor) and value.dim():
        raise ScorchValueError(f"index_fill_: value must be a number or a 0-d tensor, got shape {tuple(value.shape)}")
    refuse_grad("index_fill_", x, value)
    if x.numel() == 0:   # (torch writes nothing, whatever the index)
        return x
    v = fill_scalar(value, x.dtype)
    if v == 0:   # only stored entries change: the slices' positions are never listed
        coords, where = stored(x)
        x._vals[where[torch.isin(coords[d], index)]] = v
        torch.autograd.graph.increment_version(x)
        return x
    lin, _ = key_points(x, (slice(None),) * d + (index,), "index_fill_")   # (whole slices: maybe a size error)
    write_points(x, lin, _scalars(v, x.dtype, lin.numel()), "index_fill_")
    return x


@implements(torch.index_fill, torch.Tensor.index_fill)
def index_fill(x, dim, index, value):
    """Out of place: see :func:`_written_copy`."""
    return _written_copy(index_fill_, torch.index_fill, x, dim, index, value)


@implements(torch.Tensor.fill_diagonal_)
def fill_diagonal_(x, fill_value, wrap=False):
    """``x.fill_diagonal_(v)``: the positions (i, i, ...) take ``v`` through :func:`setitem` (a
    stored position takes it; an absent one only 0).  (Its torch form writes into a diagonal
    view, which for a SparseTensor is a copy: the write was lost.)"""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.fill_diagonal_, x, fill_value, wrap)
    n = x.dim()
    if n < 2 or (n > 2 and len(set(x._shape)) != 1):
        raise ScorchValueError(f"fill_diagonal_: needs 2 dims, or more of equal size, got shape {tuple(x.shape)}")
    if n == 2 and wrap and x._shape[0] > x._shape[1]:   # tall: the diagonal starts again below a blank row
        rows, cols = x._shape
        flat = torch.arange(0, rows * cols, cols + 1, dtype=_I64)
        key = (flat // cols, flat % cols)
    else:
        key = (torch.arange(min(x._shape), dtype=_I64),) * n
    setitem(x, key, fill_value)
    return x


def _same_dtype(x: SparseTensor, source, op: str) -> None:
    if source.dtype != x.dtype:
        raise ScorchTypeError(f"{op}: self and source expected to have the same dtype (as torch requires), got "
                              f"{x.dtype} and {source.dtype}")


@implements(torch.Tensor.index_copy_)
def index_copy_(x, dim, index, source):
    """``x.index_copy_(dim, index, s)`` is ``x[..., index, ...] = s`` (:func:`setitem`): the stored
    positions take ``s``'s values, its nonzeros elsewhere join the pattern."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.index_copy_, x, dim, index, source)
    refuse_grad("index_copy_", x, source)
    source = _densified(source, "index_copy_: a sparse source")
    if not isinstance(source, torch.Tensor):
        raise ScorchTypeError(f"index_copy_: source must be a tensor, got {type(source).__name__}")
    d = _dim(dim, x.dim(), "index_copy_")
    index = _long_index(index, x, d, "index_copy_", wrap=False)
    _same_dtype(x, source, "index_copy_")
    torch.empty(x._shape, dtype=x.dtype, device="meta").index_copy_(d, index.to("meta"), source.to("meta"))
    if x.numel():
        setitem(x, (slice(None),) * d + (index,), source)
    return x


@implements(torch.Tensor.put_)
def put_(x, index, source, accumulate=False):
    """``x.put_(index, s)``: ``s`` written at the flat (row-major) positions ``index`` (negatives
    wrap), added with ``accumulate`` -- :func:`write_points` on those positions."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.put_, x, index, source, accumulate)
    refuse_grad("put_", x, source)
    source = _densified(source, "put_: a sparse source")
    if not isinstance(index, torch.Tensor) or isinstance(index, SparseTensor) or index.dtype != _I64:
        raise ScorchTypeError(f"put_: index must be an int64 tensor, got "
                              f"{getattr(index, 'dtype', type(index).__name__)}")
    if not isinstance(source, torch.Tensor) or source.numel() != index.numel():
        raise ScorchIndexError(f"put_: source must be a tensor with one element per index ({index.numel()}), got "
                               f"{source.numel() if isinstance(source, torch.Tensor) else type(source).__name__}")
    _same_dtype(x, source, "put_")
    n = x.numel()
    lin = index.reshape(-1)
    bad = (lin < -n) | (lin >= n)
    if bool(bad.any()):
        raise ScorchIndexError(f"put_: index {int(lin[bad][0])} is out of range for a tensor of {n} elements "
                               f"(expected [{-n}, {n - 1}])")
    _check_linear(x._shape)
    write_points(x, torch.where(lin < 0, lin + n, lin), source.reshape(-1), "put_", accumulate=bool(accumulate))
    return x


@implements(torch.Tensor.masked_scatter_)
def masked_scatter_(x, mask, source):
    """``x.masked_scatter_(mask, s)``: the positions where ``mask`` (broadcast to ``x``) is True take
    ``s``'s first elements in row-major order -- :func:`write_points` on those positions."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.masked_scatter_, x, mask, source)
    refuse_grad("masked_scatter_", x, source)
    source = _densified(source, "masked_scatter_: a sparse source")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ScorchTypeError(f"masked_scatter_: mask must be a bool tensor (torch only supports boolean masks), got "
                              f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if not isinstance(source, torch.Tensor):
        raise ScorchTypeError(f"masked_scatter_: source must be a tensor, got {type(source).__name__}")
    _same_dtype(x, source, "masked_scatter_")
    at = mask_points(mask, x._shape)
    if at is None:   # a dense mask (or one that broadcasts): its True positions, each dim's coordinates
        mask = _densified(mask, "masked_scatter_: a sparse mask that broadcasts")
        if broadcast_shapes(tuple(mask.shape), x._shape) != x._shape:
            raise ScorchValueError(f"masked_scatter_: mask of shape {tuple(mask.shape)} does not broadcast to self's "
                                   f"shape {x._shape}")
        lin, _ = key_points(x, mask.expand(x._shape), "masked_scatter_")
    else:
        lin = torch.sort(ravel_coords(at, x._shape, at.shape[1])).values   # (row-major: torch's order)
    if source.numel() < lin.numel():
        raise ScorchValueError(f"masked_scatter_: source has {source.numel()} elements, fewer than the mask's "
                               f"{lin.numel()} True positions")
    write_points(x, lin, source.reshape(-1)[:lin.numel()], "masked_scatter_")
    return x

def store_zeros_at(x: SparseTensor, at: torch.Tensor, name: str) -> None:
    """Store explicit zeros at the coordinates ``at`` (``ndim x k``, unique) that ``x`` does not
    store (the others keep their values): the pattern an in-place op about to write there needs."""
    coords, where = stored(x)
    absent = ~torch.isin(ravel_coords(at, x._shape, at.shape[1]), ravel_coords(coords, x._shape, coords.shape[1]))
    at = at[:, absent]
    _check_store_size(x, at.shape[1], name)
    values = torch.cat([x._vals[where], torch.zeros(at.shape[1], dtype=x.dtype)])
    x._restore(rebuild(x._format, x._shape, torch.cat([coords, at], 1), values, x.index_dtype))
    torch.autograd.graph.increment_version(x)
