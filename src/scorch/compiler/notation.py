"""Einsum strings -> index notation.

Owns parsing and checking of einsum equations against operand shapes; hands
on an :class:`Einsum`: one index string per operand, the output indices, and
the size of every index.  ``...`` expands to fresh (upper-case) index letters,
right-aligned as in torch; an implicit output lists the indices that appear
once, in alphabetical order (torch's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScorchTypeError, ScorchValueError

__all__ = ["Einsum", "parse", "permutation"]


@dataclass(frozen=True)
class Einsum:
    """``out[output] = sum over the other indices of prod_t operand_t[inputs[t]]``."""

    inputs: tuple   # tuple of index strings, one per operand
    output: str
    sizes: tuple    # ((index, size), ...) sorted by index

    @property
    def size(self) -> dict:
        return dict(self.sizes)

    @property
    def reduced(self) -> str:
        """Indices summed over (in order of first appearance)."""
        seen = []
        for s in self.inputs:
            for c in s:
                if c not in self.output and c not in seen:
                    seen.append(c)
        return "".join(seen)

    def __str__(self) -> str:
        return ",".join(self.inputs) + "->" + self.output


def _is_index(c: str) -> bool:
    return c.isascii() and c.isalpha()


def parse(equation: str, shapes) -> Einsum:
    """Parse ``equation`` for operands of the given ``shapes`` (sequence of tuples)."""
    if not isinstance(equation, str):
        raise ScorchTypeError(f"einsum: equation must be a str, got {type(equation).__name__}")
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ScorchValueError(f"einsum {equation!r}: more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ScorchValueError(
            f"einsum {equation!r}: {len(terms)} operand terms but {len(shapes)} operands were given")
    letters = {c for t in terms for c in t if _is_index(c)} | {c for c in rhs if _is_index(c)}
    fresh = iter(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in letters)
    ell_rank = 0
    for t, shape in zip(terms, shapes):
        if "..." in t:
            ell_rank = max(ell_rank, len(shape) - (len(t.replace("...", ""))))
    ell = "".join(next(fresh) for _ in range(max(ell_rank, 0)))[::-1]

    inputs = []
    for k, (t, shape) in enumerate(zip(terms, shapes)):
        if t.count("...") > 1:
            raise ScorchValueError(f"einsum {equation!r}: operand {k} has more than one '...'")
        if "..." in t:
            named = len(t) - 3
            t = t.replace("...", ell[len(ell) - (len(shape) - named):] if len(shape) >= named else "")
        for c in t:
            if not _is_index(c):
                raise ScorchValueError(f"einsum {equation!r}: invalid index character {c!r} in operand {k}")
        if len(t) != len(shape):
            raise ScorchValueError(
                f"einsum {equation!r}: operand {k} has {len(shape)} dims but its term {terms[k]!r} names {len(t)}")
        inputs.append(t)

    if arrow:
        if rhs.count("...") > 1:
            raise ScorchValueError(f"einsum {equation!r}: output has more than one '...'")
        output = rhs.replace("...", ell)
        for c in output:
            if not _is_index(c):
                raise ScorchValueError(f"einsum {equation!r}: invalid index character {c!r} in the output")
        if len(set(output)) != len(output):
            raise ScorchValueError(f"einsum {equation!r}: an output index repeats")
        for c in output:
            if not any(c in t for t in inputs):
                raise ScorchValueError(f"einsum {equation!r}: output index {c!r} appears in no operand")
    else:
        counts = {}
        for t in inputs:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        output = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))

    sizes: dict = {}
    for k, (t, shape) in enumerate(zip(inputs, shapes)):
        for c, n in zip(t, shape):
            n = int(n)
            if c not in sizes or sizes[c] == 1:
                sizes[c] = n
            elif n != sizes[c] and n != 1:
                raise ScorchValueError(
                    f"einsum {equation!r}: index {c!r} has size {sizes[c]} in one operand but {n} in operand {k} "
                    f"(shapes {[tuple(s) for s in shapes]})")
    return Einsum(tuple(inputs), output, tuple(sorted(sizes.items())))


# ------------------------------------------------------------------ expressions (index notation)
#
# An einsum is ``Mul`` of ``Access`` nodes summed over the reduced indices;
# elementwise programs (sparse + sparse, max, ...) use the other nodes.  The
# lattice builder (:mod:`.lattice`) and lowering read these trees.

@dataclass(frozen=True)
class Access:
    operand: int
    indices: str

    def __str__(self): return f"T{self.operand}[{','.join(self.indices)}]"


@dataclass(frozen=True)
class Op:
    """A binary operator: one of ``+ - * / max min``."""
    op: str
    a: object
    b: object

    def __post_init__(self):
        if self.op not in ("+", "-", "*", "/", "max", "min"):
            raise ScorchValueError(f"expression: unknown operator {self.op!r}")

    def __str__(self):
        return f"{self.op}({self.a}, {self.b})" if self.op in ("max", "min") else f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Neg:
    a: object

    def __str__(self): return f"-{self.a}"


@dataclass(frozen=True)
class Zero:
    def __str__(self): return "0"


def accesses(e) -> list:
    if isinstance(e, Access):
        return [e]
    if isinstance(e, Op):
        return accesses(e.a) + accesses(e.b)
    if isinstance(e, Neg):
        return accesses(e.a)
    return []


def product(einsum: Einsum):
    """The einsum's right-hand side as an expression tree."""
    e = None
    for k, t in enumerate(einsum.inputs):
        e = Access(k, t) if e is None else Op("*", e, Access(k, t))
    return e


def without(e, absent: frozenset):
    """``e`` with the accesses of operands in ``absent`` replaced by zero, simplified."""
    if isinstance(e, Access):
        return Zero() if e.operand in absent else e
    if isinstance(e, Neg):
        a = without(e.a, absent)
        return a if isinstance(a, Zero) else Neg(a)
    if isinstance(e, Op):
        a, b = without(e.a, absent), without(e.b, absent)
        za, zb = isinstance(a, Zero), isinstance(b, Zero)
        if e.op in ("*", "/"):
            return Zero() if za or (zb and e.op == "*") else Op(e.op, a, b)
        if e.op == "+":
            return b if za else a if zb else Op("+", a, b)
        if e.op == "-":
            return Neg(b) if za and not zb else a if zb else Op("-", a, b)
        if za and zb:
            return Zero()
        return Op(e.op, a, b)  # max / min against an absent (zero) operand keep the zero
    return e


_PERMUTES: dict = {}  # (equation, ndim) -> the permutation it is, or None


def permutation(equation, ndim: int):
    """The dims' permutation when ``equation`` has one term of ``ndim`` distinct indices and an
    explicit output that reorders them (``"ij->ji"``: no sums, no ellipsis), else None (the
    identity too).  Remembered per equation: it is asked on every one-operand call."""
    key = (equation, ndim)
    found = _PERMUTES.get(key, False)
    if found is False:
        lhs, arrow, rhs = equation.replace(" ", "").partition("->") if isinstance(equation, str) else ("", "", "")
        ok = (arrow and "," not in lhs and "." not in lhs and len(lhs) == ndim and len(set(lhs)) == ndim
              and sorted(lhs) == sorted(rhs) and lhs != rhs and all(_is_index(c) for c in lhs))
        found = tuple(lhs.index(c) for c in rhs) if ok else None
        if len(_PERMUTES) < 4096:
            _PERMUTES[key] = found
    return found
