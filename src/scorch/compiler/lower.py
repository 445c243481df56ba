"""Schedule -> loop IR (:class:`~scorch.compiler.ir.Kernel`).

Walks the loop order outer to inner.  At each loop variable ``v`` the sparse
operands whose next level stores ``v`` either *iterate* it (compressed,
singleton, padded levels) or *locate* into it (dense levels: ``p*N + v``).
Which iterators must have an entry is the merge lattice of the expression at
``v`` (:mod:`.lattice`):

* no iterator: a dense ``for``;
* one point with one iterator: a ``for`` over that level's positions;
* several iterators: a two-pointer merge per lattice point (largest first),
  with one case per sub-point;
* a point with no iterator (sparse + dense): a dense ``for`` that merges the
  iterators into it.

Each operand's value is loaded once all its levels are bound (hoisted out of
inner loops), reductions that sit innermost accumulate in a register, and the
outer loop is split across OpenMP threads, balanced by nonzeros.  Outputs:
dense (``outp[...] +=``), an operand's pattern (``outp[pos] +=``), or a new
pattern assembled row by row through a dense workspace in two phases
("count": nonzeros per row; "fill": coordinates and values).

Two loop nests over a CSR level also get a form that steps over the level's entries
across row ends (AVX-512 builds; the row-wise nest is kept under ``#else``): a row sum
(SpMV, ``ij->i``) becomes a segmented scan over blocks of 512 entries (256 in float64)
(:class:`~scorch.compiler.ir.SegmentedRows`), an SDDMM into the operand's pattern becomes
sixteen dot products per step reduced by one shuffle tree
(:class:`~scorch.compiler.ir.SampledDots`); both read each entry's row from an array of the
pattern's entry rows that the runtime keeps beside it.  On graphs with a few entries per row the
row-wise loops pay a mispredicted branch and a horizontal sum per row.

Only level capabilities (``kind``) are consulted, never format names.
"""

from __future__ import annotations

from .ir import (Addr, Assign, Bin, Block, BlockDots, Break, Call, Cast, Const, Decl, Eval, For, Forever, If, Kernel,
                 Param, Parallel, SampledDots, Scope, SegmentedRows, Var, Vec, VecZero)
from .blocks import Rows, dense_blocks, row_blocks
from .jam import jam_rows
from .lattice import lattice, needs_every_coordinate
from .notation import Access, Neg, Op, Zero, accesses
from .schedule import Schedule

_C = Var
_BLOCK_ROWS = 6      # rows per SDDMM block (BlockDots)
_BLOCK_WINDOW = 2048  # widest column window a block runs densely


class _State:
    """Per-operand walk state, copied at each loop level (lowering is a tree walk)."""

    def __init__(self, level_at, pos, bound, loaded):
        self.level_at, self.pos, self.bound, self.loaded = level_at, pos, bound, loaded

    def copy(self):
        return _State(dict(self.level_at), dict(self.pos), set(self.bound), dict(self.loaded))


class _Lowerer:
    def __init__(self, s: Schedule, vtype: str, phase: str, static: dict, n_init: int = 0, vbytes: int = 64,
                 out_index: str = "int64_t"):
        self.s, self.vtype, self.phase, self.ein, self.static = s, vtype, phase, s.einsum, static
        self.out_index = out_index
        self.vbytes = vbytes
        self.split = {v: (o, i, b) for v, o, i, b in s.splits}
        self.split_parts = {o: v for v, o, _, _ in s.splits} | {i: v for v, _, i, _ in s.splits}
        ws = s.row_workspace
        self.ws = ws if (ws and phase == "compute" and ws[0] in static) else ()
        self.assign_once = bool(self.ws) and s.parallel not in ("buffers", "owner") and all(
            self._dense_output_loop(v) for v in s.loop_order[:self.ws[1] + 1])
        # A register accumulator under dense output loops writes each output element once
        # (SpMV's y[i] = acc): assign instead of add, and the output needs no zero-fill.
        order, out = s.loop_order, self.ein.output
        last_out = max((d for d, v in enumerate(order) if v.split("_")[0] in out), default=-1)
        self.acc_once = (phase == "compute" and s.output[0] == "dense" and s.parallel not in ("buffers", "owner")
                         and not s.row_workspace and 0 <= last_out < len(order) - 1 and last_out + 1 == len(out)
                         and all(self._dense_output_loop(v) for v in order[:last_out + 1]))
        self.lanes = vbytes // (4 if vtype == "float" else 8)
        self.vec = bool(self.ws) and self._vectorisable(self.ws[0])
        # Long rows are tiled: 256 bytes of the row at a time (4 AVX-512 vectors, 8 narrower
        # ones), the whole loop nest per tile, so the gathered slices of the dense operand stay
        # in L2 (K=256 on a 19k-row graph: 1.4x).
        nvec = static[self.ws[0]] // self.lanes if self.vec else 0
        per = 4 if vbytes == 64 else 8
        self.tiles = nvec // per if nvec > per and nvec % per == 0 else 1
        self.nvec = nvec // self.tiles
        # An innermost reduction over a dense index (SDDMM's k): vector partial sums, one horizontal add.
        r = s.loop_order[-1] if s.loop_order else None
        self.vec_reduce = (phase == "compute" and not self.ws and r in static and r not in self.ein.output
                           and r.split("_")[0] == r and self._vectorisable(r))
        # Init operands (dense, output-shaped: a bias, GraphSAGE's root term) start the register
        # accumulator instead of 0 where each output element is written once from one.
        self.n_init = n_init if n_init and ((self.ws and self.assign_once) or self.acc_once) else 0
        self.used = {a.operand for a in accesses(s.expr)}
        # The same for an output in an operand's pattern when that operand alone is walked, its
        # levels outermost and in order, the reductions inside (SDDMM): every stored entry is
        # visited once, its accumulator assigned, and the values need no zero-fill.
        self.pattern_once = self._pattern_once()
        self.rows = tuple(self.ein.output[:-1]) if s.output[0] == "assemble" else ()
        # Elementwise results (A + B, A * B): the loops are exactly the output indices in order, so
        # each row's coordinates arrive sorted and once each: append them, no workspace or sort.
        self.in_order = s.output[0] == "assemble" and s.loop_order == tuple(self.ein.output) and not s.splits
        self.params = self._params()
        self.crd_lengths: set = set()   # (operand, level) whose coordinate-array length the kernel reads
        self.parent_arrays: set = set()  # (operand, level) whose entries' parent positions it reads
        self.head_arrays: set = set()    # (operand, level) whose entries' first-of-parent bits it reads
        self.acc_depth = None

    def _params(self):
        s, vt = self.s, self.vtype
        ps = [Param("nthreads", "int64_t", ("nthreads",))]
        ps += [Param(f"n_{idx}", "int64_t", ("size", idx)) for idx in sorted(self.ein.size)]
        for t, op in enumerate(s.operands):
            if op.sparse:
                for k, lv in enumerate(op.fmt.levels):
                    if lv.has_pos:
                        ps.append(Param(f"pos{t}_{k}", f"const {op.index_ctype} *", ("pos", t, k)))
                    if lv.has_crd:
                        ps.append(Param(f"crd{t}_{k}", f"const {op.index_ctype} *", ("crd", t, k)))
                    if lv.kind == "padded":
                        ps.append(Param(f"slots{t}_{k}", "int64_t", ("slots", t, k)))
                ps.append(Param(f"vals{t}", f"const {vt} *", ("vals", t)))
            else:
                ps.append(Param(f"d{t}", f"const {vt} *", ("data", t)))
                for d in range(len(op.indices)):
                    if not (d == len(op.indices) - 1 and op.unit_stride):
                        ps.append(Param(f"s{t}_{d}", "int64_t", ("stride", t, d)))
        for u in range(self.n_init):
            ps.append(Param(f"init{u}", f"const {vt} *", ("init", u)))
            ps += [Param(f"is{u}_{d}", "int64_t", ("init_stride", u, d)) for d in range(len(self.ein.output))]
        if self.phase == "count":
            ps += [Param("counts", "int64_t *", ("counts",)), Param("marks", "int64_t *", ("marks",))]
        elif self.phase == "fill":
            ps += [Param("rowpos", "const int64_t *", ("rowpos",)), Param("marks", "int64_t *", ("marks",)),
                   Param("list", "int64_t *", ("list",)), Param("ws", f"{vt} *", ("ws",)),
                   Param("bits", "uint64_t *", ("bits",)),
                   Param("out_crd", f"{self.out_index} *", ("out_crd",)), Param("out", f"{vt} *", ("out",))]
        else:
            ps.append(Param("out", f"{vt} *", ("out",)))
        return tuple(ps)

    # -------------------------------------------------------------- small helpers
    def var_size(self, v: str):
        if v in self.static:
            return Const(self.static[v])
        if v in self.split_parts:
            o, i, b = self.split[self.split_parts[v]]
            return Const(b) if v == i else Bin("/", _C(f"n_{self.split_parts[v]}"), Const(b))
        return _C(f"n_{v}")

    def linear(self, idxs, subst=None):
        off, subst = Const(0), subst or {}
        for idx in idxs:
            off = off * _C(f"n_{idx}") + subst.get(idx, _C(idx))
        return off

    def _vectorisable(self, k) -> bool:
        """Loop ``k`` can run on vector registers: its length is a multiple of the vector
        width (at most 1 KiB, or any whole number of 256-byte column tiles), the expression
        is + - * /, and every operand indexed by ``k`` has it as its unit-stride last dim."""
        n = self.static[k]
        size = n * (self.vbytes // self.lanes)   # bytes of the row
        if n % self.lanes or n == 0 or (size > 1024 and size % 256):
            return False

        def ok(e):
            if isinstance(e, Op):
                return e.op in ("+", "-", "*", "/") and ok(e.a) and ok(e.b)
            if isinstance(e, Neg):
                return ok(e.a)
            if isinstance(e, Access):
                op = self.s.operands[e.operand]
                return k not in e.indices or (not op.sparse and e.indices[-1] == k and op.unit_stride
                                              and e.indices.count(k) == 1)
            return isinstance(e, Zero)
        return ok(self.s.expr)

    def _dense_output_loop(self, v) -> bool:
        """``v`` is an output index that every sparse operand locates (never iterates)."""
        if v.split("_")[0] not in self.ein.output or v in self.split_parts:
            return False
        return all(op.fmt.levels[op.level_vars().index(v)].kind == "dense"
                   for op in self.s.operands if op.sparse and v in op.level_vars())

    def next_level(self, st, t):
        op = self.s.operands[t]
        k = st.level_at[t]
        if k == len(op.fmt.levels):
            return None, None
        return op.level_vars()[k], op.fmt.levels[k].kind

    # -------------------------------------------------------------- the walk
    def lower(self) -> Kernel:
        s = self.s
        sparse = [t for t, op in enumerate(s.operands) if op.sparse and t in self.used]
        st = _State({t: 0 for t in sparse}, {t: Const(0) for t in sparse}, set(), {})
        body = self.row_start(st) if not self.rows else []
        body += self.loop(0, s.expr, st)
        notes, every = (), self.assign_once or self.acc_once or self.pattern_once
        dots = self._block_dots()
        if body and isinstance(body[-1], For) and body[-1].lo == _C("lo_t"):
            if self._segmented() is not None:
                body[-1] = self._segmented_rows(body[-1])
                lanes = 16 if self.vtype == "float" else 8
                notes = (f"rows summed {32 * lanes} stored entries at a time by a segmented scan down {lanes} "
                         "transposed 32-entry chunks, the block's rows read from the pattern's entry rows (AVX-512 "
                         "builds; the row-wise loop otherwise)",)
            elif self._sampled() is not None:
                body[-1] = self._sampled_dots(body[-1])
                every, dots = True, None  # every entry of the pattern, on either path (the fallback zeroes it)
                notes = ("sampled dot products 16 entries at a time across row ends, reduced by one shuffle "
                         "tree (AVX-512 builds; the row-wise loop otherwise)",)
        factor = self._jam_factor()
        if factor > 1:
            body, jammed = _rewrite_row_loop(body, s.loop_order[0], lambda loop: jam_rows(loop, factor))
            if jammed:
                notes += (f"rows register-blocked {factor} at a time (each loaded vector of the dense "
                          f"operand feeds {factor} rows' accumulators)",)
        if dots is not None:
            body, blocked = _rewrite_row_loop(body, s.loop_order[-3], dots)
            if blocked:
                notes += (f"SDDMM rows {_BLOCK_ROWS} at a time where their columns span a window at most twice "
                          "their entries (banded or blocked patterns): every dot product of the window, each "
                          "loaded row shared by the block's rows; else row by row",)
        factor = self._block_factor()
        if factor > 1:
            body, blocked = _rewrite_row_loop(body, s.loop_order[self.ws[1]],
                                              lambda loop: dense_blocks(loop, factor, self.vtype, _BLOCK_WINDOW))
            if blocked:
                notes += (f"rows {factor} at a time through a dense workspace where their columns span a window "
                          "at most twice their entries (banded or blocked patterns: each loaded row of the dense "
                          f"operand feeds {factor} rows), else row by row",)
        body += self.row_end(st) if not self.rows else []
        if s.parallel == "serial" or (s.output[0] == "assemble" and not self.rows):
            body = [If(_C("tid").eq(Const(0)), Block(tuple(body)))]
        name = {"count": "kernel_count", "fill": "kernel_fill"}.get(self.phase, "kernel")
        if self.phase == "fill" and self.out_index != "int64_t":
            name += "_" + self.out_index.replace("_t", "")
        params = self.params + tuple(Param(f"ncrd{t}_{k}", "int64_t", ("ncrd", t, k))
                                     for t, k in sorted(self.crd_lengths))
        params += tuple(Param(f"par{t}_{k}", f"const {s.operands[t].index_ctype} *", ("parents", t, k))
                        for t, k in sorted(self.parent_arrays))
        params += tuple(Param(f"hd{t}_{k}", "const uint8_t *", ("heads", t, k)) for t, k in sorted(self.head_arrays))
        return Kernel(name, params, Block((Parallel(Block(tuple(self.prelude()) + tuple(body)),
                                                         _C("nthreads")),)), every,
                      uses_workspace=self.phase in ("count", "fill") and not self.in_order,
                      fused_init=self.n_init > 0, notes=notes, vector_bytes=self.vbytes)

    def _jam_factor(self) -> int:
        """Rows to jam into one body (:mod:`.jam`): a dense result whose rows are split across
        threads and kept in vector registers right under the row loop; enough rows that their
        accumulators fill about 24 of the 32 vector registers (8 at most).  1: no jam."""
        s = self.s
        if not (self.phase == "compute" and self.vec and self.ws[1] == 0 and s.output[0] == "dense"
                and s.parallel == "rows"):
            return 1
        return self._rows_in_registers()

    def _rows_in_registers(self) -> int:
        """Rows whose vector accumulators fill about 24 of the 32 vector registers (8 at most)."""
        return max(1, min(8, 24 // self.nvec))

    def _pattern_once(self) -> bool:
        s = self.s
        if not (self.phase == "compute" and s.output[0] == "pattern" and s.parallel != "buffers" and not s.splits):
            return False
        t = s.output[1]
        op = s.operands[t]
        if any(s.operands[u].sparse for u in self.used if u != t) or op.fmt.block \
                or any(lv.kind == "padded" for lv in op.fmt.levels):
            return False
        n = len(op.fmt.levels)
        return tuple(s.loop_order[:n]) == op.level_vars() and n < len(s.loop_order)

    def _block_dots(self):
        """For an SDDMM into the pattern of a (batched) CSR operand, ``out[q] = A[.., i, j] *
        sum_k X[.., i, k] * Y[.., j, k]`` with ``k`` vectorised: a function turning the row loop
        into a :class:`~scorch.compiler.ir.BlockDots`; None otherwise."""
        s = self.s
        if not (self.phase == "compute" and s.output[0] == "pattern" and not self.n_init and self.vec_reduce
                and s.parallel == "rows" and not s.splits):
            return None
        t = s.output[1]
        op, order = s.operands[t], s.loop_order
        if [u for u in sorted(self.used) if s.operands[u].sparse] != [t] or not _csr_like(op) \
                or tuple(order[:-1]) != op.level_vars():
            return None
        i, j, k = order[-3:]
        accs, factors = _product_factors(s.expr), {}
        if accs is None:
            return None
        for e in accs:
            if e.operand == t:
                continue
            d, idx = s.operands[e.operand], tuple(e.indices)
            kind = "row" if idx == tuple(order[:-2]) + (k,) else "col" if idx == tuple(order[:-3]) + (j, k) else None
            if d.sparse or not d.unit_stride or kind is None or kind in factors:
                return None
            factors[kind] = e.operand
        if set(factors) != {"row", "col"}:
            return None
        n = len(op.fmt.levels)
        row = (f"d{factors['row']}", self.dense_offset(factors["row"], {k: Const(0)}))
        col = (f"d{factors['col']}", self.dense_offset(factors["col"], {k: Const(0)}))

        def build(loop: For):
            head = []
            for st in loop.body.body:
                if not (isinstance(st, Decl) and st.ctype == "int64_t" and st.name.startswith(f"q{t}_")):
                    break
                head.append(st)
            parent, pos, crd = _C(f"q{t}_{n - 2}"), _C(f"pos{t}_{n - 1}"), _C(f"crd{t}_{n - 1}")
            rows = Rows(tuple(head), Cast("int64_t", pos[parent]), Cast("int64_t", pos[parent + Const(1)]),
                        lambda e: Cast("int64_t", crd[e]), _C(f"n_{j}"))
            dots = BlockDots(loop.var, tuple(head), pos.name, crd.name, parent, row, col, j, f"vals{t}", "outp",
                             "bd_dots_", self.static[k] // self.lanes, self.lanes, self.vtype, _BLOCK_ROWS)
            workspace = Decl(self.vtype, f"bd_dots_[{_BLOCK_ROWS * (_BLOCK_WINDOW + 4)}]")
            return row_blocks(loop, _BLOCK_ROWS, rows, (dots,), (workspace,), _BLOCK_WINDOW)
        return build

    def _block_factor(self) -> int:
        """Rows per dense workspace block (:mod:`.blocks`): an SpMM whose one sparse operand's
        last level is an ordered, unique compressed level under dense ones (CSR, batched CSR),
        walked right under the row loop, with each output row in vector registers; as many
        rows as :meth:`_jam_factor` would jam.  1: none."""
        s = self.s
        if not (self.phase == "compute" and self.vec and s.output[0] == "dense" and s.parallel == "rows"
                and self.assign_once and not self.n_init):
            return 1
        sparse = [t for t in sorted(self.used) if s.operands[t].sparse]
        if len(sparse) != 1:
            return 1
        op, d = s.operands[sparse[0]], self.ws[1]
        if not _csr_like(op) or len(s.loop_order) != d + 3 or s.loop_order[d + 1] != op.level_vars()[-1]:
            return 1
        return self._rows_in_registers()

    def _segmented(self):
        """``{operand: load kind}`` when the loop nest is a row-wise sum over one CSR level
        (``out[i] = sum_j f(A[i,j], x[j], ...)``: SpMV, row sums) that SegmentedRows can run:
        float32 or float64, int32 indices, f made of + - * / over A's values and 1-d dense operands
        indexed by ``j`` with unit stride; None otherwise.  Rows of a few entries (citation
        graphs: 4.5 per row) cost the row-wise loop a mispredicted branch and a horizontal
        sum each; the segmented form has neither."""
        s = self.s
        if not (self.phase == "compute" and self.vtype in ("float", "double") and self.acc_once and not self.n_init
                and s.parallel == "rows" and not s.splits and len(s.loop_order) == 2
                and tuple(self.ein.output) == s.loop_order[:1]):
            return None
        i, j = s.loop_order
        sparse = [t for t in sorted(self.used) if s.operands[t].sparse]
        if len(sparse) != 1:
            return None
        a = s.operands[sparse[0]]
        if a.index_ctype != "int32_t" or tuple(a.level_vars()) != (i, j) \
                or [lv.kind for lv in a.fmt.levels] != ["dense", "compressed"]:
            return None
        loads = {}

        def ok(e):
            if isinstance(e, Op):
                return e.op in ("+", "-", "*", "/") and ok(e.a) and ok(e.b)
            if not isinstance(e, Access):
                return False
            op = s.operands[e.operand]
            if op.sparse:
                loads[e.operand] = "vals"
                return True
            if tuple(e.indices) == (j,) and op.unit_stride:
                loads[e.operand] = "gather"
                return True
            return False
        return loads if ok(s.expr) else None

    def _segmented_rows(self, loop: For) -> SegmentedRows:
        loads = self._segmented()
        t = next(t for t, kind in loads.items() if kind == "vals")
        names = {u: (f"vals{u}" if kind == "vals" else f"d{u}") for u, kind in loads.items()}
        value = self.value(self.s.expr, _State({}, {}, set(), {u: _C(f"v{u}") for u in loads}))
        self.crd_lengths.add((t, 1))
        self.parent_arrays.add((t, 1))
        self.head_arrays.add((t, 1))
        return SegmentedRows(f"pos{t}_1", f"crd{t}_1", f"par{t}_1", f"hd{t}_1", f"ncrd{t}_1",
                             _C(f"n_{self.s.loop_order[0]}"),
                             tuple((f"v{u}", kind, names[u]) for u, kind in sorted(loads.items())), value, "outp",
                             loop, self.vtype)

    def _sampled(self):
        """``(factors, scales)`` when the loop nest is an SDDMM over one CSR level that
        SampledDots can run (``out[q] = A[i,j] * sum_k X[i,k] * Y[j,k] ...`` in A's pattern):
        float32, int32 indices, a product of A's values and dense operands indexed ``(i,k)``,
        ``(j,k)`` or ``(k,)`` with unit stride along ``k``, ``k`` a multiple of 16 up to 256;
        None otherwise.  Rows of a few entries (4.5 per row on the citation graphs) leave the
        row-wise loop's four-entry batches mostly empty; sixteen entries across rows fill them,
        each lane's row read from the pattern's array of entry rows (``convert.entry_parents``)."""
        s = self.s
        if not (self.phase == "compute" and self.vtype == "float" and s.output[0] == "pattern" and not self.n_init
                and s.parallel == "rows" and not s.splits and len(s.loop_order) == 3):
            return None
        i, j, k = s.loop_order
        if not (k in self.static and self.static[k] % 16 == 0 and 16 <= self.static[k] <= 256):
            return None
        t = s.output[1]
        a = s.operands[t]
        if a.index_ctype != "int32_t" or tuple(a.level_vars()) != (i, j) \
                or [lv.kind for lv in a.fmt.levels] != ["dense", "compressed"]:
            return None
        factors, scales, accs = [], [], _product_factors(s.expr)
        if accs is None:
            return None
        for e in accs:
            op = s.operands[e.operand]
            if e.operand == t:
                scales.append(f"vals{t}")
            elif op.sparse or not op.unit_stride:
                return None
            elif tuple(e.indices) in ((i, k), (j, k)):
                factors.append((f"d{e.operand}", "row" if e.indices[0] == i else "col", f"s{e.operand}_0"))
            elif tuple(e.indices) == (k,):
                factors.append((f"d{e.operand}", "k", None))
            else:
                return None
        return (tuple(factors), tuple(scales)) if factors else None

    def _sampled_dots(self, loop: For) -> SampledDots:
        factors, scales = self._sampled()
        t = self.s.output[1]
        self.crd_lengths.add((t, 1))
        self.parent_arrays.add((t, 1))
        pos = _C(f"pos{t}_1")
        zero = For("q_", Cast("int64_t", pos[loop.lo]), Cast("int64_t", pos[loop.hi]),
                   Block((Assign(_C("outp")[_C("q_")], Const(0.0)),)), simd=True)
        return SampledDots(f"pos{t}_1", f"crd{t}_1", f"par{t}_1", loop.lo, loop.hi,
                           self.static[self.s.loop_order[2]] // 16, factors, scales, "outp", f"ncrd{t}_1",
                           Block((zero, loop)))

    def prelude(self):
        vt, s = self.vtype, self.s
        if self.in_order:
            return []
        if self.phase == "count":
            return [Decl("int64_t * restrict", "mark", _C("marks") + _C("tid") * _C(f"n_{self.ein.output[-1]}"))]
        if self.phase == "fill":
            n = _C(f"n_{self.ein.output[-1]}")
            words = Bin("/", n + Const(63), Const(64))
            return [Decl("int64_t * restrict", "mark", _C("marks") + _C("tid") * n),
                    Decl("int64_t * restrict", "lst", _C("list") + _C("tid") * n),
                    Decl(f"{vt} * restrict", "wsp", _C("ws") + _C("tid") * n),
                    Decl("const int64_t", "nwords", words),
                    # the thread's bitset, then its summary: a bit per word of the bitset
                    Decl("uint64_t * restrict", "bit",
                         _C("bits") + _C("tid") * (_C("nwords") + Bin("/", _C("nwords") + Const(63), Const(64)))),
                    Decl("uint64_t * restrict", "summ", _C("bit") + _C("nwords"))]
        if s.output[0] == "dense" and s.parallel == "buffers":
            numel = Const(1)
            for idx in self.ein.output:
                numel = numel * _C(f"n_{idx}")
            return [Decl(f"{vt} * restrict", "outp", _C("out") + _C("tid") * numel)]
        if s.parallel == "owner":  # the thread's share of the result's rows (it walks every entry)
            n = _C(f"n_{self.ein.output[0]}")
            return [Decl(f"{vt} * restrict", "outp", _C("out")),
                    Decl("const int64_t", "own_lo", Bin("/", n * _C("tid"), _C("nthr"))),
                    Decl("const int64_t", "own_hi", Bin("/", n * (_C("tid") + Const(1)), _C("nthr")))]
        return [Decl(f"{vt} * restrict", "outp", _C("out"))]

    def loop(self, depth: int, expr, st: _State) -> list:
        s = self.s
        if depth == len(s.loop_order):
            return self.leaf(expr, st)
        v = s.loop_order[depth]
        iters = frozenset(t for t in st.level_at if self.next_level(st, t)[0] == v
                          and self.next_level(st, t)[1] != "dense" and t in _present(expr))
        points = lattice(expr, iters)
        if not points:
            return []
        if not iters and self.vec and v == self.ws[0]:
            return [Assign(_C(f"w{m}"), self.vec_value(points[0].expr, st, m, v), "+=") for m in range(self.nvec)]
        if not iters and self.vec_reduce and depth == len(s.loop_order) - 1 and self.acc_depth is not None:
            # factors already loaded (scalars for this loop: SDDMM's A[i,j]) multiply the sum once
            scalars, vector = _split_product(points[0].expr, st.loaded)
            parts = [self.vec_value(vector, st, m, v) for m in range(self.static[v] // self.lanes)]
            total = parts[0]
            for p in parts[1:]:
                total = total + p
            hsum = Call(f"scorch_hsum_{self.vtype}", (total,))
            return [Assign(_C("acc"), hsum if scalars is None else self.value(scalars, st) * hsum, "+=")]
        if not iters:
            body = Block(tuple(self.body(depth, v, points[0], st, iters)))
            innermost = depth == len(s.loop_order) - 1 and self.phase == "compute"
            red = "acc" if innermost and self.acc_depth is not None else None
            stmts = [For(v, Const(0), self.var_size(v), body, simd=innermost, reduction=red)]
        elif needs_every_coordinate(points):
            stmts = self.dense_merge(depth, v, points, iters, st)
        elif len(points) == 1 and len(iters) == 1:
            stmts = self.walk_one(depth, v, points[0], st)
        else:
            stmts = self.merge(depth, v, points, iters, st)
        if depth == 0 and s.parallel not in ("serial", "owner") and len(stmts) == 1 and isinstance(stmts[0], For):
            stmts = self.parallelise(stmts[0], iters)
        if depth == 0 and self.tiles > 1:
            tile = self.nvec * self.lanes
            *decls, nest = stmts
            stmts = decls + [For("kb", Const(0), Const(self.tiles),
                                 Block((Decl("const int64_t", "kt", _C("kb") * Const(tile)), nest)))]
        return stmts

    def body(self, depth, v, point, st, present, binds=()):
        """Statements inside the loop over ``v`` once ``present`` iterators sit at ``v``."""
        st = st.copy()
        out = list(binds)
        st.bound.add(v)
        for t in present:
            k = st.level_at[t]
            st.pos[t], st.level_at[t] = _C(f"q{t}_{k}"), k + 1
        if v in self.split_parts:
            base = self.split_parts[v]
            o, i, b = self.split[base]
            if o in st.bound and i in st.bound:
                out.append(Decl("int64_t", base, _C(o) * Const(b) + _C(i)))
                st.bound.add(base)
        out += self.locate(st)
        out += self.bind_values(st, accesses(point.expr))
        starts_row = self.rows and v == self.rows[-1].split("_")[0] and all(r in st.bound for r in self.rows)
        if starts_row:
            out += self.row_start(st)
        out += self.maybe_acc_start(depth, st)
        ws_here = self.ws and self.ws[1] == depth
        if ws_here:
            k, n = self.ws[0], self.var_size(self.ws[0])
            if self.vec:
                out += [Decl(f"scorch_vec_{self.vtype}", f"w{m}", self.init_value({k: self.lane_offset(m)}, True))
                        for m in range(self.nvec)]
            else:
                out += [Decl(self.vtype, f"wrow[{n}]"),
                        For(k, Const(0), n, Block((Assign(_C("wrow")[_C(k)], self.init_value()),)), simd=True)]
        out += self.loop(depth + 1, point.expr, st)
        if ws_here:
            op = "=" if self.assign_once else "+="
            if self.vec:
                out += [Assign(Vec(Addr(_C("outp"), self.linear(self.ein.output, {k: self.lane_offset(m)})),
                                   self.vtype), _C(f"w{m}"), op) for m in range(self.nvec)]
            else:
                out.append(For(k, Const(0), n, Block((Assign(self.target(st), _C("wrow")[_C(k)], op),)),
                               simd=True))
        out += self.maybe_acc_end(depth, st)
        if starts_row:
            out += self.row_end(st)
        if self.s.parallel == "owner" and v == self.ein.output[0] and self.phase == "compute":
            own = Bin("&&", _C(v).ge(_C("own_lo")), _C(v).lt(_C("own_hi")))
            out = out[:len(binds)] + [If(own, Block(tuple(out[len(binds):])))]
        return out

    def locate(self, st):
        """Advance every operand through dense levels whose variable is bound (O(1) each)."""
        out = []
        for t in list(st.level_at):
            while True:
                var, kind = self.next_level(st, t)
                if kind != "dense" or var not in st.bound:
                    break
                k = st.level_at[t]
                out.append(Decl("int64_t", f"q{t}_{k}", st.pos[t] * self.var_size(var) + _C(var)))
                st.pos[t], st.level_at[t] = _C(f"q{t}_{k}"), k + 1
        return out

    def bind_values(self, st, accs):
        out = []
        for a in accs:
            t, op = a.operand, self.s.operands[a.operand]
            if t in st.loaded:
                continue
            if op.sparse and st.level_at[t] == len(op.fmt.levels):
                load = _C(f"vals{t}")[st.pos[t]]
            elif not op.sparse and all(i in st.bound for i in op.indices):
                load = _C(f"d{t}")[self.dense_offset(t)]
            else:
                continue
            out.append(Decl(f"const {self.vtype}", f"v{t}", load))
            st.loaded[t] = _C(f"v{t}")
        return out

    # -------------------------------------------------------------- iteration forms
    def walk_one(self, depth, v, point, st):
        (t,) = point.iterators
        k = st.level_at[t]
        kind, it = self.s.operands[t].fmt.levels[k].kind, f"q{t}_{k}"
        parent, crd = st.pos[t], _C(f"crd{t}_{k}")
        coord = Decl("int64_t", v, Cast("int64_t", crd[_C(it)]))
        if kind == "compressed":
            pos = _C(f"pos{t}_{k}")
            end = Cast("int64_t", pos[parent + Const(1)])
            # prefetch bound: the end of the whole coordinate array, not of this row, so that
            # short rows (5 per row on citation graphs) prefetch the rows that follow them
            self.crd_lengths.add((t, k))
            binds = self.prefetch(v, st, crd, _C(it), _C(f"ncrd{t}_{k}")) + [coord]
            body = Block(tuple(self.body(depth, v, point, st, {t}, binds)))
            # Innermost walk that only sums into the register accumulator (SpMV's row dot):
            # vectorise it (gathers), the reduction made explicit.
            innermost = depth == len(self.s.loop_order) - 1 and self.phase == "compute"
            red = "acc" if innermost and self.acc_depth is not None and not binds[:-1] else None
            lo = Cast("int64_t", pos[parent])
            return [self.batched_reduction(it, lo, end, body)
                    or For(it, lo, end, body, simd=red is not None, reduction=red)]
        if kind == "singleton":
            return [Block(tuple(self.body(depth, v, point, st, {t}, [Decl("int64_t", it, parent), coord])))]
        slot, slots = f"sl{t}_{k}", _C(f"slots{t}_{k}")
        binds = [Decl("int64_t", it, parent * slots + _C(slot)), coord, If(_C(v).lt(0), Block((Break(),)))]
        return [For(slot, Const(0), slots, Block(tuple(self.body(depth, v, point, st, {t}, binds))))]

    def batched_reduction(self, it, lo, end, body: Block):
        """SDDMM's walk: each nonzero ends in one vector reduction (``acc += hsum(total)``,
        then ``out[q] = acc``).  Four nonzeros per step instead, their four vectors reduced
        together (``scorch_hsum4``): the horizontal adds are the loop's bottleneck otherwise.
        The last ``nnz % 4`` go one at a time.  None when ``body`` does not have that shape."""
        *head, acc, red, store = body.body if len(body.body) >= 3 else (None, None, None)
        if not (self.vec_reduce and isinstance(acc, Decl) and acc.name == "acc" and isinstance(red, Assign)
                and red.op == "+=" and isinstance(store, Assign) and store.value == _C("acc")):
            return None
        scale, hsum = (red.value.a, red.value.b) if isinstance(red.value, Bin) and red.value.op == "*" \
            else (None, red.value)
        if not (isinstance(hsum, Call) and hsum.fn.startswith("scorch_hsum_")):
            return None
        vt, q = self.vtype, _C("bq_")
        step = [Decl("const int64_t", "bq_", lo + _C("bblk_") * Const(4))]
        step += [Decl(f"scorch_vec_{vt}", f"bt{u}_") for u in range(4)]
        if scale is not None:
            step.append(Decl(vt, "bc_[4]"))
        for u in range(4):
            sets = (Assign(_C(f"bt{u}_"), hsum.args[0]),) + ((Assign(_C("bc_")[Const(u)], scale),) if scale else ())
            step.append(Scope(Block((Decl("const int64_t", it, q + Const(u)), *head, *sets))))
        parts = tuple(_C(f"bt{u}_") for u in range(4))
        step += [Decl(vt, "bs_[4]"), Eval(Call(f"scorch_hsum4_{vt}", parts + (_C("bs_"),)))]
        for u in range(4):
            value = _C("bs_")[Const(u)] if scale is None else _C("bc_")[Const(u)] * _C("bs_")[Const(u)]
            step.append(Scope(Block((Decl("const int64_t", it, q + Const(u)), Assign(store.target, value, store.op)))))
        blocks = Bin("/", end - lo, Const(4))
        rest = lo + blocks * Const(4)
        return Block((For("bblk_", Const(0), blocks, Block(tuple(step))), For(it, rest, end, body)))

    def prefetch(self, v, st, crd, q, end, distance=16):
        """Software prefetch of the dense rows a walked coordinate will gather, ``distance``
        nonzeros ahead (SpMM's X[j, :], SDDMM's K[j, :]): irregular rows defeat the hardware
        prefetcher.  ``end``: where the coordinate array ends (reading past it is the only
        thing the bound guards; the prefetched row itself is always a valid one)."""
        out = []
        ahead = q + Const(distance)
        for t, op in enumerate(self.s.operands):
            if op.sparse or t not in self.used or v not in op.indices[:-1]:
                continue
            tile_start = self.lane_offset(0) if self.ws else Const(0)
            subst = {i: (Cast("int64_t", crd[ahead]) if i == v else _C(i) if i in st.bound
                         else tile_start if self.ws and i == self.ws[0] else Const(0)) for i in op.indices}
            # every 64-byte line of the slice the vector row workspace reads, not only the first
            # (K=64 on Cora after the GEMM that wrote X: the SpMM 15-20% faster)
            per_line = 64 // (4 if self.vtype == "float" else 8)
            lines = -(-self.nvec * self.lanes // per_line) \
                if (self.vec and op.indices[-1] == self.ws[0] and op.unit_stride) else 1
            base = self.dense_offset(t, subst)
            fetch = tuple(Eval(Call("__builtin_prefetch", (Addr(_C(f"d{t}"), base + Const(m * per_line)
                                                                 if m else base),))) for m in range(lines))
            out.append(If(ahead.lt(end), Block(fetch)))
        return out

    def _ranges(self, st, iters):
        out = []
        for t in sorted(iters):
            k = st.level_at[t]
            pos = _C(f"pos{t}_{k}")
            out += [Decl("int64_t", f"q{t}_{k}", Cast("int64_t", pos[st.pos[t]])),
                    Decl("int64_t", f"e{t}_{k}", Cast("int64_t", pos[st.pos[t] + Const(1)]))]
        return out

    def _cases(self, depth, v, points, st, have, candidates):
        """if/else cascade: the largest point whose iterators all sit at v."""
        chain = None
        for p in reversed([p for p in points if p.iterators <= candidates]):
            cond = None
            for t in sorted(p.iterators):
                c = have(t)
                cond = c if cond is None else Bin("&&", cond, c)
            blk = Block(tuple(self.body(depth, v, p, st, p.iterators)))
            chain = blk if cond is None else (Block((If(cond, blk, chain),)) if chain else Block((If(cond, blk),)))
        return list(chain.body) if chain else []

    def merge(self, depth, v, points, iters, st):
        """Two-pointer co-iteration, one while-loop per lattice point (as a for(;;))."""
        out = self._ranges(st, iters)
        for p in points:
            if not p.iterators:
                continue
            its = sorted(p.iterators)
            k = {t: st.level_at[t] for t in its}
            inside = []
            for t in its:
                inside.append(Decl("int64_t", f"c{t}", Cast("int64_t", _C(f"crd{t}_{k[t]}")[_C(f"q{t}_{k[t]}")])))
            m = _C(f"c{its[0]}")
            for t in its[1:]:
                m = Call("SCORCH_MIN", (m, _C(f"c{t}")))
            inside.append(Decl("int64_t", v, m))
            inside += self._cases(depth, v, points, st, lambda t: _C(f"c{t}").eq(_C(v)), p.iterators)
            inside += [Assign(_C(f"q{t}_{k[t]}"), Cast("int64_t", _C(f"c{t}").eq(_C(v))), "+=") for t in its]
            cond = None
            for t in its:
                c = _C(f"q{t}_{k[t]}").lt(_C(f"e{t}_{k[t]}"))
                cond = c if cond is None else Bin("&&", cond, c)
            out.append(Forever(Block((If(cond, Block(tuple(inside)), Block((Break(),))),))))
        return out

    def dense_merge(self, depth, v, points, iters, st):
        """A dense loop over v; each iterator is consumed when its coordinate equals v."""
        out = self._ranges(st, iters)
        k = {t: st.level_at[t] for t in iters}
        inside = []
        for t in sorted(iters):
            q, e, crd = _C(f"q{t}_{k[t]}"), _C(f"e{t}_{k[t]}"), _C(f"crd{t}_{k[t]}")
            inside.append(Decl("int", f"h{t}", Bin("&&", q.lt(e), Cast("int64_t", crd[q]).eq(_C(v)))))
        inside += self._cases(depth, v, points, st, lambda t: _C(f"h{t}"), iters)
        inside += [Assign(_C(f"q{t}_{k[t]}"), _C(f"h{t}"), "+=") for t in sorted(iters)]
        out.append(For(v, Const(0), self.var_size(v), Block(tuple(inside))))
        return out

    # -------------------------------------------------------------- writes
    def target(self, st):
        if self.s.output[0] == "pattern":
            return _C("outp")[st.pos[self.s.output[1]]]
        return _C("outp")[self.linear(self.ein.output)]

    def value(self, e, st):
        if isinstance(e, Access):
            return st.loaded[e.operand]
        if isinstance(e, Neg):
            return Const(0.0) - self.value(e.a, st)
        if isinstance(e, Zero):
            return Const(0.0)
        a, b = self.value(e.a, st), self.value(e.b, st)
        if e.op in ("max", "min"):
            return Call(("fmax" if e.op == "max" else "fmin") + ("f" if self.vtype == "float" else ""), (a, b))
        return Bin(e.op, a, b)

    def vec_value(self, e, st, m, k):
        """The expression for lanes ``m*L .. m*L+L-1`` of loop ``k`` (see _vectorisable)."""
        if isinstance(e, Access):
            if e.operand in st.loaded:
                return st.loaded[e.operand]
            offset = self.lane_offset(m) if self.vec else Const(m * self.lanes)
            return Vec(Addr(_C(f"d{e.operand}"), self.dense_offset(e.operand, {k: offset})), self.vtype)
        if isinstance(e, Neg):
            return Const(0.0) - self.vec_value(e.a, st, m, k)
        if isinstance(e, Zero):
            return Const(0.0)
        return Bin(e.op, self.vec_value(e.a, st, m, k), self.vec_value(e.b, st, m, k))

    def lane_offset(self, m):
        """First element of vector ``m`` of the row workspace (within the current tile)."""
        return (_C("kt") + Const(m * self.lanes)) if self.tiles > 1 else Const(m * self.lanes)

    def dense_offset(self, t, subst=None):
        """Offset of dense operand ``t``'s element, with index variables replaced per ``subst``."""
        op, subst = self.s.operands[t], subst or {}
        off = None
        for d, idx in enumerate(op.indices):
            i = subst.get(idx, _C(idx))
            term = i if (d == len(op.indices) - 1 and op.unit_stride) else i * _C(f"s{t}_{d}")
            off = term if off is None else off + term
        return off if off is not None else Const(0)

    def init_value(self, subst=None, vec=False):
        """The sum of the init operands at the output element (or vector of lanes, with
        ``subst`` placing the row-workspace index): 0 without init operands."""
        if not self.n_init:
            return VecZero() if vec else Const(0.0)
        total = None
        for u in range(self.n_init):
            off = None
            for d, idx in enumerate(self.ein.output):
                term = (subst or {}).get(idx, _C(idx)) * _C(f"is{u}_{d}")
                off = term if off is None else off + term
            off = off if off is not None else Const(0)
            load = Vec(Addr(_C(f"init{u}"), off), self.vtype) if vec else _C(f"init{u}")[off]
            total = load if total is None else total + load
        return total

    def maybe_acc_start(self, depth, st):
        """A register accumulator once every output index is bound and only reductions remain."""
        s = self.s
        if self.phase != "compute" or self.acc_depth is not None or depth >= len(s.loop_order) - 1:
            return []
        if not all(i in st.bound for i in self.ein.output):
            return []
        self.acc_depth = depth
        return [Decl(self.vtype, "acc", self.init_value())]

    def maybe_acc_end(self, depth, st):
        if self.acc_depth != depth:
            return []
        self.acc_depth = None
        return [Assign(self.target(st), _C("acc"), "=" if self.acc_once or self.pattern_once else "+=")]

    def leaf(self, expr, st):
        val = self.value(expr, st)
        if self.phase == "compute":
            if self.acc_depth is not None:
                return [Assign(_C("acc"), val, "+=")]
            if self.ws:
                return [Assign(_C("wrow")[_C(self.ws[0])], val, "+=")]
            return [Assign(self.target(st), val, "+=")]
        c = _C(self.ein.output[-1])
        if self.in_order:
            if self.phase == "count":
                return [Assign(_C("cnt"), Const(1), "+=")]
            at = _C("rowpos")[_C("row")] + _C("len")
            return [Assign(_C("out_crd")[at], c), Assign(_C("out")[at], val), Assign(_C("len"), Const(1), "+=")]
        first = Bin("!=", _C("mark")[c], _C("row"))
        if self.phase == "count":
            # branch-free: whether a column is new to the row is a coin toss for the predictor
            return [Assign(_C("cnt"), first, "+="), Assign(_C("mark")[c], _C("row"))]
        # The workspace is all zeros between rows (each row's read-off clears what it read).
        # A row whose bitset the read-off will scan (``dense_``, from its count) only sets
        # bits, without a branch; a sparser one lists its columns for the sort.
        one = Bin("<<", Cast("uint64_t", Const(1)), Bin("&", c, Const(63)))
        word = Bin("<<", Cast("uint64_t", Const(1)), Bin("&", Bin(">>", c, Const(6)), Const(63)))
        listed = If(first, Block((Assign(_C("mark")[c], _C("row")), Assign(_C("lst")[_C("len")], c),
                                  Assign(_C("len"), Const(1), "+="))))
        marked = Block((Assign(_C("bit")[Bin(">>", c, Const(6))], one, "|="),
                        Assign(_C("summ")[Bin(">>", c, Const(12))], word, "|=")))
        return [If(_C("dense_"), marked, Block((listed,))), Assign(_C("wsp")[c], val, "+=")]

    def row_start(self, st):
        if self.phase == "compute":
            return []
        row = [Decl("int64_t", "row", self.linear(self.rows))]
        if self.phase == "count" or self.in_order:
            return row + [Decl("int64_t", "cnt" if self.phase == "count" else "len", Const(0))]
        known = _C("rowpos")[_C("row") + Const(1)] - _C("rowpos")[_C("row")]
        return row + [Decl("int64_t", "len", Const(0)), Decl("const int64_t", "known_", known),
                      Decl("const int", "dense_", Bin("<=", _C("nwords"), Const(16) * _C("known_")))]

    def row_end(self, st):
        if self.phase == "count":
            return [Assign(_C("counts")[_C("row")], _C("cnt"))]
        if self.phase != "fill" or self.in_order:
            return []
        base = _C("rowpos")[_C("row")]
        args = (_C("lst"), _C("known_"), _C("bit"), _C("summ"), _C("nwords"), _C("wsp"),
                Addr(_C("out_crd"), base), Addr(_C("out"), base))
        return [Eval(Call(f"scorch_row_out_{self.vtype}_{self.out_index}", args))]

    # -------------------------------------------------------------- threads
    def parallelise(self, loop: For, iters):
        """Split the outermost loop's range across threads, by nonzeros where a compressed
        level sits right below a dense outer loop."""
        s, lo, hi = self.s, loop.lo, loop.hi
        balance = None
        if not iters:
            for t, op in enumerate(s.operands):
                if op.sparse and t in self.used and len(op.fmt.levels) > 1 and op.fmt.levels[0].kind == "dense" \
                        and op.level_vars()[0] == loop.var and op.fmt.levels[1].kind == "compressed":
                    balance = t
                    break
        if balance is not None:
            pos = _C(f"pos{balance}_1")
            wide = Const(1 if s.operands[balance].index_ctype == "int64_t" else 0)
            total = Cast("int64_t", pos[hi])

            def bound(k):
                return Call("scorch_lower_bound", (pos, wide, hi, Bin("/", total * k, _C("nthr"))))
            decls = [Decl("int64_t", "lo_t", bound(_C("tid"))), Decl("int64_t", "hi_t", bound(_C("tid") + Const(1))),
                     If(_C("tid").eq(_C("nthr") - Const(1)), Block((Assign(_C("hi_t"), hi),)))]
        else:
            n = Bin("-", hi, lo)
            decls = [Decl("int64_t", "lo_t", lo + Bin("/", n * _C("tid"), _C("nthr"))),
                     Decl("int64_t", "hi_t", lo + Bin("/", n * (_C("tid") + Const(1)), _C("nthr")))]
        return decls + [For(loop.var, _C("lo_t"), _C("hi_t"), loop.body, loop.simd, loop.reduction)]


def _rewrite_row_loop(stmts, var: str, rewrite):
    """``stmts`` with the loop over rows ``var`` (the thread's share of them, or every row of one
    batch index; possibly inside the loop over batch indices or over column tiles) replaced by
    ``rewrite(loop)`` where that returns statements; and whether it did."""
    out, done = [], False
    for st in stmts:
        if isinstance(st, For) and st.var == var:
            new = rewrite(st)
            if new is not None:
                out += new
                done = True
                continue
        elif isinstance(st, For):
            inner, found = _rewrite_row_loop(st.body.body, var, rewrite)
            if found:
                st = For(st.var, st.lo, st.hi, Block(tuple(inner)), st.simd, st.reduction)
                done = True
        out.append(st)
    return out, done


def _product_factors(expr):
    """The accesses multiplied in ``expr`` (a product of operand accesses), outer first; None
    when it is anything else."""
    factors, stack = [], [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Op) and e.op == "*":
            stack += [e.b, e.a]
        elif isinstance(e, Access):
            factors.append(e)
        else:
            return None
    return factors


def _csr_like(op) -> bool:
    """Dense levels over one ordered, unique compressed level (CSR, batched CSR), unblocked."""
    levels = op.fmt.levels
    return (not op.fmt.block and len(levels) >= 2 and levels[-1].kind == "compressed" and levels[-1].ordered
            and levels[-1].unique and all(lv.kind == "dense" for lv in levels[:-1]))


def _split_product(expr, loaded):
    """``(scalars, rest)`` of a product: the factors that are loaded values (None if none)
    and the others (``expr`` itself when it is not a product with such factors)."""
    factors = []

    def flatten(e):
        if isinstance(e, Op) and e.op == "*":
            flatten(e.a)
            flatten(e.b)
        else:
            factors.append(e)
    flatten(expr)
    scal = [f for f in factors if isinstance(f, Access) and f.operand in loaded]
    rest = [f for f in factors if not (isinstance(f, Access) and f.operand in loaded)]
    if not scal or not rest:
        return None, expr
    prod = lambda fs: fs[0] if len(fs) == 1 else Op("*", prod(fs[:-1]), fs[-1])  # noqa: E731
    return prod(scal), prod(rest)


def _present(expr) -> set:
    return {a.operand for a in accesses(expr)}


def lower(schedule: Schedule, vtype: str, phase: str = "compute", static: dict | None = None,
          n_init: int = 0, vector_bytes: int = 64, out_index: str = "int64_t") -> Kernel:
    """Lower ``schedule`` to a kernel computing in ``vtype`` ("float" or "double").

    ``phase``: "compute" (dense or pattern output), or "count" / "fill" (the two
    passes of an assembled sparse output).  ``static``: index sizes to bake in as
    constants (the row workspace needs its length at compile time).  ``n_init``: dense
    output-shaped operands the result starts from (``Kernel.fused_init`` says whether the
    loop nest could take them; the caller adds them afterwards otherwise).  ``vector_bytes``:
    the width of the target's vector registers (16, 32 or 64), the width of ``scorch_vec_*``.
    ``out_index``: the C type of the coordinates a "fill" pass writes ("int64_t" or "int32_t",
    the assembled result's index type)."""
    if vector_bytes not in (16, 32, 64):
        raise ValueError(f"lower: vector_bytes must be 16, 32 or 64, got {vector_bytes!r}")
    if out_index not in ("int64_t", "int32_t"):
        raise ValueError(f"lower: out_index must be 'int64_t' or 'int32_t', got {out_index!r}")
    return _Lowerer(schedule, vtype, phase, static or {}, n_init, vector_bytes, out_index).lower()
