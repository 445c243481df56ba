"""Register blocking of a row loop: unroll-and-jam on the loop IR (IR -> IR).

A row loop whose body keeps its output row in vector registers and whose inner loops do
not depend on the row (a dense ``A[i, j]`` times ``B[j, :]``: a GEMM, or a dense-format
operand) loads every vector of ``B`` once per row and uses it for one FMA: loads, not
arithmetic, bound it, and each accumulator is a chain of dependent FMAs.  Jamming ``R``
consecutive rows into one body shares each loaded vector across ``R`` rows' accumulators
(``R`` FMAs per load, ``R`` times as many independent chains) -- the register tile of a
BLAS micro-kernel, derived from the loop nest instead of written by hand.  The last
``(hi - lo) % R`` rows run the original body.

Only straight-line bodies are jammed (declarations, assignments, calls and ``for`` loops
whose bounds do not depend on the row); anything else returns None and the loop stays
as it is.  Nothing here knows about formats or C.
"""

from __future__ import annotations

import dataclasses

from .ir import Assign, Bin, Block, Call, Const, Decl, Eval, Expr, For, Stmt, Var

__all__ = ["jam_rows", "reads", "substitute"]


def substitute(node, names: dict):
    """``node`` with every ``Var(name)`` for ``name`` in ``names`` replaced by ``names[name]``
    (an Expr) and every declaration of such a name renamed to the replacement's name."""
    if isinstance(node, Var):
        return names.get(node.name, node)
    if isinstance(node, tuple):
        return tuple(substitute(x, names) for x in node)
    if not dataclasses.is_dataclass(node):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        old = getattr(node, f.name)
        new = substitute(old, names) if isinstance(old, (Expr, Stmt, tuple)) else old
        if isinstance(node, Decl) and f.name == "name" and old in names:
            new = names[old].name
        if new is not old:
            changes[f.name] = new
    return dataclasses.replace(node, **changes) if changes else node


def reads(node, out: set) -> set:
    """Names of the variables an IR node reads (assignment targets included)."""
    if isinstance(node, Var):
        out.add(node.name)
    elif isinstance(node, tuple):
        for x in node:
            reads(x, out)
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if isinstance(v, (Expr, Stmt, tuple)):
                reads(v, out)
    return out


class _Jam:
    def __init__(self, var: str, factor: int, per_row: set):
        self.var, self.factor, self.per_row = var, factor, set(per_row)
        self.local = set(per_row)   # names declared inside the body

    def copies(self, stmt) -> list:
        out = []
        for r in range(self.factor):
            names = {n: Var(f"{n}_r{r}") for n in self.per_row}
            out.append(substitute(stmt, names))
        return out

    def block(self, stmts) -> list | None:
        out = []
        for s in stmts:
            if isinstance(s, For):
                if reads((s.lo, s.hi), set()) & self.per_row:
                    return None   # bounds that depend on the row (a compressed level): rows differ
                inner = self.block(s.body.body)
                if inner is None:
                    return None
                out.append(dataclasses.replace(s, body=Block(tuple(inner))))
            elif isinstance(s, Block):
                inner = self.block(s.body)
                if inner is None:
                    return None
                out += inner
            elif isinstance(s, (Decl, Assign, Eval)):
                if isinstance(s, Decl):
                    self.local.add(s.name)
                if reads(s, set()) & self.per_row or (isinstance(s, Decl) and s.name in self.per_row):
                    if isinstance(s, Decl):
                        self.per_row.add(s.name)
                    out += self.copies(s)
                elif isinstance(s, Decl) or _idempotent(s, self.local):
                    out.append(s)   # shared by every row of the block (a load of B's vector)
                else:
                    return None     # an effect that each row would repeat: not jammed
            else:
                return None
        return out


def _idempotent(s, local: set) -> bool:
    """A row-independent statement that may run once for a block of rows: a prefetch, or an
    assignment to a variable declared inside the body (each row would compute the same)."""
    if isinstance(s, Eval):
        return isinstance(s.value, Call) and s.value.fn == "__builtin_prefetch"
    return isinstance(s.target, Var) and s.target.name in local


def jam_rows(loop: For, factor: int) -> list | None:
    """``loop`` (over rows ``[lo, hi)``) as a loop over blocks of ``factor`` rows with the
    body jammed, then the original loop over the remaining rows; None if the body is not
    one this pass handles.  The top-level declarations of the body (the row's accumulators)
    are per row; so is everything that reads the row or a per-row name."""
    if factor < 2:
        return None
    top = {s.name for s in loop.body.body if isinstance(s, Decl)}
    jam = _Jam(loop.var, factor, top | {loop.var})
    body = jam.block(loop.body.body)
    if body is None:
        return None
    blk, n = f"{loop.var}_blk", Const(factor)
    first = loop.lo + Var(blk) * n
    rows = [Decl("const int64_t", f"{loop.var}_r{r}", first + Const(r) if r else first) for r in range(factor)]
    blocks = Bin("/", Bin("-", loop.hi, loop.lo), n)
    return [For(blk, Const(0), blocks, Block(tuple(rows + body))),
            dataclasses.replace(loop, lo=loop.lo + blocks * n)]
