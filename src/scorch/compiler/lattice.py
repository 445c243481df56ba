"""Merge lattices: which operands must be present for an expression to be nonzero.

At one loop variable, some operands are sparse (their level there is walked
by an iterator).  A lattice *point* is a set of those iterators together with
the expression that holds where exactly they have an entry (the others
contribute zero).  ``A*B`` has one point {A, B} (intersection); ``A+B`` has
{A, B}: A+B, {A}: A, {B}: B (union); ``A+X`` with X dense has {A}: A+X and
{}: X -- a point with no iterator means the loop must visit every coordinate.

Points are data, built from the definition (every subset of iterators whose
expression is not identically zero, less those a smaller point already
covers) and ordered largest first, so lowering emits cases in that order and
they are testable without C.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from .notation import Zero, without


@dataclass(frozen=True)
class Point:
    iterators: frozenset   # operand numbers that have an entry at this coordinate
    expr: object           # the expression there (absent operands already zeroed)

    def __str__(self):
        its = ",".join(f"T{t}" for t in sorted(self.iterators)) or "-"
        return f"{{{its}}}: {self.expr}"


def lattice(expr, sparse: frozenset) -> tuple:
    """Points of ``expr`` over the iterators ``sparse``, largest iterator set first."""
    sparse = frozenset(sparse)
    points = []
    for size in range(len(sparse), -1, -1):
        for present in combinations(sorted(sparse), size):
            e = without(expr, sparse - frozenset(present))
            if not isinstance(e, Zero):
                points.append(Point(frozenset(present), e))
    # A point whose expression a smaller point already has adds no case (A*B + X: {A} is just X).
    return tuple(p for p in points
                 if not any(q.iterators < p.iterators and q.expr == p.expr for q in points))


def needs_every_coordinate(points) -> bool:
    """True if some point has no iterator: the loop is dense, iterators are merged into it."""
    return any(not p.iterators for p in points)
