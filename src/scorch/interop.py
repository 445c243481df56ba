"""The boundary: building SparseTensors from user data, and handing them back.

Owns input validation (everything that reaches level storage from outside
passes through here, so generated code never sees bad indices) and the
bridges to ``torch.sparse`` layouts and ``scipy.sparse``.
"""

from __future__ import annotations

import math
import operator
import warnings

import numpy as np
import torch

from . import convert
from .errors import NotSupportedError, ScorchTypeError, ScorchValueError
from .format import Format, bsc_format, bsr_format, resolve
from .tensor import (_FORWARD_AD, SparseTensor, _batched, _has_tangent, _layers_deep, _unwrapped, check_values,
                     cpu_entry)

__all__ = ["as_sparse", "from_coo", "is_sparse", "to_torch", "to_scipy", "validate_storage"]

_INDEX_DTYPES = (None, torch.int32, torch.int64)
_TORCH_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def is_sparse(x) -> bool:
    """True for a scorch SparseTensor or a ``torch.sparse`` tensor of any layout."""
    return isinstance(x, SparseTensor) or is_torch_sparse(x)


def is_torch_sparse(x) -> bool:
    """True for a ``torch.sparse`` tensor (COO, CSR, CSC, BSR, BSC), not a SparseTensor."""
    return isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) and x.layout in _TORCH_SPARSE


def _is_scipy_sparse(x) -> bool:
    mod = type(x).__module__ or ""
    if not mod.startswith("scipy.sparse"):
        return False
    import scipy.sparse as sp
    return sp.issparse(x)


def _check_index_dtype(index_dtype):
    if index_dtype not in _INDEX_DTYPES:
        raise ScorchTypeError(f"index_dtype must be torch.int32, torch.int64 or None, got {index_dtype!r}")


@cpu_entry
def as_sparse(x, format="csr", *, index_dtype=None) -> SparseTensor:
    """``x`` as a SparseTensor in ``format``.

    ``x`` may be a dense ``torch.Tensor`` (its nonzeros are stored), a
    ``torch.sparse`` tensor of any layout, a ``scipy.sparse`` matrix or array,
    a NumPy array, or a SparseTensor (converted if its format differs).
    ``format`` is a name (``"csr"``, ``"coo"``, ...) or a :class:`scorch.Format`.

    >>> import torch, scorch
    >>> A = scorch.as_sparse(torch.eye(3), "csr")
    >>> (A.nnz, str(A.format))
    (3, 'csr')
    """
    _check_index_dtype(index_dtype)
    if isinstance(x, SparseTensor):
        return x.asformat(format, index_dtype=index_dtype)
    if isinstance(x, np.ndarray):   # (ascontiguousarray makes a 0-d array 1-d: checked below as torch's)
        x = torch.from_numpy(np.ascontiguousarray(x)).reshape(x.shape)
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            raise ScorchValueError("as_sparse: x is 0-d (a scalar); a sparse tensor needs at least 1 dim")
        fmt = resolve(format, x.dim())
        check_values(x, "as_sparse")
        if x.layout == torch.strided:
            _check_blocks(fmt, x.shape)
            (pos, crd), vals = convert.from_dense(fmt, x.detach(), index_dtype)
            out = SparseTensor(fmt, x.shape, pos, crd, vals)
            if _tracked(x):
                coords = out.coo()[0]
                out = _in_graph(out, coords, x[tuple(coords)])
            return out
        if x.layout in _TORCH_SPARSE:
            out = _from_torch_sparse(x.detach(), fmt, index_dtype)
            if _tracked(x):   # its values reach ours through COO's (torch's conversions are differentiable)
                coo = (x if x.layout == torch.sparse_coo else x.to_sparse_coo()).coalesce()
                if coo.dense_dim():   # hybrid: each stored position read off the dense tensor
                    coords = out.coo()[0]
                    out = _in_graph(out, coords, coo.to_dense()[tuple(coords)])
                else:
                    out = _in_graph(out, coo.indices(), coo.values())
            return out
        raise ScorchTypeError(f"as_sparse: unsupported tensor layout {x.layout}")
    if _is_scipy_sparse(x):
        return _from_scipy(x, format, index_dtype)
    raise ScorchTypeError(
        "as_sparse: x must be a torch.Tensor (dense or torch.sparse), a scipy.sparse matrix/array, "
        f"a numpy array or a SparseTensor, got {type(x).__name__}")


def from_torch(x: torch.Tensor) -> SparseTensor:
    """A ``torch.sparse`` tensor as the SparseTensor of its own layout (COO, CSR, CSC, BSR / BSC
    with its blocks); compressed layouts keep their index width, their arrays wrapped (validated),
    not copied."""
    if x.layout == torch.sparse_coo:
        return as_sparse(x, "coo")
    if x.layout in (torch.sparse_csr, torch.sparse_csc):
        fmt = "csr" if x.layout == torch.sparse_csr else "csc"
    else:
        make = bsr_format if x.layout == torch.sparse_bsr else bsc_format
        fmt = make(*x.values().shape[1:3])
    width = (x.crow_indices() if x.layout in (torch.sparse_csr, torch.sparse_bsr) else x.ccol_indices()).dtype
    return as_sparse(x, fmt, index_dtype=width)


def check_torch_sparse(x: torch.Tensor, arg: str = "torch sparse tensor") -> None:
    """Refuse a ``torch.sparse`` tensor whose index arrays (built with ``check_invariants=False``,
    they may be anything) point outside it, before torch's own kernels read them: they trust
    them, and corrupt memory."""
    if x.layout == torch.sparse_coo:
        idx = x._indices()
        if idx.shape[0] != x.sparse_dim() or idx.shape[1] != x._values().shape[0]:
            raise ScorchValueError(f"{arg}: indices of shape {tuple(idx.shape)} do not match its "
                                   f"{x.sparse_dim()} sparse dims and {x._values().shape[0]} values")
        _check_coords(idx, tuple(x.shape[:x.sparse_dim()]), arg)
    elif x.layout in _TORCH_SPARSE:
        _check_torch_compressed(x)


def check_foreign(args) -> None:
    """:func:`check_torch_sparse` on every ``torch.sparse`` tensor among ``args`` (top level, lists,
    tuples): what an op beside a SparseTensor may hand to torch."""
    for a in args:
        t = type(a)
        if t is SparseTensor:
            continue
        if t is list or t is tuple:
            check_foreign(a)
        elif (t is torch.Tensor or (isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor))) \
                and a.layout is not torch.strided:
            check_torch_sparse(a)


def torch_sparse_as_ours(args: tuple, kwargs: dict):
    """``(args, kwargs)`` with every ``torch.sparse`` tensor among them (top level, lists, tuples)
    a SparseTensor (:func:`from_torch`): what ops taking a SparseTensor beside it compute with."""
    def conv(a):
        t = type(a)
        if t is list or t is tuple:
            return t(conv(v) for v in a)
        return from_torch(a) if is_torch_sparse(a) else a
    return conv(args), {k: conv(v) for k, v in kwargs.items()}


@cpu_entry
def from_coo(indices, values, shape=None, format="coo", *, index_dtype=None) -> SparseTensor:
    """A SparseTensor from COO parts; duplicate coordinates are summed.

    ``indices``: integer ``ndim x nnz``; ``values``: ``nnz`` entries (or a scalar
    for all); ``shape``: the tensor's shape (default: the largest index + 1 per dim).

    >>> import scorch
    >>> A = scorch.from_coo([[0, 1, 1], [2, 0, 0]], [1., 2., 3.], (2, 3), format="csr")
    >>> A.to_dense().tolist()
    [[0.0, 0.0, 1.0], [5.0, 0.0, 0.0]]
    """
    _check_index_dtype(index_dtype)
    idx = _index_tensor(indices, "indices")
    if idx.dim() != 2:
        raise ScorchValueError(f"from_coo: indices must be 2-d (ndim x nnz), got shape {tuple(idx.shape)}")
    if values is None:
        raise ScorchTypeError("from_coo: values must be a tensor, an array or a sequence of numbers, got None")
    check_values(values, "from_coo")
    vals = values if isinstance(values, torch.Tensor) else torch.from_numpy(values) if isinstance(values, np.ndarray) \
        else torch.as_tensor(values)   # Python numbers: torch's default dtype, as sparse_coo_tensor's
    if vals.dim() == 0:
        vals = vals.expand(idx.shape[1])
    if vals.dim() != 1:
        raise ScorchValueError(f"from_coo: values must be 1-d (nnz), got shape {tuple(vals.shape)}")
    if vals.shape[0] != idx.shape[1]:
        raise ScorchValueError(
            f"from_coo: indices has {idx.shape[1]} columns (nnz) but values has {vals.shape[0]} entries")
    if shape is None:
        if idx.shape[1] == 0:
            raise ScorchValueError("from_coo: shape is required when there are no entries")
        shape = tuple(int(m) + 1 for m in idx.max(1).values)
    shape = _check_shape(shape)
    if idx.shape[0] != len(shape):
        raise ScorchValueError(
            f"from_coo: indices has {idx.shape[0]} rows, expected one per dim of shape {shape} ({len(shape)})")
    raw = vals.detach()
    if torch._C._functorch.maybe_current_level() is not None:   # inside a torch.func transform: the arrays
        if _batched(idx) or _batched(raw):                         # its wrappers hold (their storage: numpy, kernels)
            raise NotSupportedError("torch.func.vmap over from_coo's indices or values (a batch of sparse tensors) "
                                    "is not supported: batch the dense operands of its products, or loop")
        idx, raw = _unwrapped(idx), _unwrapped(raw)
    _check_coords(idx, shape, "indices")
    fmt = resolve(format, len(shape))
    _check_blocks(fmt, shape)
    with torch._C._DisableFuncTorch():   # (tensors made inside a transform are wrapped too)
        (pos, crd), out = convert.build(fmt, shape, idx.to(torch.int64), raw.contiguous(), index_dtype)
    result = SparseTensor(fmt, shape, pos, crd, out)
    return _in_graph(result, idx, vals) if _tracked(vals) else result


def _tracked(x: torch.Tensor) -> bool:
    """Whether values handed in carry derivatives the result must keep: they require grad, a
    torch.func transform tracks them, or they carry a forward-mode tangent."""
    if x.requires_grad and torch.is_grad_enabled():
        return True
    if torch._C._functorch.maybe_current_level() is not None and _layers_deep(x):
        return True
    return _FORWARD_AD._current_level >= 0 and _has_tangent(x)


def _in_graph(A: SparseTensor, coords: torch.Tensor, values: torch.Tensor) -> SparseTensor:
    """``A`` (built from ``values`` detached) holding ``values`` -- which require grad -- summed
    into the stored position of each coordinate, so that gradients reach them (as torch's
    ``to_sparse`` and ``sparse_coo_tensor`` keep the graph)."""
    from .ops._pattern import positions
    at = positions(A, coords)
    kept = at >= 0   # (a conversion that dropped an explicit zero)
    vals = torch.zeros(A._vals.numel(), dtype=A.dtype).index_add(0, at[kept], values[kept].to(A.dtype))
    return A.with_values(vals)


# ---------------------------------------------------------------- validation

def _index_tensor(x, arg: str) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.numel() == 0 and not isinstance(x, torch.Tensor):
        t = t.to(torch.int64)  # [[], []] reads as float64 in numpy; an empty list has no dtype to check
    if t.dtype.is_floating_point or t.dtype.is_complex:
        if bool(torch.isnan(t).any()):
            raise ScorchValueError(f"{arg} contains NaN; indices must be integers")
        raise ScorchTypeError(f"{arg} must be an integer tensor, got dtype {t.dtype}")
    if t.dtype == torch.bool:
        raise ScorchTypeError(f"{arg} must be an integer tensor, got dtype torch.bool")
    if t.dtype in _UNSIGNED:   # (numpy's uint64 indices: torch's min / max do not take them)
        top = int(t.numpy().max()) if t.numel() else 0
        if top > _I64_MAX:
            raise ScorchValueError(f"{arg} has index {top}, past the largest int64 index")
        t = t.to(torch.int64)
    return t


_UNSIGNED = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
_I64_MAX = 2**63 - 1


def _check_shape(shape) -> tuple:
    try:   # (operator.index: a float size is refused, as torch's; int() truncated 4.5 to 4)
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ScorchTypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if not shape:
        raise ScorchValueError("shape is empty (0-d); a sparse tensor needs at least 1 dim")
    if any(s < 0 for s in shape):
        raise ScorchValueError(f"shape must not have negative sizes, got {shape}")
    return shape


def _check_coords(idx: torch.Tensor, shape: tuple, arg: str) -> None:
    if idx.shape[1] == 0:
        return
    lo, hi = idx.min(1).values, idx.max(1).values
    for d, n in enumerate(shape):
        if int(lo[d]) < 0:
            raise ScorchValueError(f"{arg}: dim {d} has a negative index {int(lo[d])}")
        if int(hi[d]) >= n:
            raise ScorchValueError(
                f"{arg}: dim {d} has index {int(hi[d])}, out of range for size {n} (shape {shape} too small?)")


def _check_blocks(fmt: Format, shape) -> None:
    if fmt.block and any(s % b for s, b in zip(shape, fmt.block)):
        raise ScorchValueError(f"format {fmt}: block size {fmt.block} does not divide shape {tuple(shape)}")
    check_position_array(fmt, shape)


def check_position_array(fmt: Format, shape) -> None:
    """Refuse a format whose first compressed level has a position array of the dense levels
    above it -- CSR of a 10^9-row matrix: 4 GB whatever it stores -- past
    ``config.dense_fallback_max_bytes`` (a DCSR / DCSC or COO stores only what is there)."""
    from . import config
    limit, count = config.dense_fallback_max_bytes, position_entries(fmt, shape)
    if limit is not None and count > 1 << 24 and 4 * (count + 1) > limit:   # (small ones: free)
        raise NotSupportedError(f"format {fmt} of shape {tuple(shape)}: its compressed level needs a position "
                                f"array of {count + 1} entries, over scorch.config.dense_fallback_max_bytes "
                                f"= {limit / 2**30:.1f} GiB; a format compressing the outer dims (dcsr, dcsc, "
                                "coo) stores only what is there")


def position_entries(fmt: Format, shape) -> int:
    """The number of positions the first compressed level's ``pos`` array indexes (the product of
    the dense levels above it): 0 when no compressed level comes first after dense ones."""
    count = 1
    for level, size in zip(fmt.levels, fmt.level_sizes(shape)):
        if level.kind == "dense":
            count *= size
            continue
        return count if level.kind == "compressed" else 0
    return 0


def validate_storage(fmt: Format, shape, pos, crd, values, *, arg: str = "storage") -> None:
    """Check level storage from outside scorch; raise ScorchValueError naming the level."""
    shape = _check_shape(shape)
    _check_blocks(fmt, shape)
    sizes = fmt.level_sizes(shape)
    if len(pos) != len(sizes) or len(crd) != len(sizes):
        raise ScorchValueError(f"{arg}: expected pos/crd for {len(sizes)} levels")
    for name, arrays in (("pos", pos), ("crd", crd)):
        bad = next((a for a in arrays if a is not None and not isinstance(a, torch.Tensor)), None)
        if bad is not None:
            raise ScorchTypeError(f"{arg}: {name} arrays must be torch.Tensors (or None where a level has none), got "
                                  f"{type(bad).__name__}")
    if not isinstance(values, torch.Tensor):
        raise ScorchTypeError(f"{arg}: values must be a torch.Tensor, got {type(values).__name__}")
    check_values(values, arg)
    dtypes = {t.dtype for t in (*pos, *crd) if t is not None}
    if not dtypes <= {torch.int32, torch.int64} or len(dtypes) > 1:
        raise ScorchTypeError(f"{arg}: index arrays must all be int32 or all int64, got {sorted(map(str, dtypes))}")
    npos = 1
    chain_start = None
    for k, lv in enumerate(fmt.levels):
        where, n = f"{arg}: level {k} ({lv})", sizes[k]
        p, c = pos[k], crd[k]
        if (p is not None) != lv.has_pos or (c is not None) != lv.has_crd:
            raise ScorchValueError(f"{where}: wrong set of index arrays for this level kind")
        if c is not None and c.dim() != 1:
            raise ScorchValueError(f"{where}: crd must be 1-d, got shape {tuple(c.shape)}")
        if lv.kind == "dense":
            npos *= n
            continue
        if lv.kind == "compressed":
            p64 = p.to(torch.int64)
            if p.dim() != 1 or p.numel() != npos + 1:
                raise ScorchValueError(f"{where}: pos must have {npos + 1} entries, got shape {tuple(p.shape)}")
            if int(p64[0]) != 0 or int(p64[-1]) != c.numel() or bool((p64[1:] < p64[:-1]).any()):
                raise ScorchValueError(
                    f"{where}: pos must start at 0, never decrease and end at len(crd) = {c.numel()}")
            _check_range(c, 0, n, where)
            starts = torch.zeros(c.numel(), dtype=torch.bool)
            starts[p64[:-1][p64[:-1] < c.numel()]] = True
            if lv.unique:
                _check_sorted(fmt, crd, k, k, starts, where)
            else:
                chain_start = (k, starts)
            npos = c.numel()
        elif lv.kind == "singleton":
            if c.numel() != npos:
                raise ScorchValueError(f"{where}: crd must have {npos} entries, got {c.numel()}")
            _check_range(c, 0, n, where)
            if lv.unique and chain_start is not None:
                _check_sorted(fmt, crd, chain_start[0], k, chain_start[1], where)
                chain_start = None
        else:  # padded
            if npos and c.numel() % npos:
                raise ScorchValueError(f"{where}: crd length {c.numel()} is not a multiple of {npos} parents")
            if not npos and c.numel():
                raise ScorchValueError(f"{where}: crd must be empty under an empty parent level")
            _check_range(c, -1, n, where)
            slots = c.numel() // npos if npos else 0
            rows = c.view(npos, slots)
            used = rows >= 0
            if slots > 1 and (bool((used[:, 1:] & ~used[:, :-1]).any())
                              or bool((used[:, 1:] & (rows[:, 1:] <= rows[:, :-1])).any())):
                raise ScorchValueError(f"{where}: each row's used slots must come first, in increasing order")
            npos = c.numel()
    if values.dim() != 1 or values.numel() != npos:
        raise ScorchValueError(f"{arg}: values must be 1-d with {npos} entries, got shape {tuple(values.shape)}")
    if values.numel():   # a write into the values (an optimizer step) must not rewrite an index array
        mem = values.untyped_storage().data_ptr()
        for name, arrays in (("pos", pos), ("crd", crd)):
            k = next((k for k, a in enumerate(arrays) if a is not None and a.numel()
                      and a.untyped_storage().data_ptr() == mem), None)
            if k is not None:
                raise ScorchValueError(f"{arg}: values share memory with {name}[{k}] (the level's index array); "
                                       "pass a copy of one of them")


def _check_range(c, lo, hi, where):
    if c.numel() and (int(c.min()) < lo or int(c.max()) >= hi):
        raise ScorchValueError(
            f"{where}: coordinates must lie in [{lo}, {hi}), got [{int(c.min())}, {int(c.max())}]")


def _check_sorted(fmt, crd, first, last, starts, where):
    """Entries of one parent must be strictly increasing in (crd[first], .., crd[last])."""
    if starts.numel() < 2:
        return
    greater = torch.zeros(starts.numel() - 1, dtype=torch.bool)
    equal = torch.ones_like(greater)
    for j in range(first, last + 1):
        c = crd[j]
        greater |= equal & (c[1:] > c[:-1])
        equal &= c[1:] == c[:-1]
    if bool((~starts[1:] & ~greater).any()):
        raise ScorchValueError(f"{where}: coordinates are not sorted and unique within each parent")


# ---------------------------------------------------------------- torch.sparse

def _torch_compressed_parts(x):
    """(format, pos, crd, values) of a plain 2-d CSR/CSC/BSR/BSC tensor, or None."""
    if x.dim() != 2 or x.dense_dim() != 0:
        return None
    layout = x.layout
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        p, c = x.crow_indices(), x.col_indices()
    else:
        p, c = x.ccol_indices(), x.row_indices()
    v = x.values()
    if layout == torch.sparse_csr:
        fmt = resolve("csr", 2)
    elif layout == torch.sparse_csc:
        fmt = resolve("csc", 2)
    else:
        from .format import bsc_format, bsr_format
        bh, bw = v.shape[1:3]
        fmt = (bsr_format if layout == torch.sparse_bsr else bsc_format)(int(bh), int(bw))
    return fmt, p, c, v.reshape(-1)


def _check_torch_compressed(x) -> None:
    """The index arrays of a batched or hybrid torch CSR / CSC / BSR / BSC tensor (built with
    ``check_invariants=False``, they may be anything): every batch's positions start at 0, never
    decrease and end at the stored count, every coordinate inside its dim -- before torch's own
    conversion reads them."""
    row_major = x.layout in (torch.sparse_csr, torch.sparse_bsr)
    p, c = (x.crow_indices(), x.col_indices()) if row_major else (x.ccol_indices(), x.row_indices())
    b = p.dim() - 1
    pos_name, crd_name = ("crow_indices", "col_indices") if row_major else ("ccol_indices", "row_indices")
    if tuple(p.shape[:-1]) != tuple(c.shape[:-1]) or tuple(x.values().shape[:b + 1]) != tuple(c.shape):
        raise ScorchValueError(f"as_sparse: torch sparse tensor's {pos_name} {tuple(p.shape)}, {crd_name} "
                               f"{tuple(c.shape)} and values {tuple(x.values().shape)} disagree on the batch "
                               "dims or the stored count")
    block = tuple(x.values().shape[b + 1:b + 3]) if x.layout in (torch.sparse_bsr, torch.sparse_bsc) else (1, 1)
    outer = x.shape[b] // block[0] if row_major else x.shape[b + 1] // block[1]
    inner = x.shape[b + 1] // block[1] if row_major else x.shape[b] // block[0]
    batches = math.prod(p.shape[:-1])
    _check_compressed(p.reshape(batches, p.shape[-1]), c.reshape(batches, c.shape[-1]), outer, inner,
                      "torch sparse tensor", "crow_indices" if row_major else "ccol_indices",
                      "col_indices" if row_major else "row_indices", exact=True)


def _check_compressed(p, c, outer: int, inner: int, what: str, pos_name: str, crd_name: str, *, exact: bool):
    """Compressed index arrays from outside (``p``: batches x positions, ``c``: batches x
    coordinates): positions that start at 0, never decrease and end at the coordinates' count
    (``exact``) or within it (scipy's spare capacity), the coordinates they use inside ``[0,
    inner)``."""
    p, c = torch.as_tensor(p).to(torch.int64), torch.as_tensor(c).to(torch.int64)
    if p.shape[-1] != outer + 1:
        raise ScorchValueError(f"as_sparse: {what}'s {pos_name} has {p.shape[-1]} entries per batch, expected "
                               f"{outer + 1}")
    n, ends = c.shape[-1], p[:, -1]
    if p.numel() and (bool((p[:, 0] != 0).any()) or bool((p[:, 1:] < p[:, :-1]).any())
                      or bool((ends != n).any() if exact else (ends > n).any())):
        raise ScorchValueError(f"as_sparse: {what}'s {pos_name} must start at 0, never decrease and end "
                               f"{'at' if exact else 'within'} its {n} {crd_name} in every batch")
    used = c if exact or not p.numel() else c[:, :int(ends.max())]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= inner):
        raise ScorchValueError(f"as_sparse: {what}'s {crd_name} must lie in [0, {inner}), got "
                               f"[{int(used.min())}, {int(used.max())}]")


def _from_torch_sparse(x, fmt: Format, index_dtype) -> SparseTensor:
    parts = _torch_compressed_parts(x) if x.layout != torch.sparse_coo else None
    if parts is not None:
        src_fmt, p, c, v = parts
        n = len(src_fmt.levels)
        pos = tuple(p if k == 1 else None for k in range(n))
        crd = tuple(c if k == 1 else None for k in range(n))
        try:
            validate_storage(src_fmt, x.shape, pos, crd, v, arg="torch sparse tensor")
        except ScorchValueError as e:
            if "not sorted" not in str(e):
                raise
        else:  # well-formed: wrap without copying (unless the index width changes), then convert
            src = SparseTensor(src_fmt, x.shape, *convert.recast(src_fmt, x.shape, pos, crd, index_dtype), v)
            return src.asformat(fmt, index_dtype=index_dtype)
        x = x.to_sparse_coo()
    elif x.layout != torch.sparse_coo:
        _check_torch_compressed(x)   # (torch's own conversion trusts them: malformed ones corrupted memory)
        x = x.to_sparse_coo()
    idx, vals = x._indices(), x._values()
    if x.dense_dim():  # hybrid COO: expand each dense block into entries
        dense_shape = vals.shape[1:]
        inner = torch.stack(torch.meshgrid(*[torch.arange(s) for s in dense_shape], indexing="ij")).reshape(
            len(dense_shape), -1)
        m = inner.shape[1]
        idx = torch.cat([idx.repeat_interleave(m, 1), inner.repeat(1, idx.shape[1])])
        vals = vals.reshape(-1)
    _check_coords(idx, tuple(x.shape), "torch sparse tensor indices")
    _check_blocks(fmt, x.shape)
    (pos, crd), out = convert.build(fmt, x.shape, idx.to(torch.int64), vals, index_dtype)
    return SparseTensor(fmt, x.shape, pos, crd, out)


def _quietly(make, *args):
    """Build a torch compressed tensor from storage scorch already validated, without
    torch's "beta" / "invariant checks disabled" warnings."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse (CSR|CSC|BSR|BSC) tensor support is in beta")
        return make(*args, check_invariants=False)


def to_torch(A: SparseTensor) -> torch.Tensor:
    fmt, name = A.format, A.format.name or ""
    if name == "dense":
        return A.to_dense()
    v = A.values().clone()   # (its own values, as its own index arrays: writes into one never reach the other)
    if name in ("csr", "csc") and A.dim() == 2:
        make = torch.sparse_csr_tensor if name == "csr" else torch.sparse_csc_tensor
        return _quietly(make, A.pos(1), A.crd(1), v, A.shape)
    if name.startswith(("bsr", "bsc")):
        make = torch.sparse_bsr_tensor if name.startswith("bsr") else torch.sparse_bsc_tensor
        return _quietly(make, A.pos(1), A.crd(1), v.view(-1, *fmt.block), A.shape)
    coords, _, where = convert.coords_of(fmt, A._shape, A._pos, A._crd, A._vals, positions=True)
    vals = v[where]   # (from v: differentiable, as the compressed layouts' -- coo() reads the raw array)
    in_order = fmt.order == tuple(range(len(fmt.levels))) and not fmt.block
    out = torch.sparse_coo_tensor(coords, vals, A.shape, is_coalesced=in_order, check_invariants=False)
    return out if in_order else out.coalesce()


# ---------------------------------------------------------------- scipy

def _check_scipy(x) -> None:
    """A scipy.sparse matrix's arrays (anything, when built without scipy's checks) before scipy's
    own ``tocoo`` reads them: compressed positions that start at 0, never decrease and end at the
    stored count; coordinates and data of one length; integer coordinates inside the shape (a bad
    indptr read past its arrays, short data was repeated)."""
    shape = tuple(int(s) for s in x.shape)
    fmt = getattr(x, "format", "")
    if fmt in ("csr", "csc", "bsr"):
        indptr, indices = np.asarray(x.indptr), np.asarray(x.indices)
        blocks = getattr(x, "blocksize", (1, 1)) if fmt == "bsr" else (1, 1)
        outer = shape[0] // blocks[0] if fmt != "csc" else shape[1]
        inner = shape[1] // blocks[1] if fmt != "csc" else shape[0]
        n = indices.shape[0]
        if indptr.ndim != 1 or indices.ndim != 1 or indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu":
            raise ScorchValueError(f"as_sparse: scipy {fmt} matrix has a malformed indptr or indices (expected 1-d "
                                   f"integer arrays, got {indptr.dtype} {indptr.shape} and {indices.dtype} "
                                   f"{indices.shape})")
        _check_compressed(indptr[None], indices[None], outer, inner, f"scipy {fmt} matrix", "indptr", "indices",
                          exact=False)   # (scipy allows spare capacity past indptr[-1])
        if np.asarray(x.data).shape[0] != n:
            raise ScorchValueError(f"as_sparse: scipy {fmt} matrix has {np.asarray(x.data).shape[0]} data entries "
                                   f"for {n} indices")
    elif fmt == "coo":
        coords = getattr(x, "coords", None) or (x.row, x.col)
        lengths = {np.asarray(c).shape[0] for c in coords} | {np.asarray(x.data).shape[0]}
        if len(lengths) != 1 or any(np.asarray(c).dtype.kind not in "iu" for c in coords):
            raise ScorchValueError("as_sparse: scipy coo matrix needs integer coordinates and data of one length, "
                                   f"got lengths {sorted(lengths)}")


def _from_scipy(x, format, index_dtype) -> SparseTensor:
    _check_scipy(x)
    if getattr(x, "format", "") in ("csr", "csc", "bsr") and np.asarray(x.indices).shape[0] > int(x.indptr[-1]):
        x = x.copy()
        x.prune()   # spare capacity past indptr[-1] is no entry (tocoo kept it, in rows from uninitialised memory)
    coo = x.tocoo()
    coords = getattr(coo, "coords", None) or (coo.row, coo.col)
    idx = torch.from_numpy(np.stack([np.asarray(c, dtype=np.int64) for c in coords]))
    data = np.asarray(coo.data)
    if data.dtype.kind not in "fciub":
        raise ScorchTypeError(f"as_sparse: scipy matrix has unsupported dtype {data.dtype}")
    vals = torch.from_numpy(data.copy())
    check_values(vals, "as_sparse (a scipy matrix's data)")
    shape = tuple(int(s) for s in coo.shape)
    fmt = resolve(format, len(shape))
    _check_coords(idx, shape, "scipy matrix indices")
    _check_blocks(fmt, shape)
    (pos, crd), out = convert.build(fmt, shape, idx, vals, index_dtype)
    return SparseTensor(fmt, shape, pos, crd, out)


def to_scipy(A: SparseTensor):
    import scipy.sparse as sp
    if A.dim() != 2:
        raise ScorchValueError(f"to_scipy: scipy.sparse holds 2-d matrices, got a {A.dim()}-d tensor")
    v = A.values().detach().clone()   # scipy's in-place methods (eliminate_zeros, sort_indices) rewrite
    if v.dtype in (torch.bfloat16, torch.float16):  # its arrays: A's are not handed over (pos / crd copy too)
        v = v.float()                 # (scipy.sparse has neither half type; float32 holds both exactly)
    elif v.dtype == torch.complex32:
        v = v.to(torch.complex64)     # (nor a complex half: complex64 holds it exactly)
    name = A.format.name or ""
    if name in ("csr", "csc"):
        make = sp.csr_array if name == "csr" else sp.csc_array
        return make((v.numpy(), A.crd(1).numpy(), A.pos(1).numpy()), shape=tuple(A.shape))
    if name.startswith("bsr"):
        return sp.bsr_array((v.view(-1, *A.format.block).numpy(), A.crd(1).numpy(), A.pos(1).numpy()),
                            shape=tuple(A.shape))
    coords, vals = A.coo()
    if vals.dtype in (torch.bfloat16, torch.float16):
        vals = vals.float()
    return sp.coo_array((vals.detach().numpy(), (coords[0].numpy(), coords[1].numpy())), shape=tuple(A.shape))


# ---------------------------------------------------------------- DataLoader batches

def _collate(batch, *, collate_fn_map=None):
    """``default_collate`` of SparseTensor samples: stacked along a new first dim, a SparseTensor
    (torch's own stacks into shared memory, which a SparseTensor does not have).  In a worker
    process, samples that require grad are refused as torch's collate refuses them there (the
    batch could not be sent back: the DataLoader waited forever)."""
    batch = list(batch)
    if torch.utils.data.get_worker_info() is not None and torch.is_grad_enabled():
        with torch._C.DisableTorchFunctionSubclass():
            tracked = any(isinstance(x, torch.Tensor) and x.requires_grad for x in batch)
        if tracked:
            raise RuntimeError("collate: a DataLoader worker cannot send back samples that require grad (as torch's "
                               "collate refuses them there); return them detached, or load with num_workers=0")
    return torch.stack(batch, 0)


def _register_collate() -> None:
    """torch's documented extension point (``collate``'s docstring): ``default_collate_fn_map``."""
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:   # pragma: no cover - another torch layout: DataLoader keeps its own rules
        return
    default_collate_fn_map[SparseTensor] = _collate


_register_collate()
