"""Index notation + operand formats -> a schedule.

Owns the decisions: the loop order (concordant with every sparse operand's
level order; an operand that cannot agree is re-formatted and the plan says
so), the output (dense; sparse in an operand's own pattern; or a new sparse
pattern assembled row by row through a workspace), and how the outer loop is
split across threads.  Hands a :class:`Schedule` to lowering.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..format import Format, compressed, dense, preset
from .lattice import lattice
from .notation import Einsum, Op, Zero, accesses, product, without


@dataclass(frozen=True)
class Operand:
    """What the compiler needs to know about one operand (no data)."""
    indices: str                 # index letter per logical dim
    fmt: Format | None           # None: a dense strided tensor
    index_ctype: str = "int32_t"
    unit_stride: bool = True     # dense: innermost dim has stride 1

    @property
    def sparse(self) -> bool:
        return self.fmt is not None

    def level_vars(self) -> tuple:
        """The loop variable each level walks (blocked dims split into var_o / var_i)."""
        f = self.fmt
        n = f.ndim
        out = []
        for d in f.order:
            if f.block:
                out.append(f"{self.indices[d]}_o" if d < n else f"{self.indices[d - n]}_i")
            else:
                out.append(self.indices[d])
        return tuple(out)


@dataclass(frozen=True)
class Schedule:
    einsum: Einsum
    expr: object                 # index-notation expression over Access(operand, indices)
    operands: tuple              # Operand, after any re-formatting
    loop_order: tuple            # loop variables, outer to inner
    splits: tuple                # (var, outer_var, inner_var, block) for blocked indices
    output: tuple                # ("dense",) | ("pattern", operand) | ("assemble",)
    parallel: str                # "rows" (disjoint writes) | "buffers" (per-thread outputs) |
                                 # "owner" (every thread walks all, writes its rows) | "serial"
    notes: tuple                 # human-readable decisions (re-formats, densified operands)
    row_workspace: tuple = ()    # (var, depth): accumulate out[..., var] in a local row from this depth


def _rank(v, ops, output, first_seen, hoist=False):
    """Loop-order priority among ready variables (smaller goes outer).

    * a variable only dense operands use sits outermost if it is an output index
      before every sparse output index (rows of the output: disjoint writes),
      else innermost (contiguous, vectorisable: the K of SpMM, the R of MTTKRP);
    * otherwise: walking a sparse level first (it filters the work), then
      output indices in output order, then the rest;
    * ``hoist`` (a dense result, and a dense level of a sparse operand sits under a walked
      one): the output indices of dense levels go outermost, in output order.
    """
    base = v.split("_")[0]
    sparse_vars = {u for op in ops if op.sparse for u in op.level_vars()}
    if v not in sparse_vars:
        sparse_out = [output.index(u.split("_")[0]) for u in sparse_vars if u.split("_")[0] in output]
        if base in output and sparse_out and all(output.index(base) < k for k in sparse_out):
            return (-1, output.index(base), first_seen[v])
        if not sparse_vars and base not in output:
            # all dense (a GEMM): reductions between the output's rows and its last index, so the
            # rows are split across threads and the last index stays innermost (vectorised)
            return (9, len(output) - 1.5, first_seen[v])
        return (9, output.find(base), first_seen[v])
    iterates = any(_walks(op, v) for op in ops)
    in_out = base in output
    if hoist and not iterates and in_out and v == base:
        # dense levels index the output, one of them under a walked level (a vector per stored
        # entry: one value per attention head): loop over them in output order outside the walk,
        # locating into the level under it, so the walk's reduction accumulates each output row
        # in registers (``ijh,jhk->ihk``: i -> h -> j -> k, rows still outermost)
        return (-1, output.index(base), first_seen[v])
    return (0 if iterates else 1 if in_out else 2, output.find(base) if in_out else 0, first_seen[v])


def _walks(op, v) -> bool:
    """``op`` is sparse and walks variable ``v`` through a stored (non-dense) level."""
    return op.sparse and v in op.level_vars() and op.fmt.levels[op.level_vars().index(v)].kind != "dense"


def _under_a_walk(v, ops) -> bool:
    """``v`` is the variable of a dense level below a walked (non-dense) level of a sparse
    operand, and no operand walks it."""
    for op in ops:
        if op.sparse and v in op.level_vars():
            k = op.level_vars().index(v)
            if op.fmt.levels[k].kind == "dense" and any(lv.kind != "dense" for lv in op.fmt.levels[:k]):
                return True
    return False


def _order_vars(ops, output: str, all_vars, first: tuple = (), hoist: bool = False):
    """A loop order obeying each sparse operand's level order, with the variables in
    ``first`` outermost in that order; None if there is none.  ``hoist``: see :func:`_rank`."""
    before: dict = {v: set() for v in all_vars}
    for op in ops:
        if op.sparse:  # a level that is walked needs every level above it bound; dense levels locate
            lv = op.level_vars()
            for k, lev in enumerate(op.fmt.levels):
                if lev.kind != "dense":
                    before[lv[k]] |= set(lv[:k])
    for k, v in enumerate(first):
        before[v] |= set(first[:k])
        for u in all_vars:
            if u not in first:
                before[u].add(v)
    order, placed = [], set()
    first_seen = {v: k for k, v in enumerate(all_vars)}
    hoist = hoist and any(_under_a_walk(u, ops) for op in ops if op.sparse for u in op.level_vars())
    while len(order) < len(all_vars):
        ready = [v for v in all_vars if v not in placed and before[v] <= placed]
        if not ready:
            return None
        v = min(ready, key=lambda u: _rank(u, ops, output, first_seen, hoist))
        order.append(v)
        placed.add(v)
    return tuple(order)


def _has_union(e) -> bool:
    """The expression adds, subtracts or takes max/min: some lattice point lacks an operand."""
    if isinstance(e, Op):
        return e.op not in ("*", "/") or _has_union(e.a) or _has_union(e.b)
    return _has_union(e.a) if hasattr(e, "a") else False


def _denominators(e) -> set:
    if isinstance(e, Op):
        inner = _denominators(e.a) | _denominators(e.b)
        return inner | ({a.operand for a in accesses(e.b)} if e.op == "/" else set())
    return _denominators(e.a) if hasattr(e, "a") else set()


def _unique_compressed(op: Operand) -> Operand:
    """The operand re-formatted so it can be co-iterated: unblocked, and compressed
    (unique, ordered) wherever it is not dense, in the same mode order."""
    if op.fmt.block:
        return Operand(op.indices, preset("csr", len(op.indices)), op.index_ctype)
    levels = tuple(lv if lv.kind == "dense" else compressed for lv in op.fmt.levels)
    return Operand(op.indices, Format(levels, op.fmt.order), op.index_ctype)


def make_schedule(einsum: Einsum, operands, out_format: str, expr=None, dense_ok=None,
                  owner_ok: bool = True) -> Schedule:
    """``out_format``: "dense" forces a dense result; "auto" infers it (see :func:`_output`).
    ``dense_ok``: the ``(operand, level)`` pairs that may be made dense (see
    :func:`_located_levels`; None: any); ``owner_ok``: a scattered dense result may be written
    "owner computes" (see :func:`_parallel`)."""
    expr = product(einsum) if expr is None else expr
    ops = list(operands)
    notes = []
    for k in sorted(_denominators(expr)):
        if ops[k].sparse:
            ops[k] = Operand(ops[k].indices, None)
            notes.append(f"operand {k} densified: it divides, and x/0 is not zero")
    # Co-iteration (two sparse operands on one index, or a union with anything) needs
    # unique compressed levels: no singleton / padded / blocks.
    union = _has_union(expr)
    for v in dict.fromkeys("".join(einsum.inputs)):
        users = [k for k, op in enumerate(ops) if op.sparse and v in op.indices]
        if len(users) > 1 or (users and union):
            for k in users:
                new = _unique_compressed(ops[k])
                if new.fmt != ops[k].fmt:
                    notes.append(f"operand {k} re-formatted {ops[k].fmt} -> {new.fmt} to co-iterate over {v!r}")
                    ops[k] = new
    splits = {}
    for op in ops:
        if op.sparse and op.fmt.block:
            for d, b in enumerate(op.fmt.block):
                splits[op.indices[d]] = (op.indices[d], f"{op.indices[d]}_o", f"{op.indices[d]}_i", b)
    all_vars = []
    for v in dict.fromkeys("".join(einsum.inputs)):
        all_vars += [splits[v][1], splits[v][2]] if v in splits else [v]

    output, rows = _output(einsum, expr, ops, out_format)
    if output[0] == "assemble":  # row loops must visit each output row once: unique levels only
        for k, op in enumerate(ops):
            if op.sparse and (new := _unique_compressed(op)).fmt != op.fmt:
                notes.append(f"operand {k} re-formatted {op.fmt} -> {new.fmt}: output rows are assembled once each")
                ops[k] = new
    order = _order_vars(ops, einsum.output, all_vars, rows, hoist=output[0] == "dense")
    if order is None and rows:  # re-order operands whose levels put another index before the rows
        for k, op in enumerate(ops):
            if op.sparse and not op.fmt.block:
                dims = [op.indices[d] for d in op.fmt.order]
                want = sorted(dims, key=lambda c: (rows.index(c) if c in rows else len(rows), dims.index(c)))
                if want != dims:
                    order_k = tuple(op.indices.index(c) for c in want)
                    ops[k] = Operand(op.indices, Format(op.fmt.levels, order_k), op.index_ctype)
                    notes.append(f"operand {k} re-formatted to mode order {order_k} so output rows are outermost")
        order = _order_vars(ops, einsum.output, all_vars, rows)
    if order is None and rows:
        notes.append("no loop order puts the output rows outermost: result assembled densely")
        output, rows = ("dense",), ()
        order = _order_vars(ops, einsum.output, all_vars)
    if order is None:  # no concordant order: re-format operands (last first) to follow the others
        sparse = [j for j, op in enumerate(ops) if op.sparse]
        for n_out in range(1, len(sparse) + 1):
            moved = sparse[-n_out:]
            rest = _order_vars([op for j, op in enumerate(ops) if j not in moved], einsum.output, all_vars, rows)
            if rest is not None:
                break
        for k in moved:
            want = tuple(ops[k].indices.index(v) for v in rest if v in ops[k].indices)
            notes.append(f"operand {k} re-formatted to mode order {want} to make the loop order concordant")
            ops[k] = Operand(ops[k].indices, Format(ops[k].fmt.levels, want), ops[k].index_ctype)
        order = _order_vars(ops, einsum.output, all_vars, rows)
    if output[0] == "assemble" and not splits:
        order = _gustavson(ops, einsum.output, all_vars, rows, order, notes)
    if not union:
        ops = _located_levels(ops, order, notes, dense_ok)
    return Schedule(einsum, expr, tuple(ops), order, tuple(splits.values()), output,
                    _parallel(einsum, expr, ops, order, output, owner_ok), tuple(notes),
                    _row_workspace(einsum, ops, order, output))


def _co_iterated_below(ops, output, order) -> list:
    """Reductions that two or more sparse operands walk, placed below the result's last index:
    an inner-product order (``ij,kj->ik`` over two CSR operands: i -> k -> j merges row i of A
    with row k of B for every (i, k), 7.3M merges on Cora, 0.2 s)."""
    last = order.index(output[-1]) if output and output[-1] in order else len(order)
    return [r for r in order[last + 1:] if r not in output and sum(_walks(op, r) for op in ops) >= 2]


def _gustavson(ops, output, all_vars, rows, order, notes) -> tuple:
    """The loop order with the co-iterated reductions above the result's last index (Gustavson's
    row-by-row order: i -> j -> k), re-formatting (in place in ``ops``) the operands whose mode
    order puts that index first; ``order`` unchanged when there is nothing to move or no such order."""
    below = _co_iterated_below(ops, output, order)
    if not below:
        return order
    last = output[-1]
    moved = list(ops)
    for k, op in enumerate(ops):
        if op.sparse and not op.fmt.block and last in op.indices:
            dims = [op.indices[d] for d in op.fmt.order]
            want = sorted(dims, key=lambda c: (dims.index(c) if c != last else len(dims) + 1))
            if any(r in dims for r in below) and want != dims:
                moved[k] = Operand(op.indices, Format(op.fmt.levels, tuple(op.indices.index(c) for c in want)),
                                   op.index_ctype)
    new = _order_vars(moved, output, all_vars, rows)
    if new is None or _co_iterated_below(moved, output, new):
        return order
    for k, (a, b) in enumerate(zip(ops, moved)):
        if a is not b:
            notes.append(f"operand {k} re-formatted to mode order {b.fmt.order}: rows merged Gustavson's way "
                         f"({' -> '.join(new)}), not an inner product per output entry")
            ops[k] = b
    return new


def _located_levels(ops, order, notes, dense_ok=None) -> list:
    """A compressed level co-iterated with another sparse operand's, under a loop its operand
    does not bind, is merged whole once per iteration of that loop (SpGEMM with a DCSR or COO
    right operand: every stored row of B against each row of A, 30x slower than CSR on
    PubMed; batched products of CSF operands 10x).  Such a level becomes dense (DCSR -> CSR):
    located, not merged -- where ``dense_ok`` (``(operand, level)`` pairs; None: all) allows,
    i.e. where a position per coordinate stays near what the operand stores."""
    out = list(ops)
    for k, op in enumerate(ops):
        if not op.sparse or op.fmt.block:
            continue
        lvars, levels = op.level_vars(), list(op.fmt.levels)
        for lv in range(len(levels) - 1):  # never the innermost: that would be a dense tensor
            v = lvars[lv]
            if levels[lv] != compressed or (dense_ok is not None and (k, lv) not in dense_ok):
                continue
            walked = any(j != k and _walks(o, v) for j, o in enumerate(ops))
            start = order.index(lvars[lv - 1]) + 1 if lv else 0
            if walked and any(u not in lvars for u in order[start:order.index(v)]):
                levels[lv] = dense
        if levels != list(op.fmt.levels):
            out[k] = Operand(op.indices, Format(tuple(levels), op.fmt.order), op.index_ctype)
            notes.append(f"operand {k}: levels made dense ({op.fmt} -> {out[k].fmt}) to be located, "
                         "not merged, under loops it does not bind")
    return out


def _row_workspace(einsum, ops, order, output) -> tuple:
    """A dense output whose last index is the innermost loop, walked by no sparse level, with
    reduction loops between it and the other output indices (SpMM's k under the j loop):
    accumulate the output row in a local workspace the compiler can keep in registers."""
    out = einsum.output
    if output[0] != "dense" or not out or not order or order[-1] != out[-1]:
        return ()
    k = out[-1]
    if any(op.sparse and k in op.level_vars() for op in ops):
        return ()
    last_out = max((d for d, v in enumerate(order[:-1]) if v.split("_")[0] in out), default=-1)
    if last_out < 0 or last_out == len(order) - 2:
        return ()  # no outer row loop, or nothing reduced between the row and its last index
    return (k, last_out)


def _output(einsum, expr, ops, out_format):
    """Sparse iff the result is zero wherever every sparse operand is absent, each output
    index is an index of a sparse operand, and -- with one sparse operand -- the output keeps
    all of its indices (SDDMM, A * X stay sparse; SpMV, SpMM, A^T x, TTV give dense results).
    Several sparse operands (SpGEMM, A + B, A * B) give an assembled sparse result."""
    out = einsum.output
    sparse = [k for k, op in enumerate(ops) if op.sparse]
    if out_format == "dense" or not out or not sparse:
        return ("dense",), ()
    if not isinstance(without(expr, frozenset(sparse)), Zero):
        return ("dense",), ()
    if not all(any(c in ops[k].indices for k in sparse) for c in out):
        return ("dense",), ()
    if len(sparse) == 1:  # sparse x dense: sparse only where nothing is contracted away (SDDMM, A * X)
        return (("pattern", sparse[0]) if ops[sparse[0]].indices == out else ("dense",)), ()
    if any(ops[k].fmt.block for k in sparse):
        return ("dense",), ()  # blocked operands split their indices: no row-wise assembly yet
    return ("assemble",), tuple(out[:-1])


def _parallel(einsum, expr, ops, order, output, owner_ok: bool = True) -> str:
    if not order:
        return "serial"
    first = order[0]
    at_first = frozenset(k for k, op in enumerate(ops) if op.sparse and op.level_vars()[0] == first
                         and op.fmt.levels[0].kind != "dense" and any(a.operand == k for a in accesses(expr)))
    if len(lattice(expr, at_first)) > 1 or len(at_first) > 1:
        return "serial"  # a merge at the outermost loop: not split yet
    if output[0] == "assemble":
        return "rows" if len(einsum.output) > 1 else "serial"
    if output[0] == "pattern":
        op = ops[output[1]]
        return "rows" if op.level_vars()[0] == first else "serial"
    nonunique = any(not ops[k].fmt.levels[0].unique for k in at_first)
    if first.split("_")[0] in einsum.output and not nonunique:
        return "rows"
    # The result's rows are scattered to from every outer iteration. With a dense index of the
    # result innermost (A^T X, SpMM over CSC / COO: a row of K values per stored entry) each thread
    # walks every entry but writes only its own share of the rows ("owner": no per-thread copies
    # of the result to zero and sum, 1.2 -> 0.4 ms on PubMed at K=64) -- where the driver says the
    # rows are long enough for that (``owner_ok``); else per-thread copies.
    if owner_ok and len(einsum.output) > 1 and einsum.output[0] in order and order[-1] == einsum.output[-1] \
            and not any(op.sparse and order[-1] in op.indices for op in ops) \
            and not any(op.sparse and op.fmt.block for op in ops):
        return "owner"
    return "buffers"
