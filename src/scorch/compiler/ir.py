"""Loop IR: what lowering produces and the C printer consumes.

Expressions and statements are small frozen dataclasses that compare and
print (``str``), so lowering is testable without a C compiler.  Nothing here
knows about formats; nothing outside :mod:`codegen` writes C.
"""

from __future__ import annotations

from dataclasses import dataclass, field


# ------------------------------------------------------------------ expressions

class Expr:
    def __add__(self, o): return _add(self, _e(o))
    def __radd__(self, o): return _add(_e(o), self)
    def __sub__(self, o): return Bin("-", self, _e(o))
    def __mul__(self, o): return _mul(self, _e(o))
    def __rmul__(self, o): return _mul(_e(o), self)
    def __truediv__(self, o): return Bin("/", self, _e(o))
    def lt(self, o): return Bin("<", self, _e(o))
    def ge(self, o): return Bin(">=", self, _e(o))
    def eq(self, o): return Bin("==", self, _e(o))

    def __getitem__(self, idx):
        return Load(self, _e(idx))


def _is(x, v) -> bool:
    return isinstance(x, Const) and x.value == v


def _add(a, b):
    """a + b, folding additions of 0 (keeps the generated C readable)."""
    return b if _is(a, 0) else a if _is(b, 0) else Bin("+", a, b)


def _mul(a, b):
    """a * b, folding multiplications by 0 and 1 on integer index arithmetic."""
    if _is(a, 0) or _is(b, 0):
        return Const(0)
    return b if _is(a, 1) else a if _is(b, 1) else Bin("*", a, b)


def _e(x) -> "Expr":
    if isinstance(x, Expr):
        return x
    if isinstance(x, (int, float)):
        return Const(x)
    raise TypeError(f"not an IR expression: {x!r}")


@dataclass(frozen=True)
class Var(Expr):
    name: str

    def __str__(self): return self.name


@dataclass(frozen=True)
class Const(Expr):
    value: int | float

    def __str__(self): return repr(self.value)


@dataclass(frozen=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def __str__(self): return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class Load(Expr):
    array: Expr
    index: Expr

    def __str__(self): return f"{self.array}[{self.index}]"


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple

    def __str__(self): return f"{self.fn}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class Cast(Expr):
    ctype: str
    value: Expr

    def __str__(self): return f"({self.ctype}){self.value}"


@dataclass(frozen=True)
class Addr(Expr):
    """``&array[index]``."""
    array: Expr
    index: Expr

    def __str__(self): return f"&{self.array}[{self.index}]"


@dataclass(frozen=True)
class Vec(Expr):
    """The ``lanes``-wide vector at ``addr`` (a load, or a store target); ``ctype`` is the
    lane type.  Unaligned access is fine."""
    addr: Expr
    ctype: str

    def __str__(self): return f"vec<{self.ctype}>({self.addr})"


@dataclass(frozen=True)
class VecZero(Expr):
    def __str__(self): return "vec(0)"


# ------------------------------------------------------------------ statements

class Stmt:
    pass


@dataclass(frozen=True)
class Block(Stmt):
    body: tuple = ()

    def __str__(self): return "\n".join(map(str, self.body))


@dataclass(frozen=True)
class Decl(Stmt):
    ctype: str
    name: str
    value: Expr | None = None

    def __str__(self): return f"{self.ctype} {self.name}" + (f" = {self.value}" if self.value is not None else "")


@dataclass(frozen=True)
class Assign(Stmt):
    target: Expr
    value: Expr
    op: str = "="  # or "+="

    def __str__(self): return f"{self.target} {self.op} {self.value}"


@dataclass(frozen=True)
class For(Stmt):
    """``for (var = lo; var < hi; var++) body``; ``simd`` asks for vectorisation,
    ``reduction`` names a scalar summed across simd lanes."""
    var: str
    lo: Expr
    hi: Expr
    body: Block
    simd: bool = False
    reduction: str | None = None

    def __str__(self):
        head = f"for {self.var} in [{self.lo}, {self.hi})" + (" simd" if self.simd else "")
        return head + ":\n" + _indent(str(self.body))


@dataclass(frozen=True)
class Scope(Stmt):
    """A braced block: its declarations stay inside (a loop body repeated per unrolled lane)."""
    body: Block

    def __str__(self):
        return "scope:\n" + _indent(str(self.body))


@dataclass(frozen=True)
class Forever(Stmt):
    """``for (;;) body``: left only by a ``Break``."""
    body: Block

    def __str__(self):
        return "loop:\n" + _indent(str(self.body))


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Block
    orelse: Block | None = None

    def __str__(self):
        return f"if {self.cond}:\n" + _indent(str(self.then)) + (
            "\nelse:\n" + _indent(str(self.orelse)) if self.orelse else "")


@dataclass(frozen=True)
class Eval(Stmt):
    """An expression evaluated for its effect (a call such as a prefetch)."""
    value: Expr

    def __str__(self): return str(self.value)


@dataclass(frozen=True)
class Break(Stmt):
    def __str__(self): return "break"


@dataclass(frozen=True)
class Parallel(Stmt):
    """An OpenMP parallel region of ``nthreads`` threads; ``tid`` / ``nthr`` are bound inside."""
    body: Block
    nthreads: Expr

    def __str__(self): return f"parallel({self.nthreads}):\n" + _indent(str(self.body))


@dataclass(frozen=True)
class SegmentedRows(Stmt):
    """The sums of rows ``0 .. rows-1`` of a CSR level, ``out[r] = sum over q in pos[r] ..
    pos[r+1]-1 of value(q)``, 512 stored entries per block whatever the row lengths:
    ``loads`` are ``(name, kind, array)`` triples binding each 16-entry vector's lanes
    ("vals": ``array[q]``; "gather": ``array[crd[q]]``), ``value`` the per-entry expression
    over them; a segmented scan sums each row's lanes and every row that ends in the block
    is stored 16 at a time (no branch per row).  The team's threads take the rows in
    nnz-balanced parts, four per thread, as they come free (a thread woken late takes fewer).
    A block's first row comes from ``parents`` (the row of every stored entry) and its
    segment heads from ``heads`` (a bit per entry: first of its row), so blocks do not wait
    on each other; ``ncrd`` is the coordinate array's length.  Float32 (``vtype`` "float":
    16 lanes, 512 entries a block) or float64 ("double": 8 lanes, 8 chunks of 32, 256 entries
    a block) values and int32 indices on AVX-512 targets; ``fallback`` (the row-wise loop over
    the thread's rows) is compiled elsewhere."""
    pos: str
    crd: str
    parents: str
    heads: str
    ncrd: str
    rows: Expr
    loads: tuple
    value: Expr
    out: str
    fallback: Stmt
    vtype: str = "float"

    def __str__(self):
        return (f"segmented rows [0, {self.rows}) of {self.pos} ({self.vtype}): {self.out}[r] = sum {self.value}\n"
                "else:\n" + _indent(str(self.fallback)))


@dataclass(frozen=True)
class SampledDots(Stmt):
    """SDDMM over the entries of rows ``lo .. hi-1`` of a CSR level, sixteen entries per step
    across row ends: ``out[q] = scale(q) * sum over k < 16*nvec of prod(factor rows)``.
    ``factors``: ``(array, by, stride)`` with ``by`` "row" (``array[i*stride + k]``), "col"
    (``array[j*stride + k]``, prefetched ahead) or "k" (``array[k]``); ``scales``: value
    arrays read at ``q`` (the sparse operand's values).  Each lane's row is read from
    ``parents`` (the row of every stored entry), the sixteen dot products are reduced together
    by one shuffle tree and stored with one vector store.  Float32 values and int32 indices on
    AVX-512 targets; ``fallback`` (the row-wise loop) is compiled elsewhere."""
    pos: str
    crd: str
    parents: str
    lo: Expr
    hi: Expr
    nvec: int
    factors: tuple
    scales: tuple
    out: str
    ncrd: str
    fallback: Stmt

    def __str__(self):
        fs = " * ".join(f"{a}[{by}]" for a, by, _ in self.factors)
        return (f"sampled dots [{self.lo}, {self.hi}) of {self.pos}: {self.out}[q] = {' * '.join(self.scales) or 1}"
                f" * sum_k {fs}\nelse:\n" + _indent(str(self.fallback)))


@dataclass(frozen=True)
class BlockDots(Stmt):
    """The dense part of an SDDMM row block (:func:`~scorch.compiler.blocks.row_blocks` binds
    the block's first row ``blk_i0_``, window start ``blk_lo_`` and width ``blk_w_``): the
    dot products of every (row, window column) pair -- each loaded row of the column factor
    shared by the block's ``factor`` rows, four dots per horizontal sum -- into the workspace
    ``dots`` (a row at stride ``blk_w_ + 4``), then each stored entry read off from there:
    ``out[q] = scale[q] * dot``.  ``row_var``, ``head``, ``parent``: the row variable, the row
    body's position declarations and the row's position in ``pos``; ``row`` / ``col``:
    ``(array, offset)`` of the factors' vectors at ``k = 0`` (offsets over ``row_var`` and
    ``col_var``)."""
    row_var: str
    head: tuple
    pos: str
    crd: str
    parent: Expr
    row: tuple
    col: tuple
    col_var: str
    scale: str
    out: str
    dots: str
    nvec: int
    lanes: int
    vtype: str
    factor: int

    def __str__(self):
        return (f"block dots, {self.factor} rows: {self.out}[q] = {self.scale}[q] * "
                f"{self.row[0]}[row] . {self.col[0]}[col] over the window")


@dataclass(frozen=True)
class Param:
    """A kernel argument: ``ctype`` is a C type (pointers end in '*')."""
    name: str
    ctype: str
    role: tuple = field(default=(), compare=False)  # where the runtime finds it, e.g. ("crd", 0, 1)


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple
    body: Block
    writes_every_output: bool = False  # assigns each dense output element once: no zero-fill needed
    uses_workspace: bool = False       # an assembled output's per-thread marks / list / values rows
    fused_init: bool = False           # the output starts from the init operands (bias, root term), not 0
    notes: tuple = ()                  # strategies worth telling in the plan
    vector_bytes: int = 64             # width of scorch_vec_* the body was lowered for

    def __str__(self):
        sig = ", ".join(f"{p.ctype} {p.name}" for p in self.params)
        return f"kernel {self.name}({sig}):\n" + _indent(str(self.body))


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
