"""Shape operations on SparseTensors, done on coordinates.

This module owns every op that moves entries to new coordinates without
changing their values: ``reshape`` / ``view`` / ``flatten`` / ``unflatten`` /
``ravel`` / ``squeeze`` / ``unsqueeze`` (linearise, then unravel),
``index_select`` / ``select`` / ``narrow`` / ``x[...]`` (filter and renumber one
dim at a time) and ``cat`` / ``stack`` (offset and concatenate).  Each op takes
the stored entries (:func:`entries`: coordinates and positions in
``x.values()``), computes their new coordinates with vectorised torch ops and
builds the result with :func:`scorch.convert.build` (:func:`assemble`);
nothing is densified.  These helpers, :func:`ravel_coords` and
:func:`unravel_coords` are shared with :mod:`scorch.ops.rearrange`.

Result layout (:func:`result_format`): the input's own format when the number
of dims is unchanged (and a block split still divides the new shape), else
the input's format *name* adapted to the new number of dims (``csr`` stays
``csr``), else ``coo``; the index dtype is the input's, widened to int64 only
when int32 cannot hold the new shape.  Stored entries stay stored (explicit
zeros included).  An op whose torch result is 0-d (``x[i]`` on a 1-d tensor,
squeezing a ``(1,)`` tensor) returns a dense 0-d tensor: sparse tensors need
at least one dim.

The reshape family (``view`` / ``reshape`` / ``flatten`` / ``unsqueeze`` /
``squeeze``) rebuilds the index arrays but keeps the values array itself where
the new storage holds the entries in the same order (CSR <-> 1-d, a size-1 dim
added or dropped): a write into the stored values through such a view reaches
the original, as a torch view's does; a write that changes the pattern, or a
view whose storage reorders the entries, does not.  The ops are differentiable w.r.t. the stored values
(and the dense operands of ``cat`` / ``stack``): each result value is a gather
of source values.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import warnings

import torch

from .. import convert
from .._dispatch import accepts_out, check_dense_size, implements, leaves, write_out
from ..errors import NotSupportedError, ScorchIndexError, ScorchTypeError, ScorchValueError
from ..format import Format, preset
from ..interop import as_sparse, position_entries
from ..tensor import SparseTensor

__all__ = [
    "reshape", "view", "flatten", "unflatten", "ravel", "squeeze", "unsqueeze",
    "index_select", "select", "narrow", "getitem", "cat", "stack",
    "result_format", "rebuild", "assemble", "entries", "ravel_coords", "unravel_coords", "ScorchIndexError",
]

_I64 = torch.int64
_MAX_LINEAR = 2**63


# ================================================================ result assembly

def result_format(fmt: Format, shape) -> Format:
    """The format of an op's result of ``shape`` computed from an input in ``fmt``."""
    n = len(shape)
    if fmt.ndim == n and (not fmt.block or all(s % b == 0 for s, b in zip(shape, fmt.block))):
        return fmt
    name = None if fmt.block else fmt.name
    try:
        return preset(name, n) if name else preset("coo", n)
    except ScorchValueError:  # e.g. csc for a 1-d result
        return preset("coo", n)


def rebuild(fmt: Format, shape, coords: torch.Tensor, vals: torch.Tensor, index_dtype=None):
    """A SparseTensor of ``shape`` holding ``vals`` at ``coords`` (``ndim x nnz`` int64,
    in range) in :func:`result_format` of ``fmt``; a dense 0-d tensor when ``shape == ()``."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        out = torch.zeros(1, dtype=vals.dtype, device=vals.device)
        return out.index_add_(0, torch.zeros(vals.numel(), dtype=_I64), vals).reshape(())
    out_fmt = result_format(fmt, shape)
    if position_entries(out_fmt, shape) > max(1 << 24, 64 * coords.shape[1]):
        # CSR-like dense outer dims of a huge shape (unsqueeze(-1) of a 10^5 x 10^5 CSR: a position per outer
        # coordinate, 10^10 of them, for the few entries there are): COO keeps only what is there
        out_fmt = preset("coo", len(shape))
    try:
        (pos, crd), values = convert.build(out_fmt, shape, coords, vals, index_dtype)
    except ScorchValueError:  # int32 cannot hold the new shape: widen rather than fail
        (pos, crd), values = convert.build(out_fmt, shape, coords, vals, None)
    return SparseTensor(out_fmt, shape, pos, crd, values)


def entries(x: SparseTensor):
    """``(coords, ids)``: the coordinates of ``x``'s stored entries (``ndim x nnz`` int64)
    and each one's position in ``x.values()``."""
    return convert.coords_of(x._format, x._shape, x._pos, x._crd, torch.arange(x._vals.numel()))


def assemble(fmt: Format, shape, coords, ids, source: torch.Tensor, index_dtype=None):
    """:func:`rebuild` holding ``source[ids]`` at ``coords``; differentiable w.r.t. ``source``
    (then the result's pattern is built from ``ids`` and its values gathered afterwards)."""
    if not (source.requires_grad and torch.is_grad_enabled()):
        return rebuild(fmt, shape, coords, source[ids], index_dtype)
    if not tuple(shape):
        return source[ids].sum()
    return take_positions(rebuild(fmt, shape, coords, ids + 1, index_dtype), source)


def take_positions(pattern: SparseTensor, source: torch.Tensor) -> SparseTensor:
    """``pattern`` holding, at each stored entry, ``source[p - 1]`` for the position ``p`` it holds
    (0: a padding slot, which gets 0); differentiable w.r.t. ``source``."""
    padded = torch.cat([source.new_zeros(1), source])
    return pattern.with_values(padded[pattern._vals.long()])


def _rebuild_like(x: SparseTensor, shape, coords, ids):
    return assemble(x._format, shape, coords, ids, x.values(), x.index_dtype)


def _view_like(x: SparseTensor, shape, coords, ids):
    """A reshape-family result of ``x`` (entries ``ids`` at ``coords`` of ``shape``): on ``x``'s
    own values array when the new storage keeps their order -- writes into the stored values
    reach ``x``, as a torch view's do -- else on gathered values, as :func:`_rebuild_like`."""
    n = ids.numel()
    if not shape or x._stored != x._vals.numel() or n != x._stored:   # (0-d, or ELL's unused slots)
        return _rebuild_like(x, shape, coords, ids)
    pattern = rebuild(x._format, shape, coords, ids + 1, x.index_dtype)   # each entry's position + 1
    if pattern._vals.numel() == n and bool((pattern._vals == torch.arange(1, n + 1)).all()):
        out = x._on_values_of(pattern)   # (a write adding entries to it reaches a leaf x too)
        if isinstance(out, SparseTensor) and out._vals.data_ptr() == x._vals.data_ptr():
            out._alias_of(x, back=_reshaped_back)
        return out
    return take_positions(pattern, x.values())


def _reshaped_back(new: SparseTensor, source: SparseTensor) -> SparseTensor:
    """A reshape view's new storage in its source's shape and format (:meth:`SparseTensor._restore`)."""
    return _reshape(new, source._shape, "reshape").asformat(source._format, index_dtype=source.index_dtype)


def _alias(x: SparseTensor) -> SparseTensor:
    """A new SparseTensor on ``x``'s storage (kept in the autograd graph); a write that changes its
    pattern reaches a leaf ``x`` too (``w.view_as(q).copy_(q)``: ``nn.init.orthogonal_``)."""
    return x._on_values_of(x)._alias_of(x)


def ravel_coords(rows, sizes, nnz: int) -> torch.Tensor:
    """Row-major linear index of coordinate ``rows`` in a box of ``sizes``."""
    _check_linear(sizes)
    lin = torch.zeros(nnz, dtype=_I64)
    for r, s in zip(rows, sizes):
        lin = lin * s + r
    return lin


def unravel_coords(lin: torch.Tensor, sizes) -> list:
    """The coordinate rows of linear indices ``lin`` in a box of ``sizes`` (inverse of ravel)."""
    rows = []
    for s in reversed(sizes[1:]):
        rows.append(lin % s if s else lin)
        lin = torch.div(lin, s, rounding_mode="floor") if s else lin
    rows.append(lin)
    return rows[::-1] if sizes else []


def _check_linear(sizes) -> None:
    if math.prod(sizes) >= _MAX_LINEAR:
        raise NotSupportedError(
            f"shape {tuple(sizes)} has {math.prod(sizes)} elements, too many to linearise with int64 "
            "coordinates; reshape fewer dims at a time")


def _stack_rows(rows, nnz: int) -> torch.Tensor:
    return torch.stack(list(rows)) if rows else torch.zeros((0, nnz), dtype=_I64)


def along(shape, d: int) -> torch.Tensor:
    """The ``d``-th coordinate of every element of a tensor of ``shape`` (a stride-0 arange: indexing
    it materialises the selected elements only)."""
    return torch.arange(shape[d], dtype=_I64).reshape([-1 if e == d else 1 for e in range(len(shape))]).expand(shape)


def _dense_call(func, *args, **kwargs):
    """Run ``func`` on densified arguments (a SparseTensor met in an unsupported role)."""
    check_dense_size(f"{getattr(func, '__name__', func)} meets a SparseTensor where it has no sparse form, and",
                     leaves(args, kwargs))
    conv = lambda a: a.to_dense() if isinstance(a, SparseTensor) else a  # noqa: E731
    args = [type(a)(map(conv, a)) if isinstance(a, (list, tuple)) else conv(a) for a in args]
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **{k: conv(v) for k, v in kwargs.items()})


# ================================================================ argument checks

def _int(v, op: str, arg: str) -> int:
    if isinstance(v, bool):
        raise ScorchTypeError(f"{op}: {arg} must be an int, got bool {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ScorchTypeError(f"{op}: {arg} must be an int, got {type(v).__name__} {v!r}") from None


def _dim(d, n: int, op: str, arg: str = "dim") -> int:
    """``d`` wrapped into ``[0, n)``."""
    d = _int(d, op, arg)
    if not -n <= d < n:
        raise ScorchIndexError(f"{op}: {arg}={d} is out of range for a {n}-d tensor (expected [{-n}, {n - 1}])")
    return d % n


def _one_or_many(op: str, name: str, args: tuple, kwargs: dict):
    """The argument ``name`` given as torch's varargs (``x.flip(0, 1)``), one positional value or a
    keyword (``dims=``)."""
    if set(kwargs) - {name} or (args and kwargs):
        raise ScorchTypeError(f"{op}() got unexpected arguments {tuple(args)} {sorted(kwargs)}; expected {name}")
    if kwargs:
        return kwargs[name]
    if not args:
        raise ScorchTypeError(f"{op}() missing the argument {name!r}")
    return args[0] if len(args) == 1 else args


def _sizes(args, op: str) -> list:
    """``(2, 3)``, ``((2, 3),)`` or ``(torch.Size([2, 3]),)`` -> ``[2, 3]``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = args[0]
    return [_int(s, op, "shape") for s in args]


def _infer(shape: list, numel: int, in_shape: tuple, op: str) -> tuple:
    """``shape`` with its (at most one) -1 filled in; checks the element count."""
    free = [i for i, s in enumerate(shape) if s == -1]
    if len(free) > 1 or any(s < -1 for s in shape):
        raise ScorchValueError(
            f"{op}: shape {tuple(shape)} is invalid: sizes must be >= 0 with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if free:
        if known == 0 or numel % known:
            raise ScorchValueError(
                f"{op}: cannot infer the -1 in shape {tuple(shape)} for an input of shape {in_shape} "
                f"({numel} elements): expected the other sizes to divide {numel}, their product is {known}")
        shape = shape[:free[0]] + [numel // known] + shape[free[0] + 1:]
    elif known != numel:
        raise ScorchValueError(
            f"{op}: shape {tuple(shape)} has {known} elements, expected {numel} "
            f"(the number of elements of the input, shape {in_shape})")
    return tuple(shape)


# ================================================================ reshape family

def _reshape(x: SparseTensor, shape: tuple, op: str):
    shape = _infer(list(shape), math.prod(x._shape), x._shape, op)
    if shape == x._shape:
        return _alias(x)
    coords, ids = entries(x)
    lin = ravel_coords(coords, x._shape, ids.numel())  # same numel: fits the new shape too
    return _view_like(x, shape, _stack_rows(unravel_coords(lin, shape), ids.numel()), ids)


@implements(torch.reshape)
def reshape(input, shape):
    """``torch.reshape`` by re-coordinating the stored entries (-1 is inferred)."""
    return _reshape(input, _sizes((shape,), "reshape"), "reshape")


@implements(torch.Tensor.reshape)
def _reshape_method(self, *shape, **kwargs):
    return _reshape(self, _sizes(shape or (kwargs.get("shape"),), "reshape"), "reshape")


@implements(torch.Tensor.view)
def view(self, *shape, size=None, dtype=None):
    """``x.view(shape)``: as reshape, on ``x``'s values where the new storage keeps their order
    (see the module docstring); where it does not, a copy that refuses in-place writes (torch's
    view would pass them on to ``x``: ``nn.init`` fills a weight through ``w.view_as(q).copy_(q)``)."""
    shape = shape or ((size if size is not None else dtype),)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NotSupportedError(
            f"view(dtype={shape[0]}): reinterpreting a SparseTensor's bits is not supported; "
            "use x.to(dtype) to convert the values, or x.to_dense().view(dtype)")
    return _as_view(self, _reshape(self, _sizes(shape, "view"), "view"), "view")


def _as_view(x: SparseTensor, out, op: str):
    """``out``, a result torch makes a view of ``x`` (view, unsqueeze, squeeze): marked, when it is a
    copy (its storage orders or pads the entries otherwise), so that in-place writes into it raise
    instead of being lost (:func:`scorch._dispatch.check_write`)."""
    if isinstance(out, SparseTensor) and x._vals.numel() and out._vals.data_ptr() != x._vals.data_ptr():
        out._copy_note = (f"x.{op}(...) of this {x._format.name or 'user-format'} SparseTensor is a copy, not a view "
                          "(its storage orders the entries otherwise); reshape it, or convert x to a row-major "
                          "format (coo, csr, csf) first")
    return out


@implements(torch.flatten, torch.Tensor.flatten)
def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims ``start_dim..end_dim`` (inclusive) into one."""
    n = input.dim()
    a, b = _dim(start_dim, n, "flatten", "start_dim"), _dim(end_dim, n, "flatten", "end_dim")
    if a > b:
        raise ScorchValueError(f"flatten: start_dim={start_dim} comes after end_dim={end_dim} for a {n}-d tensor")
    shape = input._shape
    return _reshape(input, shape[:a] + (math.prod(shape[a:b + 1]),) + shape[b + 1:], "flatten")


@implements(torch.ravel, torch.Tensor.ravel)
def ravel(input):
    return flatten(input)


@implements(torch.unflatten, torch.Tensor.unflatten)
def unflatten(input, dim, sizes):
    """Split dim ``dim`` into ``sizes`` (one of them may be -1)."""
    d, shape = _dim(dim, input.dim(), "unflatten"), input._shape
    part = _infer(_sizes((sizes,), "unflatten"), shape[d], (shape[d],), "unflatten")
    return _as_view(input, _reshape(input, shape[:d] + part + shape[d + 1:], "unflatten"), "unflatten")


@implements(torch.Tensor.view_as)
def view_as(self, other):
    """``x.view_as(y)``: :func:`view` to ``y``'s shape (through aten's view it skipped the copy's
    guard: ``nn.init.orthogonal_``'s ``w.view_as(q).copy_(q)`` of a CSC weight was lost)."""
    return view(self, tuple(other.shape))


@implements(torch.unsqueeze, torch.Tensor.unsqueeze)
def unsqueeze(input, dim):
    """Insert a size-1 dim at ``dim`` (in ``[-ndim-1, ndim]``)."""
    d = _dim(dim, input.dim() + 1, "unsqueeze")
    coords, ids = entries(input)
    coords = torch.cat([coords[:d], torch.zeros((1, ids.numel()), dtype=_I64), coords[d:]])
    return _as_view(input, _view_like(input, input._shape[:d] + (1,) + input._shape[d:], coords, ids), "unsqueeze")


@implements(torch.squeeze, torch.Tensor.squeeze)
def squeeze(input, dim=None):
    """Drop size-1 dims: all of them, or those among ``dim`` (an int or a tuple)."""
    n = input.dim()
    if dim is None:
        dims = range(n)
    else:
        dims = {_dim(d, n, "squeeze") for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    drop = {d for d in dims if input._shape[d] == 1}
    if not drop:
        return _alias(input)
    keep = [d for d in range(n) if d not in drop]
    coords, ids = entries(input)
    return _as_view(input, _view_like(input, tuple(input._shape[d] for d in keep), coords[keep], ids), "squeeze")


# ================================================================ indexing

def _index_tensor(index, size: int, op: str, *, negative: bool) -> torch.Tensor:
    """A 1-d int64 index into a dim of ``size``, checked (negatives wrap when allowed)."""
    if isinstance(index, SparseTensor):
        index = index.to_dense()
    t = index if isinstance(index, torch.Tensor) else torch.as_tensor(index)
    if t.numel() == 0 and not isinstance(index, torch.Tensor):
        t = t.to(_I64)  # [] has no dtype to check
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise ScorchTypeError(f"{op}: index must be an integer tensor, got dtype {t.dtype}")
    if t.dim() > 1:
        raise ScorchValueError(f"{op}: index must be 0-d or 1-d, got shape {tuple(t.shape)}")
    t = t.reshape(-1).to(_I64)
    lo = -size if negative else 0
    if t.numel() and (int(t.min()) < lo or int(t.max()) >= size):
        bad = int(t.min()) if int(t.min()) < lo else int(t.max())
        raise ScorchIndexError(f"{op}: index {bad} is out of range for a dim of size {size} "
                               f"(expected [{lo}, {size - 1}])")
    return torch.where(t < 0, t + size, t)


def _take(coords, ids, d: int, index: torch.Tensor):
    """Entries of ``index_select(d, index)``: an entry at coordinate c along ``d`` appears
    once per position j with ``index[j] == c``, at coordinate j."""
    order = torch.argsort(index, stable=True)
    sidx = index[order]
    c = coords[d].contiguous()
    lo = torch.searchsorted(sidx, c, side="left")
    counts = torch.searchsorted(sidx, c, side="right") - lo
    entry = torch.repeat_interleave(torch.arange(ids.numel()), counts)
    coords = coords[:, entry]
    coords[d] = order[convert._ranges(lo, counts)]
    return coords, ids[entry]


def _keep(coords, ids, mask):
    return coords[:, mask], ids[mask]


def _slice_entries(coords, ids, d: int, s: slice, size: int):
    """Entries of ``x[..., s, ...]`` along ``d``; returns them and the new size."""
    start, stop, step = s.indices(size)
    if step <= 0:
        raise ScorchValueError(f"indexing: slice step must be positive (as in torch), got {s.step}")
    n = len(range(start, stop, step))
    if (start, n, step) == (0, size, 1):
        return coords, ids, size
    c = coords[d]
    coords, ids = _keep(coords, ids, (c >= start) & (c < stop) & ((c - start) % step == 0))
    coords[d] = torch.div(coords[d] - start, step, rounding_mode="floor")
    return coords, ids, n


@implements(torch.index_select, torch.Tensor.index_select)
def index_select(input, dim, index, *, out=None):
    """Entries of ``input`` at positions ``index`` (1-d, repeats allowed) along ``dim``."""
    if not isinstance(input, SparseTensor) or out is not None:
        return _dense_call(torch.index_select, input, dim, index, out=out)
    d = _dim(dim, input.dim(), "index_select")
    idx = _index_tensor(index, input._shape[d], "index_select", negative=False)
    coords, ids = _take(*entries(input), d, idx)
    shape = input._shape[:d] + (idx.numel(),) + input._shape[d + 1:]
    return _rebuild_like(input, shape, coords, ids)


@implements(torch.select, torch.Tensor.select)
def select(input, dim, index):
    """``input`` at position ``index`` of ``dim``, without that dim."""
    d = _dim(dim, input.dim(), "select")
    return getitem(input, (slice(None),) * d + (_int(index, "select", "index"),))


@implements(torch.narrow_copy, torch.Tensor.narrow_copy)
@accepts_out
def narrow_copy(input, dim, start, length):
    return narrow(input, dim, start, length)


@implements(torch.narrow, torch.Tensor.narrow)
def narrow(input, dim, start, length):
    """Positions ``start .. start+length-1`` of ``dim``."""
    d = _dim(dim, input.dim(), "narrow")
    size = input._shape[d]
    start, length = _int(start, "narrow", "start"), _int(length, "narrow", "length")
    start = start + size if start < 0 else start
    if not (0 <= start <= size and 0 <= length <= size - start):
        raise ScorchIndexError(f"narrow: start={start}, length={length} do not fit dim {d} of size {size}")
    return getitem(input, (slice(None),) * d + (slice(start, start + length),))


# --------------------------------------------------------------- x[key]

def _unsupported_key(key, why: str):
    return NotSupportedError(
        f"indexing a SparseTensor with {key!r}: {why}; supported: ints, slices with a positive step, "
        "None, ..., one 1-d integer tensor/list, integer tensors or bool masks on the leading dims; use "
        "x.to_dense()[...] instead")


def _numpy_as_tensors(key):
    """A key's numpy arrays as tensors (torch indexes with them as with its own)."""
    if isinstance(key, tuple):
        return tuple(map(_numpy_as_tensors, key))
    return torch.as_tensor(key) if type(key).__module__ == "numpy" and hasattr(key, "shape") and key.shape \
        else key


def _classify(item):
    """``(kind, value)`` for one entry of an index tuple."""
    if item is None:
        return "new", None
    if item is Ellipsis:
        return "ellipsis", None
    if isinstance(item, slice):
        return "slice", item
    if isinstance(item, (bool, SparseTensor)):
        return None, None
    if isinstance(item, torch.Tensor):
        if item.dtype in (torch.bool, torch.uint8) or item.dtype.is_floating_point or item.dtype.is_complex:
            return None, None
        return ("int", int(item)) if item.dim() == 0 else ("take", item)
    if isinstance(item, (list, tuple)):
        if all(isinstance(i, int) and not isinstance(i, bool) for i in item):
            return "take", item
        return None, None
    try:
        return "int", operator.index(item)
    except TypeError:
        return None, None


def _parse_key(key, ndim: int) -> list:
    """The key as ``(kind, value)`` items, Ellipsis expanded and trailing dims filled."""
    items = [_classify(k) for k in (key if isinstance(key, tuple) else (key,))]
    if any(kind is None for kind, _ in items):
        raise _unsupported_key(key, "this index form is not supported")
    if sum(kind == "ellipsis" for kind, _ in items) > 1:
        raise ScorchValueError(f"indexing: at most one Ellipsis (...) per index, got {key!r}")
    used = sum(kind in ("int", "slice", "take") for kind, _ in items)
    if used > ndim:
        raise ScorchIndexError(f"indexing: too many indices ({used}) for a {ndim}-d tensor: {key!r}")
    fill = [("slice", slice(None))] * (ndim - used)
    at = next((i for i, (kind, _) in enumerate(items) if kind == "ellipsis"), len(items))
    items = items[:at] + fill + items[at + 1:]
    _check_advanced(items, key)
    return items


def _check_advanced(items, key) -> None:
    """Several tensor indices only on the leading dims, the others whole (:func:`_points`); one
    not separated from the int indices (torch would then move the indexed dim to the front)."""
    takes = [i for i, (kind, _) in enumerate(items) if kind == "take"]
    if len(takes) > 1 or any(torch.as_tensor(items[i][1]).dim() != 1 for i in takes):
        lead = next((i for i, (kind, _) in enumerate(items) if kind not in ("take", "int")), len(items))
        if any(kind != "slice" or v != slice(None) for kind, v in items[lead:]):
            raise _unsupported_key(key, "several tensor indices not on the leading dims (or with other dims "
                                        "sliced); supported: x[i, j] with tensors i, j on the first dims")
    elif takes:
        adv = [i for i, (kind, _) in enumerate(items) if kind in ("int", "take")]
        if adv[-1] - adv[0] + 1 != len(adv):
            raise _unsupported_key(key, "a tensor index separated from an int index")


def _leading_rows(x: SparseTensor, items):
    """``(coords, ids)`` of a 2-d CSR's entries in the rows its key's first item selects (an int, a
    slice of step 1), read off the row starts -- work for those rows, not for every stored entry
    (``for row in A`` was quadratic); None for any other key or format (all entries, then filtered)."""
    fmt = x._format
    if len(x._shape) != 2 or fmt.block or fmt.order != (0, 1) or [lv.kind for lv in fmt.levels] != \
            ["dense", "compressed"]:
        return None
    kind, v = next((item for item in items if item[0] != "new"), ("new", None))
    n = x._shape[0]
    if kind == "int" and isinstance(v, int) and not isinstance(v, bool) and -n <= v < n:
        r0 = v % n
        r1 = r0 + 1
    elif kind == "slice" and v.step in (None, 1):
        r0, r1, _ = v.indices(n)
        r1 = max(r0, r1)
    else:
        return None
    pos = x._pos[1]
    a, b = int(pos[r0]), int(pos[r1])
    counts = (pos[r0 + 1:r1 + 1] - pos[r0:r1]).to(_I64)
    rows = torch.repeat_interleave(torch.arange(r0, r1, dtype=_I64), counts)
    return torch.stack([rows, x._crd[1][a:b].to(_I64)]), torch.arange(a, b, dtype=_I64)


def _index_dim(coords, ids, d: int, kind: str, v, size: int):
    """Apply one index item to dim ``d``: the kept entries and the dim's new size
    (None when an int index removes the dim)."""
    if kind == "slice":
        return _slice_entries(coords, ids, d, v, size)
    idx = _index_tensor(v, size, f"indexing dim {d}", negative=True)
    if kind == "int":
        return *_keep(coords, ids, coords[d] == idx), None
    return *_take(coords, ids, d, idx), idx.numel()


def _masks_as_indices(x: SparseTensor, key):
    """A bool mask key as the integer indices of its True positions (torch's meaning): one over
    the leading dims (``x[mask]``), or 1-d ones in a tuple without None / Ellipsis; a sparse mask
    (``x[x > 0]``) by its stored True entries."""
    def bool_tensor(k):
        return isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.dim()
    if bool_tensor(key):
        if tuple(key.shape) != tuple(x.shape[:key.dim()]):
            raise ScorchIndexError(f"indexing: the mask's shape {tuple(key.shape)} does not match the indexed "
                                   f"tensor's leading dims {tuple(x.shape[:key.dim()])}")
        return key.nonzero(as_tuple=True)
    if isinstance(key, tuple) and any(bool_tensor(k) for k in key) and not any(k is None or k is Ellipsis for k in key):
        out = []
        for d, k in enumerate(key):
            if bool_tensor(k):
                if k.dim() != 1 or d >= x.dim() or k.shape[0] != x.shape[d]:
                    raise ScorchIndexError(f"indexing: mask of shape {tuple(k.shape)} at dim {d} must be 1-d of "
                                           f"the dim's size ({x.shape[d] if d < x.dim() else 'no such dim'})")
                k = k.nonzero().reshape(-1)
            out.append(k)
        return tuple(out)
    return key


def _as_masks(key):
    """A key's masks in torch's other spellings as bool tensors: a list of bools (``x[[True, False]]``)
    and a uint8 tensor (deprecated in torch, which warns and reads it as bool)."""
    out = []
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, list) and k and all(isinstance(i, bool) for i in k):
            k = torch.tensor(k)
        elif isinstance(k, torch.Tensor) and not isinstance(k, SparseTensor) and k.dtype == torch.uint8 and k.dim():
            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool "
                          "instead.", UserWarning, stacklevel=6)   # (the caller's x[mask], past the dispatch)
            k = k.bool()
        out.append(k)
    return tuple(out) if isinstance(key, tuple) else out[0]


def _index_of(v) -> torch.Tensor:
    """An index item as a tensor (``[]``, which has no dtype to read, as an empty int64 one)."""
    t = torch.as_tensor(v)
    return t.to(_I64) if t.numel() == 0 and not isinstance(v, torch.Tensor) else t


def _points(x: SparseTensor, items, key):
    """``x[i, j, ...]`` with tensors (and ints) on the first ``m`` dims, broadcast together: the
    result's leading dims are their broadcast shape, then ``x``'s other dims; dense when ``m``
    covers every dim (as torch gives it), else sparse."""
    m = next((i for i, (kind, _) in enumerate(items) if kind not in ("take", "int")), len(items))
    idx = [_index_of(v) for _, v in items[:m]]
    for t in idx:
        if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
            raise ScorchTypeError(f"indexing: index tensors must hold integers, got dtype {t.dtype}")
    try:
        idx = torch.broadcast_tensors(*idx)
    except RuntimeError:
        raise ScorchIndexError(f"indexing: the index shapes {[tuple(t.shape) for t in idx]} do not broadcast "
                               "together") from None
    lead = tuple(idx[0].shape)
    flat = [_index_tensor(t.reshape(-1), x._shape[d], f"indexing dim {d}", negative=True) for d, t in enumerate(idx)]
    sizes = list(x._shape[:m])
    coords, ids = entries(x)
    keyed = torch.cat([ravel_coords(coords[:m], sizes, ids.numel()).unsqueeze(0), coords[m:]])
    keyed, ids = _take(keyed, ids, 0, ravel_coords(flat, sizes, flat[0].numel()))
    rows = unravel_coords(keyed[0], list(lead)) if lead else []
    out = _rebuild_like(x, lead + tuple(x._shape[m:]), _stack_rows(list(rows) + list(keyed[1:]), ids.numel()), ids)
    return out.to_dense() if m == x.dim() and isinstance(out, SparseTensor) else out


@implements(torch.Tensor.__getitem__)
def getitem(x, key):
    """``x[key]`` for ints, positive-step slices, None, Ellipsis and one 1-d integer index
    tensor/list, on any dims; integer tensors broadcast together or bool masks on the leading
    dims (:func:`_points`); other keys raise NotSupportedError."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.__getitem__, x, key)
    key = _masks_as_indices(x, _as_masks(_numpy_as_tensors(key)))
    items = _parse_key(key, x.dim())
    if sum(kind == "take" for kind, _ in items) > 1 or any(kind == "take" and torch.as_tensor(v).dim() != 1
                                                           for kind, v in items):
        return _points(x, items, key)
    coords, ids = _leading_rows(x, items) or entries(x)
    rows, shape, d = [], [], 0  # rows: the input dim of each output dim (None: a new dim)
    for kind, v in items:
        if kind == "new":
            rows.append(None)
            shape.append(1)
            continue
        coords, ids, n = _index_dim(coords, ids, d, kind, v, x._shape[d])
        if n is not None:
            rows.append(d)
            shape.append(n)
        d += 1
    zeros = torch.zeros(ids.numel(), dtype=_I64)
    out = _stack_rows([zeros if r is None else coords[r] for r in rows], ids.numel())
    return _rebuild_like(x, shape, out, ids)



# ================================================================ cat / stack

def _entries(t, arg: str):
    """``(coords, values)`` of the stored entries of a sparse or dense tensor (values
    differentiable when ``t`` requires grad)."""
    if isinstance(t, SparseTensor):
        coords, ids = entries(t)
        return coords, t.values()[ids]
    if not isinstance(t, torch.Tensor):
        raise ScorchTypeError(f"{arg} must be a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        return as_sparse(t, "coo").coo()
    return dense_entries(t)


def dense_entries(t: torch.Tensor):
    """``(coords, values)`` of a dense tensor's nonzeros -- of every element when it needs a
    gradient (a zero's gradient is not zero); values differentiable."""
    lin = torch.arange(t.numel()) if t.requires_grad and torch.is_grad_enabled() \
        else torch.nonzero(t.reshape(-1)).reshape(-1)
    coords = torch.stack(unravel_coords(lin, list(t.shape))) if t.dim() else torch.zeros((0, lin.numel()), dtype=_I64)
    return coords, t.reshape(-1)[lin]


def _sequence(tensors, op: str) -> list:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise ScorchTypeError(f"{op}: tensors must be a list or tuple of tensors, got {type(tensors).__name__}")
    if not tensors:
        raise ScorchValueError(f"{op}: tensors must be a non-empty list of tensors, got an empty one")
    for k, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ScorchTypeError(f"{op}: tensors[{k}] must be a tensor, got {type(t).__name__}")
        if t.dim() == 0:
            raise ScorchValueError(f"{op}: tensors[{k}] is 0-d; every tensor needs at least 1 dim")
    return list(tensors)


def _common(tensors):
    """(format, dtype, index dtype) of the result: the first SparseTensor's format, the
    promoted dtype and int64 indices if any SparseTensor has them."""
    sparse = [t for t in tensors if isinstance(t, SparseTensor)]
    fmt = sparse[0]._format if sparse else preset("coo", tensors[0].dim())
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    wide = any(t.index_dtype == _I64 for t in sparse)
    return fmt, dtype, _I64 if wide else torch.int32


def _check_cat_shapes(tensors, ref: tuple, d: int) -> None:
    for k, t in enumerate(tensors):
        if t.dim() != len(ref) or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref)) if i != d):
            want = "(" + ", ".join("*" if i == d else str(s) for i, s in enumerate(ref)) + ")"
            raise ScorchValueError(f"cat: tensors[{k}] has shape {tuple(t.shape)}, expected {want} "
                                   f"(the shape of the first tensor except in dim {d})")


@implements(torch.cat, torch.concat, torch.concatenate)
def cat(tensors, dim=0, *, axis=None, out=None):
    """Concatenate along ``dim``; dense tensors among ``tensors`` are sparsified first."""
    if out is not None:   # a dense out= takes the result (a SparseTensor out= one in its pattern)
        return write_out("cat", cat(tensors, dim, axis=axis), out, densify=True)
    dim = dim if axis is None else axis
    tensors = _sequence(tensors, "cat")
    if any(t.dim() != 1 for t in tensors):  # torch skips legacy empty 1-d tensors
        tensors = [t for t in tensors if tuple(t.shape) != (0,)] or tensors[:1]
    ref = tuple(tensors[0].shape)
    d = _dim(dim, len(ref), "cat")
    _check_cat_shapes(tensors, ref, d)
    fmt, dtype, index_dtype = _common(tensors)
    coords, vals, offset = [], [], 0
    for k, t in enumerate(tensors):
        c, v = _entries(t, f"cat: tensors[{k}]")
        c = c.clone()
        c[d] += offset
        coords.append(c)
        vals.append(v.to(dtype))
        offset += t.shape[d]
    shape = ref[:d] + (offset,) + ref[d + 1:]
    vals = torch.cat(vals)
    return assemble(fmt, shape, torch.cat(coords, 1), torch.arange(vals.numel()), vals, index_dtype)


@implements(torch.stack)
def stack(tensors, dim=0, *, out=None):
    """Stack equal-shaped tensors along a new dim ``dim``; dense ones are sparsified first."""
    if out is not None:
        return write_out("stack", stack(tensors, dim), out, densify=True)
    tensors = _sequence(tensors, "stack")
    ref = tuple(tensors[0].shape)
    for k, t in enumerate(tensors):
        if tuple(t.shape) != ref:
            raise ScorchValueError(f"stack: tensors[{k}] has shape {tuple(t.shape)}, expected {ref} "
                                   "(all tensors must have the same shape)")
    d = _dim(dim, len(ref) + 1, "stack")
    fmt, dtype, index_dtype = _common(tensors)
    coords, vals = [], []
    for k, t in enumerate(tensors):
        c, v = _entries(t, f"stack: tensors[{k}]")
        coords.append(torch.cat([c[:d], torch.full((1, v.numel()), k, dtype=_I64), c[d:]]))
        vals.append(v.to(dtype))
    shape = ref[:d] + (len(tensors),) + ref[d:]
    vals = torch.cat(vals)
    return assemble(fmt, shape, torch.cat(coords, 1), torch.arange(vals.numel()), vals, index_dtype)


def _joined(name: str, atleast, dim):
    """torch's ``hstack`` / ``vstack`` / ``dstack`` / ``column_stack``: a :func:`cat` of the tensors
    made at least n-d -- here, not below autograd, so a dense operand that requires grad joins
    with every element (its zeros' gradients) and keeps a dense gradient."""
    def run(tensors, *, out=None):
        if out is not None:
            return write_out(name, run(tensors), out, densify=True)
        tensors = [atleast(t) for t in _sequence(tensors, name)]
        return cat(tensors, dim(tensors))
    run.__name__ = name
    return run


def _column(t):
    return t.reshape(t.numel(), 1) if t.dim() <= 1 else t


for _names, _atleast, _dim_of in (((torch.hstack,), torch.atleast_1d, lambda ts: 0 if ts[0].dim() == 1 else 1),
                                  ((torch.vstack, torch.row_stack), torch.atleast_2d, lambda ts: 0),
                                  ((torch.dstack,), torch.atleast_3d, lambda ts: 2),
                                  ((torch.column_stack,), _column, lambda ts: 1)):
    implements(*_names)(_joined(_names[0].__name__, _atleast, _dim_of))


# ================================================================ triangles

@implements(torch.tril, torch.Tensor.tril)
@accepts_out
def tril(input, diagonal=0):
    """The entries on and below the ``diagonal``-th diagonal of the last two dims (sparse)."""
    return _triangle(input, diagonal, lower=True)


@implements(torch.triu, torch.Tensor.triu)
@accepts_out
def triu(input, diagonal=0):
    return _triangle(input, diagonal, lower=False)


@implements(torch.Tensor.tril_)
def tril_(input, diagonal=0):
    """In place: the entries above the diagonal leave the pattern (the storage is rebuilt)."""
    return _triangle_(input, diagonal, lower=True)


@implements(torch.Tensor.triu_)
def triu_(input, diagonal=0):
    return _triangle_(input, diagonal, lower=False)


def _triangle_(x, diagonal, lower: bool):
    op = "tril_" if lower else "triu_"
    if not isinstance(x, SparseTensor):
        return _dense_call(getattr(torch.Tensor, op), x, diagonal)
    if torch.is_grad_enabled() and x.requires_grad:
        raise NotSupportedError(f"{op}: rebuilding a SparseTensor that requires grad in place is not recorded by "
                                f"autograd; use the out-of-place {op[:-1]}")
    x._restore(_triangle(x, diagonal, lower))
    torch.autograd.graph.increment_version(x)
    return x


def _triangle(x, diagonal, lower: bool):
    op = "tril" if lower else "triu"
    if x.dim() < 2:
        raise ScorchValueError(f"{op}: expects at least 2 dims, got {x.dim()}-d")
    k = _int(diagonal, op, "diagonal")
    coords, ids = entries(x)
    off = coords[-1] - coords[-2]
    coords, ids = _keep(coords, ids, off <= k if lower else off >= k)
    return assemble(x._format, x.shape, coords, ids, x.values(), x.index_dtype)


# ================================================================ flip / roll: coordinates moved, values kept

@implements(torch.flip, torch.Tensor.flip)
def flip(input, *dims, **kwargs):
    """Reverse the order along ``dims`` (sparse, same format, differentiable); ``x.flip(0, 1)``
    as ``x.flip((0, 1))``."""
    n = input.dim()
    dims = _one_or_many("flip", "dims", dims, kwargs)
    dims = [dims] if isinstance(dims, numbers.Integral) else list(dims)
    ds = {_dim(d, n, "flip", "dims") for d in dims}
    if len(ds) != len(dims):
        raise ScorchValueError(f"flip: dims {tuple(dims)} repeat a dimension")
    coords, ids = entries(input)
    for d in ds:
        coords[d] = input.shape[d] - 1 - coords[d]
    return assemble(input._format, input.shape, coords, ids, input.values(), input.index_dtype)


@implements(torch.roll, torch.Tensor.roll)
def roll(input, shifts, dims=None):
    """Shift along ``dims`` with wrap-around (no ``dims``: over the flattened tensor)."""
    shifts = [shifts] if isinstance(shifts, numbers.Integral) or (isinstance(shifts, torch.Tensor) and
                                                                  shifts.dim() == 0) else list(shifts)
    coords, ids = entries(input)
    if dims is None or (not isinstance(dims, numbers.Integral) and len(dims) == 0):
        if len(shifts) != 1:
            raise ScorchValueError(f"roll: without dims, shifts must be one int, got {tuple(shifts)}")
        sizes = list(input.shape)
        lin = (ravel_coords(coords, sizes, ids.numel()) + shifts[0]) % max(1, input.numel())
        coords = torch.stack(unravel_coords(lin, sizes)) if sizes else coords
    else:
        dims = [dims] if isinstance(dims, numbers.Integral) else list(dims)
        if len(dims) != len(shifts):
            raise ScorchValueError(f"roll: shifts {tuple(shifts)} and dims {tuple(dims)} differ in length")
        for s, d in zip(shifts, dims):
            d = _dim(d, input.dim(), "roll", "dims")
            if input.shape[d]:
                coords[d] = (coords[d] + _int(s, "roll", "shifts")) % input.shape[d]
    return assemble(input._format, input.shape, coords, ids, input.values(), input.index_dtype)


@implements(torch.nn.functional.pad)
def pad(input, pad, mode="constant", value=None):
    """Constant padding with 0 (``F.pad``'s default): the stored entries move by the leading
    pads and the shape grows; a negative pad crops.  Sparse, same format, differentiable.  Another
    value, or another mode, fills or copies into the new positions: dense by definition."""
    if not isinstance(input, SparseTensor) or mode != "constant" or value not in (None, 0):
        check_dense_size(f"pad (mode={mode!r}, value={value!r}) gives a dense result, and", [input])
        dense = input.to_dense() if isinstance(input, SparseTensor) else input
        return torch.nn.functional.pad(dense, pad, mode=mode, value=value)
    pad = [_int(p, "pad", "pad") for p in pad]
    n = input.dim()
    if len(pad) % 2 or len(pad) > 2 * n:
        raise ScorchValueError(f"pad: pad must hold an even number of ints, at most 2 per dim ({2 * n} for a "
                               f"{n}-d tensor), got {len(pad)}")
    coords, ids = entries(input)
    shape = list(input.shape)
    for k in range(len(pad) // 2):   # the last dim first, as F.pad reads pad
        d, before, after = n - 1 - k, pad[2 * k], pad[2 * k + 1]
        if shape[d] + before + after < 0:
            raise ScorchValueError(f"pad: padding {before, after} of dim {d} (size {shape[d]}) leaves a negative size")
        shape[d] += before + after
        coords[d] += before
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    for d in range(n):   # a negative pad crops
        keep &= (coords[d] >= 0) & (coords[d] < shape[d])
    return assemble(input._format, shape, coords[:, keep], ids[keep], input.values(), input.index_dtype)


_pad = pad


@implements(torch.constant_pad_nd)
def constant_pad_nd(input, pad, value=0):
    """``torch.constant_pad_nd(input, pad, value=0)``: :func:`pad`'s constant mode.  Its own
    signature, as the fill value comes third here (it landed in ``F.pad``'s ``mode``)."""
    return _pad(input, pad, "constant", value)


# ================================================================ unbind / split / chunk: views along a dim

@implements(torch.unbind, torch.Tensor.unbind)
def unbind(input, dim=0):
    """Every position of ``dim``, without that dim (sparse, differentiable)."""
    d = _dim(dim, input.dim(), "unbind")
    return tuple(select(input, d, i) for i in range(input._shape[d]))


@implements(torch.split, torch.Tensor.split)
def split(tensor, split_size_or_sections, dim=0):
    """Pieces along ``dim``: of ``split_size`` each (the last may be shorter), or of the listed sizes."""
    d = _dim(dim, tensor.dim(), "split")
    size = tensor._shape[d]
    if isinstance(split_size_or_sections, int):
        step = _int(split_size_or_sections, "split", "split_size")
        if step <= 0 and size:
            raise ScorchValueError(f"split: split_size must be positive, got {step}")
        sizes = [min(step, size - s) for s in range(0, size, step)] if size else [0]
    else:
        sizes = [_int(s, "split", "split_size_or_sections") for s in split_size_or_sections]
        if sum(sizes) != size or any(s < 0 for s in sizes):
            raise ScorchValueError(f"split: sections {sizes} must be non-negative and sum to dim {d}'s size {size}")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(narrow(tensor, d, s, n) for s, n in zip(starts, sizes))


@implements(torch.chunk, torch.Tensor.chunk)
def chunk(input, chunks, dim=0):
    """At most ``chunks`` pieces along ``dim``, each of ``ceil(size / chunks)`` but the last."""
    chunks = _int(chunks, "chunk", "chunks")
    if chunks <= 0:
        raise ScorchValueError(f"chunk: chunks must be positive, got {chunks}")
    d = _dim(dim, input.dim(), "chunk")
    size = input._shape[d]
    if size == 0:   # as torch: `chunks` empty pieces
        return tuple(narrow(input, d, 0, 0) for _ in range(chunks))
    return split(input, max(1, -(-size // chunks)), dim)
