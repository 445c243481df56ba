"""``rearrange``: einops-style reshaping, transposing and broadcasting by pattern.

This module owns the pattern language and its execution on dense tensors
(reshape / permute / expand with torch, views where torch gives them) and on
SparseTensors (on coordinates, never densified).

Patterns: ``"<left> -> <right>"``; each side lists the input's (output's)
dims, one axis name per dim or a parenthesised group ``(b n)`` whose axes are
merged row-major into one dim.  ``()`` and ``1`` are size-1 dims, ``...``
stands for the dims no name covers.  Two spellings:

* spaced (einops): ``"b d -> b n d"``, ``"(b n) d -> b n d"``, ``"b h w -> b w h"``;
* compact (the Scorch seed): ``"bd->bnd"`` -- when neither side contains
  whitespace, parentheses or anything but letters, every letter is one axis
  (``"bd -> bnd"`` too); for a 1-d input a one-word side is one axis, as einops
  reads ``"seq -> seq"``.

Sizes: an axis in a left group is inferred from the input when it is the only
axis of its group without a size in ``**sizes``.  An axis only on the right
is *new*: it needs a size and the input is repeated (broadcast) along it, so
``rearrange(x, "bd->bnd", n=N)`` turns ``(B, D)`` into ``(B, N, D)``.  Every
left axis must appear on the right (rearrange never reduces).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from ..errors import ScorchTypeError, ScorchValueError
from ..tensor import SparseTensor
from .shape import assemble, entries, ravel_coords, unravel_coords

__all__ = ["rearrange", "parse_pattern", "Pattern"]

ELLIPSIS = "..."
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern: per side, one entry per dim: a tuple of axis names (merged
    row-major; empty for a size-1 dim), or the bare string ``"..."`` for an ellipsis
    outside parentheses (inside them, ``"..."`` is one of the group's names)."""

    lhs: tuple
    rhs: tuple


# ================================================================ parsing (pure)

def parse_pattern(pattern: str, ndim: int | None = None) -> Pattern:
    """Parse ``"<left> -> <right>"`` (spaced or compact form, see the module docstring; ``ndim``:
    the input's, which settles a one-word left side)."""
    if not isinstance(pattern, str):
        raise ScorchTypeError(f"rearrange: pattern must be a str, got {type(pattern).__name__}")
    sides = pattern.split("->")
    if len(sides) != 2:
        raise ScorchValueError(f"rearrange: pattern {pattern!r} must contain '->' exactly once")
    left, right = (s.strip() for s in sides)
    compact = all(s.isascii() and s.isalpha() for s in (left, right) if s) \
        and not (ndim == 1 and len(left) > 1 and " " in pattern)   # "seq -> seq": einops' one axis
    parse = _parse_compact if compact else _parse_spaced
    lhs, rhs = parse(left, pattern), parse(right, pattern)
    if any(isinstance(g, tuple) and ELLIPSIS in g for g in lhs):
        raise ScorchValueError(f"rearrange: pattern {pattern!r}: '...' cannot be inside a group on the left")
    if _has_ellipsis(lhs) != _has_ellipsis(rhs):
        raise ScorchValueError(f"rearrange: pattern {pattern!r}: '...' must be on both sides or on neither")
    return Pattern(lhs, rhs)


def _parse_compact(side: str, pattern: str) -> tuple:
    groups = tuple((c,) for c in side)
    _check_unique(groups, pattern)
    return groups


def _parse_spaced(side: str, pattern: str) -> tuple:
    groups, group = [], None
    for tok in _TOKEN.findall(side):
        if tok == "(":
            if group is not None:
                raise ScorchValueError(f"rearrange: pattern {pattern!r}: nested parentheses in {side!r}")
            group = []
        elif tok == ")":
            if group is None:
                raise ScorchValueError(f"rearrange: pattern {pattern!r}: unmatched ')' in {side!r}")
            groups.append(tuple(group))
            group = None
        else:
            names = [] if tok == "1" else [_axis_name(tok, pattern)]
            if group is None:
                groups.append(ELLIPSIS if tok == ELLIPSIS else tuple(names))
            else:
                group.extend(names)
    if group is not None:
        raise ScorchValueError(f"rearrange: pattern {pattern!r}: unclosed '(' in {side!r}")
    _check_unique(groups, pattern)
    return tuple(groups)


def _axis_name(tok: str, pattern: str) -> str:
    if tok != ELLIPSIS and not tok.isidentifier():
        raise ScorchValueError(
            f"rearrange: pattern {pattern!r}: {tok!r} is not an axis name (expected an identifier, '1' or '...')")
    return tok


def _names(groups) -> list:
    """Every name on one side, in order (the bare ellipsis counts as the name '...')."""
    return [a for g in groups for a in ((g,) if g == ELLIPSIS else g)]


def _check_unique(groups, pattern: str) -> None:
    names = _names(groups)
    dup = sorted({a for a in names if names.count(a) > 1})
    if dup:
        raise ScorchValueError(f"rearrange: pattern {pattern!r}: axis {dup[0]!r} appears twice on one side")


def _has_ellipsis(groups) -> bool:
    return ELLIPSIS in _names(groups)


# ================================================================ planning

@dataclass(frozen=True)
class _Plan:
    lhs: tuple     # groups, ellipsis expanded
    rhs: tuple
    size: dict     # every axis -> its size
    new: tuple     # axes only on the right (broadcast), in right-side order

    @property
    def in_axes(self) -> list:
        return [a for g in self.lhs for a in g]

    @property
    def out_axes(self) -> list:
        return [a for g in self.rhs for a in g]

    @property
    def out_shape(self) -> tuple:
        return tuple(math.prod(self.size[a] for a in g) for g in self.rhs)


def _fail(pattern, shape, msg):
    return ScorchValueError(f"rearrange({pattern!r}) on input shape {tuple(shape)}: {msg}")


def _expand_ellipsis(pat: Pattern, ndim: int, pattern: str, shape) -> tuple:
    if not _has_ellipsis(pat.lhs):
        return pat.lhs, pat.rhs
    k = ndim - (len(pat.lhs) - 1)
    if k < 0:
        raise _fail(pattern, shape, f"the left side names {len(pat.lhs) - 1} dims besides '...', "
                                    f"more than the input's {ndim}")
    names = tuple(f"...{i}" for i in range(k))  # not identifiers: cannot clash with user names

    def expand(groups):  # a lone '...' becomes k dims; inside a group, k merged axes
        out = []
        for g in groups:
            if g == ELLIPSIS:
                out.extend((n,) for n in names)
            elif ELLIPSIS in g:
                i = g.index(ELLIPSIS)
                out.append(g[:i] + names + g[i + 1:])
            else:
                out.append(g)
        return tuple(out)

    return expand(pat.lhs), expand(pat.rhs)


def _check_sizes(sizes: dict, pattern: str, shape) -> dict:
    for name, s in sizes.items():
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise _fail(pattern, shape, f"size {name}={s!r} must be a non-negative int")
    return dict(sizes)


def _infer_group(group, dim: int, size: dict, pattern, shape, k: int) -> None:
    """Fill ``size`` for the axes of one left group of input dim ``k`` (size ``dim``)."""
    unknown = [a for a in group if a not in size]
    known = math.prod(size[a] for a in group if a in size)
    text = f"({' '.join(group)})" if len(group) != 1 else group[0]
    if len(unknown) > 1:
        raise _fail(pattern, shape, f"cannot infer the sizes of {', '.join(unknown)} in {text} "
                                    f"(dim {k} of size {dim}); pass all but one as keyword sizes")
    if unknown:
        if known == 0 or dim % known:
            raise _fail(pattern, shape, f"dim {k} of size {dim} cannot be split as {text} "
                                        f"with the given sizes (product {known})")
        size[unknown[0]] = dim // known
    elif known != dim:
        raise _fail(pattern, shape, f"dim {k} has size {dim}, but {text} has size {known}")


def plan(pattern: str, shape, sizes: dict) -> _Plan:
    """Resolve every axis size of ``pattern`` for an input of ``shape``."""
    shape = tuple(int(s) for s in shape)
    try:
        pat = parse_pattern(pattern, len(shape))
    except ScorchValueError as e:
        raise ScorchValueError(f"{e} (input shape {shape})") from None
    lhs, rhs = _expand_ellipsis(pat, len(shape), pattern, shape)
    if len(lhs) != len(shape):
        raise _fail(pattern, shape, f"the left side has {len(lhs)} dims, the input has {len(shape)}")
    size = _check_sizes(sizes, pattern, shape)
    left = {a for g in lhs for a in g}
    right = {a for g in rhs for a in g}
    stray = sorted(set(size) - left - right)
    if stray:
        raise _fail(pattern, shape, f"size given for unknown axis {stray[0]!r}")
    for k, (g, dim) in enumerate(zip(lhs, shape)):
        _infer_group(g, dim, size, pattern, shape, k)
    lost = [a for g in lhs for a in g if a not in right]
    if lost:
        raise _fail(pattern, shape, f"axis {lost[0]!r} of the left side is missing on the right "
                                    "(rearrange does not reduce)")
    new = tuple(a for g in rhs for a in g if a not in left)
    missing = [a for a in new if a not in size]
    if missing:
        raise _fail(pattern, shape, f"axis {missing[0]!r} is only on the right (a new, repeated axis): "
                                    f"pass its size, e.g. {missing[0]}=4")
    return _Plan(lhs, rhs, size, new)


# ================================================================ execution

def rearrange(x, pattern: str, **sizes):
    """Reshape, transpose, merge/split dims and broadcast new axes by ``pattern``.

    Dense tensors go through torch (a view when no new axis is added and torch can
    view); SparseTensors are rearranged on their coordinates (a new axis of size N
    repeats every stored entry N times) and keep their format name, adapted to the
    new number of dims.

    >>> import torch
    >>> from scorch.ops.rearrange import rearrange
    >>> rearrange(torch.ones(2, 3), "bd->bnd", n=4).shape
    torch.Size([2, 4, 3])
    >>> rearrange(torch.ones(6, 3), "(b n) d -> b n d", n=2).shape
    torch.Size([3, 2, 3])
    """
    if not isinstance(x, torch.Tensor):
        raise ScorchTypeError(f"rearrange: x must be a tensor, got {type(x).__name__}")
    p = plan(pattern, x.shape, sizes)
    return _rearrange_sparse(x, p) if isinstance(x, SparseTensor) else _rearrange_dense(x, p)


def _rearrange_dense(x: torch.Tensor, p: _Plan) -> torch.Tensor:
    in_axes, out_axes = p.in_axes, p.out_axes
    t = x.reshape([p.size[a] for a in in_axes])
    t = t.permute([in_axes.index(a) for a in out_axes if a not in p.new])
    for i, a in enumerate(out_axes):
        if a in p.new:
            t = t.unsqueeze(i)
    t = t.expand([p.size[a] for a in out_axes])
    return t.reshape(p.out_shape)


def _rearrange_sparse(x: SparseTensor, p: _Plan):
    coords, ids = entries(x)
    rows = {}
    for k, g in enumerate(p.lhs):
        rows.update(zip(g, unravel_coords(coords[k], [p.size[a] for a in g])))
    if p.new:
        reps = math.prod(p.size[a] for a in p.new)
        entry = torch.arange(ids.numel()).repeat_interleave(reps)
        rows = {a: r[entry] for a, r in rows.items()}
        combo = torch.arange(reps).repeat(ids.numel())
        rows.update(zip(p.new, unravel_coords(combo, [p.size[a] for a in p.new])))
        ids = ids[entry]
    nnz = ids.numel()
    out = [ravel_coords([rows[a] for a in g], [p.size[a] for a in g], nnz) for g in p.rhs]
    coords = torch.stack(out) if out else torch.zeros((0, nnz), dtype=torch.int64)
    return assemble(x._format, p.out_shape, coords, ids, x.values(), x.index_dtype)
