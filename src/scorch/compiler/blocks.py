"""Dense row blocks: an SpMM's row loop over a compressed level, a few rows at a time
through a dense workspace where their columns cluster (IR -> IR).

The row-wise SpMM loads a row of the dense operand ``X`` for every stored entry and uses
it for one row's accumulators.  When consecutive rows store nearly the same columns -- a
band (sliding-window attention), blocks, a mesh -- each row of ``X`` is loaded once per
row that uses it, from L2 rather than registers.  Here a block of ``R`` rows whose stored
columns span a window ``[lo, hi]`` at most twice as wide as their entries (and at most
``wmax`` columns) is scattered into an ``R x W`` dense workspace (zeros elsewhere) and
multiplied by the window's rows of ``X`` with the loop body jammed across the ``R`` rows
(:func:`.jam.jam_rows`): each loaded vector of ``X`` feeds ``R`` rows' accumulators.
Other blocks, and the last ``(hi - lo) % R`` rows, run the row loop as it was.  The test
is made per block at run time, cheaply first (the columns of the block's first and last
entries); after ``MISSES`` sparse blocks in a row a thread keeps to the row loop for the
rest of its rows, so a graph with scattered columns pays for a handful of tests.

Only the shape lowering gives an SpMM row loop is rewritten (position declarations, vector
accumulators, one walk over the compressed level binding the column and the stored value,
vector accumulations, stores); anything else returns None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .ir import Assign, Bin, Block, Break, Call, Cast, Const, Decl, Expr, For, Forever, If, Load, Var
from .jam import jam_rows, reads, substitute

__all__ = ["MISSES", "Rows", "dense_blocks", "row_blocks"]

# the names the block driver binds (dense statements read FIRST_ROW, WINDOW_LO, WINDOW)
_I0, _LO, _HI, _CNT, _W, _NB, _WS = "blk_i0_", "blk_lo_", "blk_hi_", "blk_n_", "blk_w_", "blk_nb_", "blk_ws_"
FIRST_ROW, WINDOW_LO, WINDOW = _I0, _LO, _W
_A, _B, _C, _ROW, _BLK, _DENSE, _MISS = "blk_a_", "blk_b_", "blk_c_", "blk_row_", "blk_", "blk_dense_", "blk_miss_"
MISSES = 8  # sparse blocks in a row after which a thread keeps to the row-wise loop


@dataclass(frozen=True)
class Rows:
    """What the block driver needs of a row loop over a compressed level: ``head`` (the row
    body's position declarations), ``lo`` / ``hi`` (the row's entry range, over them),
    ``crd`` (the column of an entry, as int64, given its position), ``ncols``."""
    head: tuple
    lo: Expr
    hi: Expr
    crd: Callable
    ncols: Expr


def row_blocks(loop: For, factor: int, rows: Rows, dense: tuple, workspace: tuple, wmax: int) -> list:
    """``loop`` as blocks of ``factor`` rows: a block whose stored columns span a window at
    most twice its entries and at most ``wmax`` wide runs ``dense`` (statements that read the
    block's first row ``blk_i0_``, window start ``blk_lo_`` and width ``blk_w_``), any other
    block and the last rows run ``loop``'s body.  ``workspace``: declarations made once,
    before the blocks.  Shared by the SpMM and SDDMM forms."""
    i, R = loop.var, Const(factor)
    span = (Var(_I0), Var(_I0) + R)
    bounds = tuple(rows.head) + (Decl("const int64_t", _A, rows.lo), Decl("const int64_t", _B, rows.hi))
    scan = For(i, *span, Block(bounds + (If(Var(_A).lt(Var(_B)), Block((
        Assign(Var(_LO), Call("SCORCH_MIN", (Var(_LO), rows.crd(Var(_A))))),
        Assign(Var(_HI), Call("SCORCH_MAX", (Var(_HI), rows.crd(Var(_B) - Const(1))))),
        Assign(Var(_CNT), Var(_B) - Var(_A), "+=")))),)))
    # A cheap test first: the columns of the block's first and last entries bound its window
    # from inside (W >= their distance), so a block with scattered columns is sent row by row
    # after four loads; only a block that may be dense enough is scanned row by row.
    ends = (For(i, Var(_I0), Var(_I0) + Const(1), Block(tuple(rows.head) + (Assign(Var(_A), rows.lo),))),
            For(i, Var(_I0) + R - Const(1), Var(_I0) + R, Block(tuple(rows.head) + (Assign(Var(_B), rows.hi),))))
    may = Bin("&&", Var(_A).lt(Var(_B)),
              Bin("<=", (rows.crd(Var(_B) - Const(1)) - rows.crd(Var(_A)) + Const(1)) * R,
                  Const(2) * (Var(_B) - Var(_A))))
    is_dense = Bin("&&", Bin("&&", Var(_HI).ge(Const(0)), Bin("<=", Var(_W), Const(wmax))),
                   Bin("<=", Var(_W) * R, Const(2) * Var(_CNT)))
    # A thread gives up on blocks after MISSES sparse ones in a row and runs the rest of its
    # rows with the plain loop: a graph with scattered columns pays for a few tests, not one
    # per block.
    block = Block((
        If(Bin("||", Bin(">=", Var(_BLK), Var(_NB)), Bin(">=", Var(_MISS), Const(MISSES))), Block((Break(),))),
        Decl("const int64_t", _I0, loop.lo + Var(_BLK) * R),
        Decl("int64_t", _A, Const(0)), Decl("int64_t", _B, Const(0)), *ends,
        Decl("int64_t", _LO, rows.ncols), Decl("int64_t", _HI, Const(-1)), Decl("int64_t", _CNT, Const(0)),
        Decl("int64_t", _W, Const(0)), Decl("int64_t", _DENSE, Const(0)),
        If(may, Block((scan, Assign(Var(_W), Var(_HI) - Var(_LO) + Const(1)), Assign(Var(_DENSE), is_dense)))),
        If(Var(_DENSE), Block(tuple(dense) + (Assign(Var(_MISS), Const(0)),)),
           Block((For(i, *span, loop.body), Assign(Var(_MISS), Const(1), "+=")))),
        Assign(Var(_BLK), Const(1), "+=")))
    nb = Bin("/", Bin("-", loop.hi, loop.lo), R)
    return [*workspace, Decl("const int64_t", _NB, nb), Decl("int64_t", _BLK, Const(0)),
            Decl("int64_t", _MISS, Const(0)), Forever(block), For(i, loop.lo + Var(_BLK) * R, loop.hi, loop.body)]


def dense_blocks(loop: For, factor: int, vtype: str, wmax: int = 2048) -> list | None:
    """``loop`` (an SpMM's row loop) as blocks of ``factor`` rows that run through a dense
    workspace when their columns cluster (see the module docstring); None if its body is
    not the row-wise SpMM shape."""
    parts = _parts(loop)
    if parts is None or factor < 2:
        return None
    head, accs, walk, col, value, assigns, stores = parts
    i, q, j = loop.var, walk.var, col.name
    span = (Var(_I0), Var(_I0) + Const(factor))
    row_ws = (Var(i) - Var(_I0)) * Var(_W)
    fill = For(i, *span, Block(tuple(head) + (
        Decl("const int64_t", _A, walk.lo), Decl("const int64_t", _B, walk.hi),
        Decl(f"{vtype} * restrict", _ROW, Var(_WS) + row_ws),
        For(_C, Const(0), Var(_W), Block((Assign(Load(Var(_ROW), Var(_C)), Const(0.0)),)), simd=True),
        For(q, Var(_A), Var(_B), Block((Assign(Load(Var(_ROW), col.value - Var(_LO)), value.value),))))))
    window = For(_C, Const(0), Var(_W), Block((
        Decl("const int64_t", j, Var(_LO) + Var(_C)),
        Decl(value.ctype, value.name, Load(Var(_WS), row_ws + Var(_C))), *assigns)))
    jammed = jam_rows(For(i, *span, Block(tuple(accs) + (window,) + tuple(stores))), factor)
    if jammed is None:
        return None
    rows = Rows(tuple(head), walk.lo, walk.hi, lambda e: substitute(col.value, {q: e}), Var(f"n_{j}"))
    return row_blocks(loop, factor, rows, (fill, jammed[0]), (Decl(vtype, f"{_WS}[{factor * wmax}]"),), wmax)


def _parts(loop: For):
    """``(head, accumulators, walk, column decl, value decl, accumulations, stores)`` of an
    SpMM row body, or None."""
    body = list(loop.body.body)
    k = 0
    while k < len(body) and isinstance(body[k], Decl) and not body[k].ctype.startswith("scorch_vec_"):
        k += 1
    head = body[:k]
    accs = []
    while k < len(body) and isinstance(body[k], Decl) and body[k].ctype.startswith("scorch_vec_"):
        accs.append(body[k])
        k += 1
    if not accs or k >= len(body) or not isinstance(body[k], For):
        return None
    walk, stores = body[k], body[k + 1:]
    names = {a.name for a in accs}
    if not stores or not all(isinstance(s, Assign) and s.op == "=" and reads(s.value, set()) <= names
                             for s in stores):
        return None
    inner = [s for s in walk.body.body if not isinstance(s, If)]   # the prefetch ahead of the walk
    if any(isinstance(s, If) and reads(s, set()) & names for s in walk.body.body):
        return None
    if len(inner) < 3 or not all(isinstance(s, Decl) for s in inner[:2]):
        return None
    col, value, assigns = inner[0], inner[1], inner[2:]
    q = walk.var
    if not (isinstance(col.value, Cast) and isinstance(col.value.value, Load) and col.value.value.index == Var(q)):
        return None   # the column: crd[q]
    if q not in reads(value.value, set()):
        return None   # the stored value at q
    for s in assigns:
        if not (isinstance(s, Assign) and s.op == "+=" and isinstance(s.target, Var) and s.target.name in names
                and q not in reads(s.value, set())):
            return None
    if not _is_pos_range(walk):
        return None
    return head, accs, walk, col, value, assigns, stores


def _is_pos_range(walk: For) -> bool:
    """The walk runs over ``pos[p] .. pos[p + 1]`` (one row of a compressed level)."""
    lo, hi = walk.lo, walk.hi
    return (isinstance(lo, Cast) and isinstance(hi, Cast) and isinstance(lo.value, Load)
            and isinstance(hi.value, Load) and lo.value.array == hi.value.array
            and hi.value.index == lo.value.index + Const(1))
