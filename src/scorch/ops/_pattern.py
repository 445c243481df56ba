"""Reading values at a SparseTensor's stored positions: pattern equality and projection."""

from __future__ import annotations

import torch

from ..convert import coords_of
from ..tensor import SparseTensor


def same_pattern(a: SparseTensor, b: SparseTensor) -> bool:
    """``a`` and ``b`` store the same positions (cheap when they share index arrays)."""
    if a is b:
        return True
    if a._format != b._format or a._shape != b._shape:
        return False
    for x, y in zip(a._pos + a._crd, b._pos + b._crd):
        if x is y:
            continue
        if x is None or y is None or x.shape != y.shape or not torch.equal(x, y):
            return False
    return True


def stored(x: SparseTensor):
    """``(coords, where)``: the coordinates of ``x``'s stored entries and their positions in
    ``x.values()`` (ELL's unused slots left out)."""
    coords, _, where = coords_of(x._format, x._shape, x._pos, x._crd, x._vals, positions=True)
    return coords, where


def project(g, x: SparseTensor, at=None) -> torch.Tensor:
    """The values of ``g`` (dense or sparse) at ``x``'s stored positions, aligned with ``x.values()``
    (``at``: :func:`stored` of ``x``, when the caller has it already); differentiable w.r.t. ``g``
    (a double backward reads gradients through it)."""
    tracked = isinstance(g, SparseTensor) and g.requires_grad and torch.is_grad_enabled()
    if isinstance(g, SparseTensor) and same_pattern(g, x):
        return g.values() if tracked else g._vals
    coords, where = stored(x) if at is None else at
    out = torch.zeros(x._vals.numel(), dtype=g.dtype)
    if not coords.shape[1]:
        return out
    if tracked:   # g's values by position, so that the read stays in the graph
        pos = positions(g, coords)
        read = torch.where(pos >= 0, g.values()[pos.clamp(min=0)], torch.zeros((), dtype=g.dtype))
    elif isinstance(g, SparseTensor):
        read = _lookup(g, coords)
    else:
        read = g[tuple(coords)]
    return out.index_put((where,), read)   # (out of place: under vmap, a batched g gives a batched result)


def positions(x: SparseTensor, coords: torch.Tensor) -> torch.Tensor:
    """Each coordinate's position in ``x.values()``, -1 where ``x`` stores nothing there."""
    return _lookup(x._positions(), coords.to(torch.int64)).long() - 1


def in_pattern(x: SparseTensor, values: torch.Tensor) -> SparseTensor:
    """``x``'s pattern holding ``values``: in the autograd graph when grad mode is on (a backward
    run with ``create_graph=True``), else without the graph's bookkeeping."""
    if torch.is_grad_enabled() and values.requires_grad:
        return x.detach().with_values(values)
    return x._like(values=values, nnz=x._stored)


def _lookup(g: SparseTensor, coords: torch.Tensor) -> torch.Tensor:
    """Values of sparse ``g`` at ``coords`` (zero where ``g`` stores nothing), by key search."""
    gc, gv = g.coo()
    strides = torch.ones(len(g.shape), dtype=torch.int64)
    for d in range(len(g.shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * g.shape[d + 1]
    gkey = (gc * strides.unsqueeze(1)).sum(0)
    order = torch.argsort(gkey)
    gkey, gv = gkey[order], gv[order]
    key = (coords * strides.unsqueeze(1)).sum(0)
    at = torch.searchsorted(gkey, key).clamp(max=max(gkey.numel() - 1, 0))
    hit = gkey.numel() > 0
    found = (gkey[at] == key) if hit else torch.zeros_like(key, dtype=torch.bool)
    return torch.where(found, gv[at] if hit else torch.zeros(key.shape, dtype=gv.dtype), torch.zeros((), dtype=gv.dtype))
