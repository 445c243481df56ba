"""Hypersparse results: assemble over the coordinates present, not over the dimensions.

An assembled result (SpGEMM, sparse + sparse, sparse * sparse) is built row by row: the
row counts and positions take one element per output row, and each thread's dense
workspace one per output column.  For a hypersparse product -- 2,000 entries in a
10^8 x 10^8 matrix -- that is gigabytes and seconds for a few thousand results.  When
those arrays would pass both :data:`MIN_ELEMENTS` and :data:`PER_ENTRY` times the
operands' stored entries, every index that only sparse operands carry and whose size
passes their stored entries (:data:`PER_INDEX`) is relabelled, in every operand alike, to
its rank among the coordinates the operands hold along it (a monotone map: fibres stay
sorted), the kernels run on the compacted operands, and the result's coordinates are
mapped back.  Exact: the map is one-to-one on every coordinate an operand holds, and a
sparse result is zero wherever its sparse operands are.  Without a ``format=``, a result whose
rows were compacted is DCSR-like (compressed rows; its CSR would hold one position per
row), else the CSR-like default.

Pure functions of the einsum, its operands and the schedule; :mod:`driver` calls them.
"""

from __future__ import annotations

import math

import torch

from .. import convert
from ..format import Format, compressed, dense, preset
from ..tensor import SparseTensor

MIN_ELEMENTS = 1 << 20  # row arrays + workspaces (elements) below which assembly never compacts
PER_ENTRY = 16          # ... nor while they stay within this many per stored operand entry
PER_INDEX = 1           # an index is compacted when its size passes this many per stored entry


def wide_indices(ein, ops, nthreads: int) -> tuple:
    """The indices to compact before assembling ``ein`` over ``ops`` (every operand's shape as
    in ``ein``), or () when the result's row arrays and workspaces are affordable."""
    out = ein.output
    if not out:
        return ()
    size = ein.size
    stored = sum(x._stored for x in ops if type(x) is SparseTensor)
    elements = math.prod(size[c] for c in out[:-1]) * 2 + nthreads * size[out[-1]] * 3
    if elements <= MIN_ELEMENTS or elements <= PER_ENTRY * stored:
        return ()
    return tuple(c for c in dict.fromkeys("".join(ein.inputs))
                 if size[c] > PER_INDEX * max(stored, 1)
                 and all(type(ops[k]) is SparseTensor for k in _carriers(ein, c)))


def _carriers(ein, c):
    return [k for k, t in enumerate(ein.inputs) if c in t]


def compact(ein, ops, indices) -> tuple:
    """``(ops, present)``: the operands with each index of ``indices`` relabelled to its rank
    among ``present[c]``, the sorted distinct coordinates the sparse operands hold along it.
    A relabelled operand is CSR-like in its own mode order (its outer level dense over the
    few coordinates left, so the kernels locate into it instead of co-iterating)."""
    coords = {}
    for c in indices:
        for k in _carriers(ein, c):
            if k not in coords:
                coords[k] = ops[k].coo()
    present = {c: convert.sorted_unique(torch.cat([coords[k][0][ein.inputs[k].index(c)] for k in _carriers(ein, c)]))
               for c in indices}
    out = list(ops)
    for k, (xc, vals) in coords.items():
        x, t = ops[k], ein.inputs[k]
        xc = xc.clone()
        for d, c in enumerate(t):
            if c in present:
                xc[d] = torch.searchsorted(present[c], xc[d])
        shape = tuple(present[c].numel() if c in present else n for c, n in zip(t, x.shape))
        order = tuple(range(x.dim())) if x.format.block else x.format.order
        levels = (compressed,) * x.dim()
        if x.dim() > 1:  # the outer level dense over the few coordinates left, the others compressed
            levels = (dense,) + levels[1:]
        fmt = Format(levels, order)
        (pos, crd), vals = convert.build(fmt, shape, xc, vals)
        out[k] = SparseTensor(fmt, shape, pos, crd, vals)
    return out, present


def expand(result: SparseTensor, ein, present: dict) -> SparseTensor:
    """The compacted einsum's ``result`` in the einsum's own shape: coordinates mapped back
    through ``present``; DCSR-like when rows were compacted, else CSR-like (the driver then
    converts to a ``format=`` asked for)."""
    shape = tuple(ein.size[c] for c in ein.output)
    if type(result) is not SparseTensor:  # the compacted schedule assembled densely
        from ..interop import as_sparse
        result = as_sparse(result, "coo")
    coords, vals = result.coo()
    coords = coords.clone()
    for d, c in enumerate(ein.output):
        if c in present:
            coords[d] = present[c][coords[d]]
    rows_compacted = any(c in present for c in ein.output[:-1])
    fmt = preset("dcsr" if rows_compacted else "csr", len(shape))
    (pos, crd), vals = convert.build(fmt, shape, coords, vals)
    return SparseTensor(fmt, shape, pos, crd, vals)


def note(indices, present, ein) -> str:
    """The plan's note for a compacted assembly."""
    parts = ", ".join(f"{c!r} {ein.size[c]:,} -> {present[c].numel():,}" for c in indices)
    return f"hypersparse result: assembled over the coordinates present ({parts})"
