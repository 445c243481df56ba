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

from .. import config, convert
from .._dispatch import accepts_out, broadcast_shapes, check_dense_size, implements, leaves, write_out
from ..errors import NotSupportedError, ScorchIndexError, ScorchTypeError, ScorchValueError
from ..format import Format, preset
from ..interop import as_sparse, position_entries
from ..tensor import SparseTensor
from ._pattern import stored

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
    return convert.coords_of(x._format, x._shape, x._pos, x._crd, torch.arange(x._values.numel()))


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
    return pattern.with_values(padded[pattern._values.long()])


def _rebuild_like(x: SparseTensor, shape, coords, ids):
    return assemble(x._format, shape, coords, ids, x.values(), x.index_dtype)


def _view_like(x: SparseTensor, shape, coords, ids):
    """A reshape-family result of ``x`` (entries ``ids`` at ``coords`` of ``shape``): on ``x``'s
    own values array when the new storage keeps their order -- writes into the stored values
    reach ``x``, as a torch view's do -- else on gathered values, as :func:`_rebuild_like`."""
    n = ids.numel()
    if not shape or x._stored != x._values.numel() or n != x._stored:   # (0-d, or ELL's unused slots)
        return _rebuild_like(x, shape, coords, ids)
    pattern = rebuild(x._format, shape, coords, ids + 1, x.index_dtype)   # each entry's position + 1
    if pattern._values.numel() == n and bool((pattern._values == torch.arange(1, n + 1)).all()):
        return x._on_values_of(pattern)
    return take_positions(pattern, x.values())


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
    """``x.view(shape)``: like reshape, and a copy (see the module docstring)."""
    shape = shape or ((size if size is not None else dtype),)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NotSupportedError(
            f"view(dtype={shape[0]}): reinterpreting a SparseTensor's bits is not supported; "
            "use x.to(dtype) to convert the values, or x.to_dense().view(dtype)")
    return _reshape(self, _sizes(shape, "view"), "view")


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
    return _reshape(input, shape[:d] + part + shape[d + 1:], "unflatten")


@implements(torch.unsqueeze, torch.Tensor.unsqueeze)
def unsqueeze(input, dim):
    """Insert a size-1 dim at ``dim`` (in ``[-ndim-1, ndim]``)."""
    d = _dim(dim, input.dim() + 1, "unsqueeze")
    coords, ids = entries(input)
    coords = torch.cat([coords[:d], torch.zeros((1, ids.numel()), dtype=_I64), coords[d:]])
    return _view_like(input, input._shape[:d] + (1,) + input._shape[d:], coords, ids)


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
    return _view_like(input, tuple(input._shape[d] for d in keep), coords[keep], ids)


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
    coords, ids = entries(x)
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


@implements(torch.Tensor.__setitem__)
def setitem(x, key, value):
    """``x[key] = value`` with a SparseTensor ``x``: the stored entries the key selects take the
    value (broadcast as torch broadcasts it; any key torch takes); a nonzero written where ``x``
    stores nothing joins the pattern (:func:`store_at`, as ``copy_`` takes its source's).
    (torch.sparse refuses every assignment.)  A dense ``x`` with a sparse key or value: on their
    dense values."""
    if not isinstance(x, SparseTensor):
        return _dense_call(torch.Tensor.__setitem__, x, key, value)
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
        x._values[where[hit]] = value
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
        x._values[where[hit]] = value
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


def along(shape, d: int) -> torch.Tensor:
    """The ``d``-th coordinate of every element of a tensor of ``shape`` (a stride-0 arange: indexing
    it materialises the selected elements only)."""
    return torch.arange(shape[d], dtype=_I64).reshape([-1 if e == d else 1 for e in range(len(shape))]).expand(shape)


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
        new[hit] += x._values[where[slot]]
    grow = ~hit & ((new != 0) | new.isnan())
    if not bool(grow.any()):
        x._values[where[slot]] = new[hit]
        torch.autograd.graph.increment_version(x)
        return
    _check_store_size(x, int(grow.sum()), op)
    values = x._values[where].clone()
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
    out[hit] = x._values[where[slot]]
    return out


def mask_points(mask, shape) -> torch.Tensor | None:
    """The coordinates (``ndim x k``, unique, in storage order) where ``mask`` -- a bool SparseTensor
    of exactly ``shape`` -- is True: its stored True entries (the dense shape never made); None for
    any other mask (a dense one, or one that broadcasts)."""
    if not isinstance(mask, SparseTensor) or mask.dtype != torch.bool or tuple(mask._shape) != tuple(shape):
        return None
    coords, where = stored(mask)
    return coords[:, mask._values[where]]


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
    x._values[where[hit]] = value
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
    if limit is not None and k * (8 * len(x._shape) + x._values.element_size()) > limit:
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
    x._restore(rebuild(x._format, x._shape, every, torch.cat([x._values[where], values[keep]])[last], x.index_dtype))
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
    written tensor requires grad (as :func:`setitem` refuses it)."""
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
        x._values[where[torch.isin(coords[d], index)]] = v
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


def store_zeros_at(x: SparseTensor, at: torch.Tensor, name: str) -> None:
    """Store explicit zeros at the coordinates ``at`` (``ndim x k``, unique) that ``x`` does not
    store (the others keep their values): the pattern an in-place op about to write there needs."""
    coords, where = stored(x)
    absent = ~torch.isin(ravel_coords(at, x._shape, at.shape[1]), ravel_coords(coords, x._shape, coords.shape[1]))
    at = at[:, absent]
    _check_store_size(x, at.shape[1], name)
    values = torch.cat([x._values[where], torch.zeros(at.shape[1], dtype=x.dtype)])
    x._restore(rebuild(x._format, x._shape, torch.cat([coords, at], 1), values, x.index_dtype))
    torch.autograd.graph.increment_version(x)


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


@implements(torch.nn.functional.pad, torch.constant_pad_nd)
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
