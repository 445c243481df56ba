"""Conversions between coordinates, dense tensors and level storage.

Pure, vectorised functions (no Python loop over nonzeros; loops run over
*levels* only).  Storage is the tuple ``(pos, crd, vals)``: per level a
``pos`` tensor (compressed levels, else None) and a ``crd`` tensor
(compressed / singleton / padded levels, else None), plus one flat values
tensor with one entry per position of the innermost level.

Every conversion goes through coordinates: :func:`coords_of` walks the levels
top-down and lists each stored entry's coordinates (in level order), and
:func:`build` sorts, sums duplicates and assembles the levels of the target
format.  When the source already lists entries in the target's order (CSR ->
COO, CSR -> DCSR, ...) the sort is skipped after an O(nnz) check.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from . import config
from .errors import InternalError, NotSupportedError, ScorchValueError
from .format import Format, preset

_I64 = torch.int64
_INT32_MAX = 2**31 - 1


def _ranges(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(s, s + c)`` for each (s, c), vectorised."""
    total = int(counts.sum()) if counts.numel() else 0
    if total == 0:
        return torch.zeros(0, dtype=_I64)
    offsets = torch.cumsum(counts, 0) - counts  # exclusive prefix sum
    return torch.repeat_interleave(starts - offsets, counts, output_size=total) + torch.arange(total)


def _counts_to_pos(parents: torch.Tensor, npos: int) -> torch.Tensor:
    pos = torch.zeros(npos + 1, dtype=_I64)
    if parents.numel():
        torch.cumsum(torch.bincount(parents, minlength=npos), 0, out=pos[1:])
    return pos


# --------------------------------------------------------------- parents of stored entries

def _derived(pos: torch.Tensor, name: str, make):
    """``make(pos)``, computed once per ``pos`` tensor and kept on it (as attribute ``name``),
    so it lives exactly as long as ``pos``: a pattern's ``pos`` is shared by every tensor with
    that pattern (an SDDMM's result, the softmax of it, ...).  Kept with ``pos``'s version: scorch
    never writes a pattern, but one taken without a copy (a torch CSR's ``crow_indices``) may be
    rewritten by its owner (``t.copy_(t2)``), and a stale one sent kernels past their arrays.  An
    attribute, not a dict keyed by ``id(pos)``: a cached kernel call reads two of these (0.25 -> 0.1
    us each)."""
    try:
        version, value = getattr(pos, name)
        if version == pos._version:
            return value
    except AttributeError:
        pass
    with _DERIVING:   # one maker: a second thread's value replaced the first's while a kernel call
        try:          # held only its address (a use after free: threads' first SpMV on a new pattern)
            version, value = getattr(pos, name)
            if version == pos._version:
                return value
        except AttributeError:
            pass
        value = make(pos)
        setattr(pos, name, (pos._version, value))
        return value


_DERIVING = threading.RLock()   # (re-entrant: a maker may ask for another derived array)


def _parents(pos):
    from .compiler import build, segments
    if build.have_compiler():
        return segments.parents(pos)  # a generated kernel: 1M entries 1.96 -> 0.7-1.0 ms
    lengths = (pos[1:] - pos[:-1]).to(_I64)
    return torch.repeat_interleave(torch.arange(pos.numel() - 1, dtype=pos.dtype), lengths, output_size=int(pos[-1]))


_HEADS_PAD = 128  # zero bytes past the last entry's byte: a kernel reads 68 bytes from any entry's byte on


def _heads(pos):
    from .compiler import build, segments
    if build.have_compiler():
        return segments.heads(pos, _HEADS_PAD)  # a generated kernel: 1M entries 0.46 -> 0.12 ms
    nnz, starts = int(pos[-1]), pos[:-1].numpy()
    bits = np.zeros((nnz + 7) // 8 * 8 + 8 * _HEADS_PAD, dtype=bool)
    bits[starts[starts < nnz]] = True
    return torch.from_numpy(np.packbits(bits, bitorder="little"))


def entry_parents(pos: torch.Tensor) -> torch.Tensor:
    """The parent position of every entry of a compressed level, in ``pos``'s index type
    (for CSR's column level: the row of each stored entry); kept while ``pos`` lives."""
    return _derived(pos, "_scorch_entry_parents", _parents)


def entry_heads(pos: torch.Tensor) -> torch.Tensor:
    """Bit ``q % 8`` of byte ``q // 8`` set when entry ``q`` of a compressed level is its
    parent's first (a CSR row's first stored entry), as uint8, with ``_HEADS_PAD`` zero bytes
    past the last entry's byte; kept while ``pos`` lives."""
    return _derived(pos, "_scorch_entry_heads", _heads)


# --------------------------------------------------------------- storage -> coordinates

def coords_of(fmt: Format, shape, pos, crd, vals, *, positions: bool = False):
    """Coordinates (``ndim x nnz`` int64, logical dims) and values of every stored
    entry, listed in the format's level order; unused padded slots are dropped.
    With ``positions=True`` also each entry's index into ``vals``."""
    sizes = fmt.level_sizes(shape)
    p = torch.zeros(1, dtype=_I64)  # positions of the entries kept so far
    npos = 1                        # number of positions at the current level
    cols: list[torch.Tensor] = []
    for k, lv in enumerate(fmt.levels):
        n = sizes[k]
        if lv.kind == "dense":
            m = p.numel()
            cols = [c.unsqueeze(1).expand(m, n).reshape(-1) for c in cols]
            cols.append(torch.arange(n, dtype=_I64).expand(m, n).reshape(-1))
            p = (p.unsqueeze(1) * n + torch.arange(n, dtype=_I64)).reshape(-1)
            npos *= n
        elif lv.kind == "compressed":
            pk = pos[k].to(_I64)
            if p.numel() == npos:  # every parent position, in order: no gather needed
                counts = pk[1:] - pk[:-1]
                child = torch.arange(int(pk[-1]), dtype=_I64)
                parent = torch.repeat_interleave(torch.arange(npos, dtype=_I64), counts, output_size=child.numel())
            else:
                starts, counts = pk[p], pk[p + 1] - pk[p]
                child = _ranges(starts, counts)
                parent = torch.repeat_interleave(torch.arange(p.numel(), dtype=_I64), counts,
                                                 output_size=child.numel())
            cols = [c[parent] for c in cols]
            cols.append(crd[k][child].to(_I64))
            p, npos = child, int(pk[-1])
        elif lv.kind == "singleton":
            cols.append(crd[k][p].to(_I64))
        elif lv.kind == "padded":
            slots = crd[k].numel() // npos if npos else 0
            parent = torch.arange(p.numel(), dtype=_I64).repeat_interleave(slots)
            child = (p.unsqueeze(1) * slots + torch.arange(slots, dtype=_I64)).reshape(-1)
            c = crd[k][child].to(_I64)
            used = c >= 0
            parent, child, c = parent[used], child[used], c[used]
            cols = [col[parent] for col in cols]
            cols.append(c)
            p, npos = child, npos * slots
        else:  # pragma: no cover - Level validates kinds
            raise InternalError(f"unknown level kind {lv.kind!r}")
    stored = [None] * len(fmt.levels)
    for k, o in enumerate(fmt.order):
        stored[o] = cols[k]
    values = vals[p]
    if fmt.block:
        n = fmt.ndim
        logical = [stored[i] * fmt.block[i] + stored[n + i] for i in range(n)]
    else:
        logical = stored
    coords = torch.stack(logical) if logical[0].numel() else torch.zeros((fmt.ndim, 0), dtype=_I64)
    return (coords, values, p) if positions else (coords, values)


# --------------------------------------------------------------- coordinates -> storage

def _sort_key(lc: torch.Tensor, sizes) -> torch.Tensor | None:
    """Linear index of each entry in level order, or None if it could overflow int64."""
    if math.prod(max(s, 1) for s in sizes) >= 2**62:
        return None
    key = torch.zeros(lc.shape[1], dtype=_I64)
    for k, s in enumerate(sizes):
        key.mul_(s).add_(lc[k])
    return key


def sort_keys(key: torch.Tensor, bound: int):
    """``(sorted, order)`` of 1-d int64 ``key`` (every key in ``[0, bound)``), as
    ``torch.sort(key, stable=True)`` gives them.  Where each key times the entry count fits
    in 63 bits the entry's index rides in the key's low bits and numpy sorts plain int64s
    (SIMD sorts where numpy has them): 10K keys 460 -> 45 us, 1M 13 -> 9 ms on 2 cores,
    where torch.sort spends ~0.4 ms on any input over a few thousand."""
    nnz = key.numel()
    shift = max(nnz - 1, 1).bit_length()
    if bound > 2 ** (63 - shift) or key.dtype != _I64:
        return torch.sort(key, stable=True)
    packed = np.sort((key.contiguous().numpy() << shift) | np.arange(nnz, dtype=np.int64))
    return torch.from_numpy(packed >> shift), torch.from_numpy(packed & ((1 << shift) - 1))


def sorted_unique(key: torch.Tensor) -> torch.Tensor:
    """The distinct values of 1-d ``key``, ascending (``torch.unique(key)``, through numpy's
    sort: 450 -> ~40 us for 10K keys)."""
    out = np.sort(key.contiguous().numpy())
    if out.size > 1:
        keep = np.empty(out.size, dtype=bool)
        keep[0] = True
        np.not_equal(out[1:], out[:-1], out=keep[1:])
        out = out[keep]
    return torch.from_numpy(out)


def _decode(key: torch.Tensor, sizes) -> torch.Tensor:
    """Level coordinates of linear keys (the inverse of :func:`_sort_key`)."""
    out = torch.empty((len(sizes), key.numel()), dtype=_I64)
    rest = key
    for k in reversed(range(len(sizes))):
        if k == 0:
            out[0] = rest
        else:
            q = torch.div(rest, sizes[k], rounding_mode="floor")
            torch.sub(rest, q * sizes[k], out=out[k])
            rest = q
    return out


def _sort_and_sum(lc: torch.Tensor, vals: torch.Tensor, sizes):
    """Sort entries lexicographically by level coordinates and sum duplicates."""
    nnz = lc.shape[1]
    if nnz < 2:
        return lc, vals
    key = _sort_key(lc, sizes)
    if key is not None:
        if not bool((key[1:] >= key[:-1]).all()):
            key, perm = sort_keys(key, math.prod(max(s, 1) for s in sizes))
            lc, vals = _decode(key, sizes), vals[perm]  # cheaper than gathering every level
        new = torch.ones(nnz, dtype=torch.bool)
        torch.ne(key[1:], key[:-1], out=new[1:])
    else:  # huge index space: stable sorts from the innermost level outwards
        perm = torch.arange(nnz)
        for k in reversed(range(lc.shape[0])):
            perm = perm[torch.sort(lc[k, perm], stable=True).indices]
        lc, vals = lc[:, perm], vals[perm]
        new = torch.ones(nnz, dtype=torch.bool)
        new[1:] = (lc[:, 1:] != lc[:, :-1]).any(0)
    if bool(new.all()):
        return lc, vals
    group = torch.cumsum(new, 0) - 1
    summed = torch.zeros(int(group[-1]) + 1, dtype=vals.dtype).index_add_(0, group, vals)
    return lc[:, new], summed


def _chain_end(levels, k: int) -> int:
    """Last level of the singleton chain that follows nonunique level k."""
    e = k
    while not levels[e].unique:
        e += 1
    return e


def build(fmt: Format, shape, coords: torch.Tensor, vals: torch.Tensor, index_dtype=None):
    """Storage of ``fmt`` holding ``vals`` at ``coords`` (``ndim x nnz`` int64,
    validated by the caller); duplicates are summed.  Returns ``(pos, crd, vals)``."""
    shape = tuple(shape)
    if fmt.block:
        b = torch.tensor(fmt.block, dtype=_I64).unsqueeze(1)
        stored = torch.cat([torch.div(coords, b, rounding_mode="floor"), coords % b])
    else:
        stored = coords
    sizes = fmt.level_sizes(shape)
    lc = stored[list(fmt.order)] if stored.shape[1] else torch.zeros((len(sizes), 0), dtype=_I64)
    given = vals
    lc, vals = _sort_and_sum(lc, vals, sizes)
    nnz = lc.shape[1]
    if not fmt.block and [lv.kind for lv in fmt.levels] == ["dense"] * (len(sizes) - 1) + ["compressed"]:
        # CSR-like: the sorted, summed entries are the compressed level's positions in order,
        # so pos counts them per row and nothing is masked or scattered (1M entries: 16-43 -> 9-12 ms)
        rows = lc[0] if len(sizes) > 1 else torch.zeros(nnz, dtype=_I64)
        for k in range(1, len(sizes) - 1):
            rows = rows * sizes[k] + lc[k]
        pos = [None] * (len(sizes) - 1) + [_counts_to_pos(rows, math.prod(sizes[:-1]))]
        crd = [None] * (len(sizes) - 1) + [lc[-1].clone()]  # not a view keeping every level's array
        return _cast_indices(fmt, shape, pos, crd, index_dtype), (vals.clone() if vals is given else vals)

    pos: list = [None] * len(sizes)
    crd: list = [None] * len(sizes)
    p = torch.zeros(nnz, dtype=_I64)
    npos = 1
    chain_new = None  # entries that start a new position in the current nonunique chain
    for k, lv in enumerate(fmt.levels):
        c, n = lc[k], sizes[k]
        if lv.kind == "dense":
            p = p * n + c
            npos *= n
        elif lv.kind == "singleton":
            crd[k] = c[chain_new]
        else:  # compressed or padded: positions are the distinct (parent, coordinate...) prefixes
            last = _chain_end(fmt.levels, k) if lv.kind == "compressed" else k
            new = torch.ones(nnz, dtype=torch.bool)
            if nnz > 1:
                diff = p[1:] != p[:-1]
                for j in range(k, last + 1):
                    diff |= lc[j, 1:] != lc[j, :-1]
                new[1:] = diff
            q = torch.cumsum(new, 0) - 1
            parents = p[new]
            if lv.kind == "compressed":
                crd[k] = c[new]
                pos[k] = _counts_to_pos(parents, npos)
                p, npos, chain_new = q, crd[k].numel(), new
            else:
                # per parent that has entries (sorted): a count per parent position was an array the
                # size of the padded level's rows, allocated before check_padding could refuse it
                held, counts = torch.unique_consecutive(parents, return_counts=True)
                slots = int(counts.max()) if nnz else 0
                check_padding(npos, slots, nnz, vals.element_size(), shape)
                first = torch.cumsum(counts, 0) - counts
                slot = q - first[torch.searchsorted(held, p)] if nnz else q
                p = p * slots + slot
                crd[k] = torch.full((npos * slots,), -1, dtype=_I64)
                crd[k][p] = c
                npos *= slots
    out_vals = torch.zeros(npos, dtype=vals.dtype)
    out_vals[p] = vals
    return _cast_indices(fmt, shape, pos, crd, index_dtype), out_vals


def check_padding(rows: int, slots: int, nnz: int, value_size: int, shape) -> None:
    """Refuse a padded level (ELL) whose ``rows x slots`` -- every row padded to the longest -- would
    take more than ``config.dense_fallback_max_bytes`` (and many times what is stored): one dense
    row of a 10^5 x 10^5 matrix asked for 80 GB."""
    limit, total = config.dense_fallback_max_bytes, rows * slots
    if limit is not None and total > 4 * max(nnz, 1 << 22) and total * (8 + value_size) > limit:
        raise NotSupportedError(f"a padded level (ELL) of shape {tuple(shape)} pads its {rows} rows to the longest "
                                f"({slots} entries): {total * (8 + value_size) / 2**30:.1f} GiB for {nnz} stored, over "
                                f"scorch.config.dense_fallback_max_bytes = {limit / 2**30:.1f} GiB; a format without "
                                "padding (csr, coo) stores only what is there")


def coo_to_csr(shape, pos, crd, vals, index_dtype=None):
    """2-d COO storage (preset order: sorted by row, then column, no duplicates -- what
    validation and every builder guarantee) as CSR ``(pos, crd), vals``: the rows' entries
    counted, the columns and values copied (1M entries: 9-12 ms through :func:`build`)."""
    pos = [None, _counts_to_pos(crd[0], shape[0])]
    return _cast_indices(preset("csr", 2), shape, pos, [None, crd[1].clone()], index_dtype), vals.clone()


def csr_to_coo(shape, pos, crd, vals, index_dtype=None):
    """2-d CSR storage as COO ``(pos, crd), vals``: each entry's row from the row positions, the
    columns and values copied (1M entries: 17 ms through :func:`coords_of` and :func:`build`)."""
    p = pos[1].to(_I64)
    rows = torch.repeat_interleave(torch.arange(shape[0], dtype=_I64), p[1:] - p[:-1], output_size=crd[1].numel())
    out_pos = [torch.tensor([0, crd[1].numel()], dtype=_I64), None]
    return _cast_indices(preset("coo", 2), shape, out_pos, [rows, crd[1].to(_I64)], index_dtype), vals.clone()


def bsr_to_csr(shape, block, pos, crd, vals, index_dtype=None):
    """2-d BSR storage as CSR ``(pos, crd), vals``, every stored block's values kept (explicit
    zeros too, as scipy and torch keep them) without sorting: the value at row r, column c of
    the k-th block of block row I goes to CSR position ``pos[I] bh bw + r nb(I) bw + k bw + c``
    (``nb(I)`` blocks in block row I).  1M nonzeros (4M stored): 85-150 ms through a sort."""
    bh, bw = block
    p = pos[1].to(_I64)
    nbr, nblocks = p.numel() - 1, crd[1].numel()
    nb = p[1:] - p[:-1]
    brow = torch.repeat_interleave(torch.arange(nbr, dtype=_I64), nb, output_size=nblocks)
    start, count = p[brow].view(-1, 1, 1), nb[brow].view(-1, 1, 1)
    k = torch.arange(nblocks, dtype=_I64).view(-1, 1, 1) - start
    r = torch.arange(bh, dtype=_I64).view(1, -1, 1)
    c = torch.arange(bw, dtype=_I64).view(1, 1, -1)
    dst = (start * (bh * bw) + r * (count * bw) + k * bw + c).reshape(-1)
    out_vals = torch.empty(nblocks * bh * bw, dtype=vals.dtype)
    out_vals[dst] = vals.reshape(-1)
    out_crd = torch.empty(nblocks * bh * bw, dtype=_I64)
    out_crd[dst] = (crd[1].to(_I64).view(-1, 1, 1) * bw + c).expand(nblocks, bh, bw).reshape(-1)
    out_pos = torch.zeros(nbr * bh + 1, dtype=_I64)
    torch.cumsum(torch.repeat_interleave(nb * bw, bh), 0, out=out_pos[1:])
    return _cast_indices(preset("csr", 2), shape, [None, out_pos], [None, out_crd], index_dtype), out_vals


def ell_to_csr(shape, crd, vals, index_dtype=None):
    """2-d ELL storage (``crd[1]``: each row's slots, unused ones -1, the used ones in column
    order) as CSR ``(pos, crd), vals``: the used slots kept in their order, no sort."""
    c = crd[1].reshape(shape[0], crd[1].numel() // shape[0] if shape[0] else 0)
    used = c >= 0
    counts = used.sum(1)
    pos = torch.zeros(shape[0] + 1, dtype=_I64)
    torch.cumsum(counts, 0, out=pos[1:])
    flat = used.reshape(-1)
    return _cast_indices(preset("csr", 2), shape, [None, pos], [None, crd[1][flat].to(_I64)], index_dtype), \
        vals[flat]


def csr_to_ell(shape, pos, crd, vals, index_dtype=None):
    """2-d CSR storage as ELL ``(pos, crd), vals``: each row's entries in its first slots (as
    many as the longest row has), the rest -1 with zero values; no sort."""
    p = pos[1].to(_I64)
    n, nnz = shape[0], crd[1].numel()
    counts = p[1:] - p[:-1]
    slots = int(counts.max()) if n and nnz else 0
    check_padding(n, slots, nnz, vals.element_size(), shape)
    rows = torch.repeat_interleave(torch.arange(n, dtype=_I64), counts, output_size=nnz)
    at = rows * slots + (torch.arange(nnz, dtype=_I64) - p[rows])
    out_crd = torch.full((n * slots,), -1, dtype=_I64)
    out_crd[at] = crd[1].to(_I64)
    out_vals = torch.zeros(n * slots, dtype=vals.dtype)
    out_vals[at] = vals
    return _cast_indices(preset("ell", 2), shape, [None, None], [None, out_crd], index_dtype), out_vals


def compress_outer(pos, crd):
    """2-d CSR-like storage (``pos`` / ``crd`` of its compressed inner level) with the outer
    level compressed too (CSR -> DCSR, CSC -> DCSC): the rows holding entries, their
    positions.  ``(pos, crd)`` per level, the inner arrays shared, in the same index type."""
    p = pos[1]
    counts = p[1:] - p[:-1]
    rows = torch.nonzero(counts).reshape(-1).to(p.dtype)
    inner = torch.cat([p[:-1][counts > 0], p[-1:]])
    return [torch.tensor([0, rows.numel()], dtype=p.dtype), inner], [rows, crd[1]]


def expand_outer(pos, crd, n: int):
    """The inverse of :func:`compress_outer`: DCSR -> CSR, DCSC -> CSC over ``n`` outer coordinates."""
    rows, inner = crd[0].to(_I64), pos[1]
    counts = torch.zeros(n + 1, dtype=_I64)
    counts[rows + 1] = (inner[1:] - inner[:-1]).to(_I64)
    return [None, torch.cumsum(counts, 0).to(inner.dtype)], [None, crd[1]]


# --------------------------------------------------------------- index width

def positions_per_level(fmt: Format, shape, crd) -> list[int]:
    sizes = fmt.level_sizes(shape)
    out, npos = [], 1
    for k, lv in enumerate(fmt.levels):
        if lv.kind == "dense":
            npos *= sizes[k]
        elif lv.kind != "singleton":
            npos = crd[k].numel()
        out.append(npos)
    return out


def count_used(fmt: Format, shape, pos, crd) -> int:
    """Stored entries, not counting positions under unused padded slots (ELL padding)."""
    sizes = fmt.level_sizes(shape)
    used = torch.ones(1, dtype=torch.bool)  # per position of the current level
    for k, lv in enumerate(fmt.levels):
        if lv.kind == "dense":
            used = used.repeat_interleave(sizes[k])
        elif lv.kind == "compressed":
            counts = (pos[k][1:] - pos[k][:-1]).to(_I64)
            used = used.repeat_interleave(counts, output_size=crd[k].numel())
        elif lv.kind == "padded":
            slots = crd[k].numel() // used.numel() if used.numel() else 0
            used = used.repeat_interleave(slots) & (crd[k] >= 0)
    return int(used.sum())


def auto_index_dtype(fmt: Format, shape, crd) -> torch.dtype:
    """int32 when every coordinate and position fits, else int64."""
    biggest = max(list(fmt.level_sizes(shape)) + positions_per_level(fmt, shape, crd) + [0])
    return torch.int32 if biggest <= _INT32_MAX else _I64


def _cast_indices(fmt, shape, pos, crd, index_dtype):
    want = auto_index_dtype(fmt, shape, crd)
    if index_dtype is None:
        index_dtype = want
    elif index_dtype == torch.int32 and want == _I64:
        raise ScorchValueError(
            f"index_dtype=torch.int32 cannot hold this tensor (shape {shape}, "
            f"{max(positions_per_level(fmt, shape, crd) + [0])} positions); use torch.int64")
    pos = tuple(None if t is None else t.to(index_dtype) for t in pos)
    crd = tuple(None if t is None else t.to(index_dtype) for t in crd)
    return pos, crd


def recast(fmt, shape, pos, crd, index_dtype):
    """The same storage with indices of ``index_dtype`` (None: automatic)."""
    return _cast_indices(fmt, shape, pos, crd, index_dtype)


# --------------------------------------------------------------- dense <-> storage

def is_all_dense(fmt: Format) -> bool:
    """Unblocked and dense at every level: the storage is the dense tensor itself."""
    return not fmt.block and all(lv.kind == "dense" for lv in fmt.levels)


def from_dense(fmt: Format, x: torch.Tensor, index_dtype=None):
    """Storage of ``fmt`` for the dense tensor ``x`` (stores its nonzeros; NaN counts as nonzero)."""
    if is_all_dense(fmt):
        vals = x.permute(fmt.order).reshape(-1).clone()
        n = len(fmt.levels)
        return ((None,) * n, (None,) * n), vals
    coords = x.nonzero().t()
    vals = x[tuple(coords)] if coords.shape[1] else torch.zeros(0, dtype=x.dtype)
    return build(fmt, x.shape, coords.contiguous(), vals, index_dtype)


def to_dense(fmt: Format, shape, pos, crd, vals) -> torch.Tensor:
    if is_all_dense(fmt):
        inv = [0] * len(fmt.order)
        for k, o in enumerate(fmt.order):
            inv[o] = k
        return vals.reshape(fmt.level_sizes(shape)).permute(inv).contiguous()
    coords, values = coords_of(fmt, shape, pos, crd, vals)
    out = torch.zeros(shape, dtype=vals.dtype, device=vals.device)
    if values.numel():
        out.index_put_(tuple(coords), values)
    return out
