"""Row-segment kernels: softmax / log_softmax over runs of stored values.

A CSR row (or a CSF fibre) is a contiguous run ``vals[pos[r] : pos[r+1]]`` of a
compressed level.  A softmax over that level is, per run, a max reduction, a sum
of exponentials and a scaling, which the einsum lowering does not express (it has
no ``exp``).  This module builds that loop nest in the same IR, printed by the
same code generator and compiled and cached by the same build step as the einsum
kernels; runs are split across threads by stored entries (``scorch_lower_bound``
over ``pos``) like the einsum kernels' rows.  Dense levels under the run's level
(a vector of ``width`` values per stored entry: one score per attention head)
make ``width`` interleaved columns, each with its own softmax.

Per thread: (1) each run's max and the shifted values; (2) one vectorised exp
over the thread's whole range of values, so rows of a few entries (graphs) still
fill the vector exp; (3) each run's sum, then the scaling.  Short runs loop as
scalar code, long ones (attention windows) as ``omp simd`` loops.

    softmax(pos, vals, scale, log=False, width=1) -> values

Two more loop nests over runs give the per-pattern arrays the AVX-512 SpMV and SDDMM
kernels read (``convert.entry_parents`` / ``entry_heads``): each entry's run, and a bit
per entry that starts its run.

    parents(pos) -> run of every entry;  heads(pos, pad) -> bit q set: entry q starts a run
"""

from __future__ import annotations


import torch

from . import build, codegen
from .ir import Addr, Assign, Bin, Block, Call, Cast, Const, Decl, For, If, Kernel, Param, Parallel, Var, Vec

_C = Var


# Runs shorter than this loop as plain scalar code: a vectorised loop's set-up and remainder
# cost more than they save on graph rows of a few entries (measured on AVX2: 3 vs 10 ns per
# value at 3 entries a run), while runs of attention windows gain 2x from the vectors.
SHORT_RUN = 32


def _thread_runs(itype: str, start=None) -> tuple:
    """Declarations of ``lo_t`` / ``hi_t``: this thread's runs ``0 .. n-1`` of ``pos``, the first
    run starting at or after entry ``start(k)`` for share ``k`` of ``nthr`` (default: an equal
    share of the stored entries; ``scorch_lower_bound`` over ``pos``), the last thread to ``n``."""
    pos = _C("pos")
    wide = Const(1 if itype == "int64_t" else 0)
    if start is None:
        def start(k):
            return Cast("int64_t", pos[_C("n")]) * k / _C("nthr")

    def bound(k):
        return Call("scorch_lower_bound", (pos, wide, _C("n"), start(k)))
    return (Decl("int64_t", "lo_t", bound(_C("tid"))), Decl("int64_t", "hi_t", bound(_C("tid") + Const(1))),
            If(_C("tid").eq(_C("nthr") - Const(1)), Block((Assign(_C("hi_t"), _C("n")),))))


def _kernel(vtype: str, itype: str, log: bool, vbytes: int = 64, width: int = 1) -> Kernel:
    """The softmax kernel over runs of ``width`` interleaved columns: value ``q * width + w`` is
    entry ``q`` of column ``w`` (``width > 1``: a dense level under the run's, e.g. the heads of
    a multi-head attention pattern)."""
    pos, vals, out, work = _C("pos"), _C("vals"), _C("out"), _C("work")
    e = work if log else out
    finish_op = "-=" if log else "*="
    if width == 1:
        shift, finish = _runs_contiguous(vtype, log, vals, out, e, finish_op)
    else:
        shift, finish = _runs_interleaved(vtype, log, width, vals, out, e, finish_op)
    # exp over the thread's whole stored range at once, a vector of lanes at a time: short runs
    # (graph rows of a few entries) still fill the vector exp
    q = _C("q")
    exps = [Decl("const int64_t", "v0", Cast("int64_t", pos[_C("lo_t")]) * Const(width)),
            Decl("const int64_t", "v1", Cast("int64_t", pos[_C("hi_t")]) * Const(width)),
            Decl("int64_t", "rest", _C("v0"))]
    if vtype == "float":
        lanes = vbytes // 4
        vq = _C("v0") + _C("b") * Const(lanes)
        exps += [Decl("const int64_t", "blocks", Bin("/", _C("v1") - _C("v0"), Const(lanes))),
                 For("b", Const(0), _C("blocks"), Block((
                     Assign(Vec(Addr(e, vq), vtype), Call("scorch_exp_vec_float", (Vec(Addr(out, vq), vtype),))),))),
                 Assign(_C("rest"), _C("v0") + _C("blocks") * Const(lanes))]
    exps.append(For("q", _C("rest"), _C("v1"), Block((Assign(e[q], Call(f"scorch_exp_{vtype}", (out[q],))),))))
    region = [*_thread_runs(itype), shift, *exps, finish]
    params = (Param("nthreads", "int64_t", ("nthreads",)), Param("n", "int64_t", ("size", "n")),
              Param("pos", f"const {itype} *", ("pos",)), Param("vals", f"const {vtype} *", ("vals",)),
              Param("scale", vtype, ("scale",)), Param("out", f"{vtype} *", ("out",)))
    if log:
        params += (Param("work", f"{vtype} *", ("work",)),)
    name = ("log_softmax" if log else "softmax") + (f"_w{width}" if width > 1 else "")
    return Kernel(name, params, Block((Parallel(Block(tuple(region)), _C("nthreads")),)), vector_bytes=vbytes)


def _per_run(body) -> For:
    """``for r in this thread's runs``; ``lo``/``hi`` bound run ``r``'s entries."""
    pos = _C("pos")
    return For("r", _C("lo_t"), _C("hi_t"), Block((
        Decl("const int64_t", "lo", Cast("int64_t", pos[_C("r")])),
        Decl("const int64_t", "hi", Cast("int64_t", pos[_C("r") + Const(1)])), *body)))


def _finish_factor(vtype, log, s):
    """What a run's values take from its sum of exponentials ``s``: ``log(s)`` (subtracted) or
    ``1 / s`` (multiplied)."""
    return Call("log" + ("f" if vtype == "float" else ""), (s,)) if log else Cast(vtype, Const(1.0)) / s


def _runs_contiguous(vtype, log, vals, out, e, finish_op):
    """One column: (1) per run its max and the shifted values into ``out``; (3) per run the sum
    of the exponentials, then scale or subtract its log.  Each loop over a run is plain scalar
    code for a short run and ``omp simd`` for a long one."""
    q, m, s = _C("q"), _C("m"), _C("s")
    x = _C("scale") * vals[q]

    def split(*steps):
        def loops(simd):
            body = []
            for decls, stmt, red in steps:
                body += [*decls, For("q", _C("lo"), _C("hi"), Block((stmt,)), simd=simd,
                                     reduction=red if simd else None)]
            return Block(tuple(body))
        return _per_run((If((_C("hi") - _C("lo")).lt(Const(SHORT_RUN)), loops(False), loops(True)),))
    shift = split(((Decl(vtype, "m", _C("-INFINITY")),), Assign(m, Call("SCORCH_MAX", (m, x))), "max:m"),
                  ((), Assign(out[q], x - m), None))
    finish = split(((Decl(vtype, "s", Const(0.0)),), Assign(s, e[q], "+="), "+:s"),
                   ((Decl(f"const {vtype}", "f", _finish_factor(vtype, log, s)),), Assign(out[q], _C("f"), finish_op),
                    None))
    return shift, finish


def _runs_interleaved(vtype, log, width, vals, out, e, finish_op):
    """``width`` columns at once: per run, arrays of ``width`` maxima and sums; the inner loops
    over the columns are contiguous (vectorised by the compiler for a wide enough ``width``)."""
    q, w, m, s = _C("q"), _C("w"), _C("m"), _C("s")
    at = q * Const(width) + w
    x = _C("scale") * vals[at]

    def cols(*stmts):
        return For("w", Const(0), Const(width), Block(stmts))

    def over_run(*stmts):
        return For("q", _C("lo"), _C("hi"), Block((cols(*stmts),)))
    shift = _per_run((Decl(vtype, f"m[{width}]"), cols(Assign(m[w], _C("-INFINITY"))),
                      over_run(Assign(m[w], Call("SCORCH_MAX", (m[w], x)))),
                      over_run(Assign(out[at], x - m[w]))))
    finish = _per_run((Decl(vtype, f"s[{width}]"), cols(Assign(s[w], Const(0.0))),
                       over_run(Assign(s[w], e[at], "+=")), cols(Assign(s[w], _finish_factor(vtype, log, s[w]))),
                       over_run(Assign(out[at], s[w], finish_op))))
    return shift, finish


def _function(vtype: str, itype: str, log: bool, width: int = 1):
    # the target's vector width is read when the kernel is first built, as the einsum plans do
    # (reading it per call took three environment lookups: 2 of a Cora softmax's 24 us)
    return codegen.load("segments", (vtype, itype, log, width),
                        lambda: _kernel(vtype, itype, log, build.vector_bytes(), width))


def source(vtype: str = "float", itype: str = "int32_t", log: bool = False, width: int = 1) -> str:
    """The generated C of one softmax kernel (for inspection and tests)."""
    return codegen.render(_kernel(vtype, itype, log, build.vector_bytes(), width))


def softmax(pos: torch.Tensor, vals: torch.Tensor, scale: float = 1.0, log: bool = False,
            width: int = 1) -> torch.Tensor:
    """``softmax(scale * vals)`` (or log_softmax) within each run ``pos[r] : pos[r+1]``, for each
    of ``width`` interleaved columns (value ``q * width + w``).

    ``pos``: int32/int64, non-decreasing from 0 to ``vals.numel() / width`` (validated where the
    SparseTensor was built); ``vals``: contiguous float32/float64.  An empty run has no
    values; a run of -inf gives NaN, as torch's softmax does."""
    vtype = {torch.float32: "float", torch.float64: "double"}[vals.dtype]
    itype = {torch.int32: "int32_t", torch.int64: "int64_t"}[pos.dtype]
    pos, vals = pos.contiguous(), vals.contiguous()
    out = torch.empty_like(vals)
    n = pos.numel() - 1
    if n <= 0 or vals.numel() == 0:
        return out
    args = [build.threads_for(vals.numel() * 8), n, pos.data_ptr(), vals.data_ptr(), scale, out.data_ptr()]
    if log:  # the exponentials, summed per run (out keeps the shifted values)
        work = torch.empty_like(vals)
        args.append(work.data_ptr())
    _function(vtype, itype, log, width)(*args)
    return out


# ------------------------------------------------------------------ entry runs and run heads

def _parents_kernel(itype: str) -> Kernel:
    """``par[q] = r`` for every entry ``q`` of run ``r``; runs split across threads by entries."""
    pos, r, q = _C("pos"), _C("r"), _C("q")
    fill = For("q", Cast("int64_t", pos[r]), Cast("int64_t", pos[r + Const(1)]),
               Block((Assign(_C("par")[q], Cast(itype, r)),)))
    region = (*_thread_runs(itype), For("r", _C("lo_t"), _C("hi_t"), Block((fill,))))
    params = (Param("nthreads", "int64_t", ("nthreads",)), Param("n", "int64_t", ("size", "n")),
              Param("pos", f"const {itype} *", ("pos",)), Param("par", f"{itype} *", ("out",)))
    return Kernel(f"entry_parents_{itype}", params, Block((Parallel(Block(region), _C("nthreads")),)))


def _heads_kernel(itype: str) -> Kernel:
    """Into zeroed ``heads``: bit ``q % 8`` of byte ``q // 8`` set for the first entry ``q`` of
    every non-empty run.  Each thread owns a range of bytes and takes the runs that start in
    it (``scorch_lower_bound`` over ``pos``), so no two threads write one byte."""
    pos, r, q = _C("pos"), _C("r"), _C("q")
    stored = Cast("uint32_t", q.lt(Cast("int64_t", pos[r + Const(1)])))  # 0 for an empty run: no branch
    region = (*_thread_runs(itype, lambda k: Const(8) * (_C("nbytes") * k / _C("nthr"))),  # by bytes of heads
              For("r", _C("lo_t"), _C("hi_t"), Block((
                  Decl("const int64_t", "q", Cast("int64_t", pos[r])),
                  Assign(_C("heads")[Bin(">>", q, Const(3))],
                         Cast("uint8_t", Bin("<<", stored, Bin("&", q, Const(7)))), "|=")))))
    params = (Param("nthreads", "int64_t", ("nthreads",)), Param("n", "int64_t", ("size", "n")),
              Param("nbytes", "int64_t", ("size", "nbytes")), Param("pos", f"const {itype} *", ("pos",)),
              Param("heads", "uint8_t *", ("out",)))
    return Kernel(f"entry_heads_{itype}", params, Block((Parallel(Block(region), _C("nthreads")),)))


_ITYPES = {torch.int32: "int32_t", torch.int64: "int64_t"}


def parents(pos: torch.Tensor) -> torch.Tensor:
    """The run of every entry (``pos``: validated, non-decreasing from 0), in ``pos``'s dtype."""
    pos = pos.contiguous()
    n, nnz = pos.numel() - 1, int(pos[-1])
    out = torch.empty(nnz, dtype=pos.dtype)
    if nnz:
        itype = _ITYPES[pos.dtype]
        fn = codegen.load("segments", ("parents", itype), lambda: _parents_kernel(itype))
        fn(build.threads_for(nnz), n, pos.data_ptr(), out.data_ptr())
    return out


def heads(pos: torch.Tensor, pad: int) -> torch.Tensor:
    """Bit ``q % 8`` of byte ``q // 8`` set when entry ``q`` is the first of its run (``pos``:
    validated, non-decreasing from 0), as uint8, then ``pad`` zero bytes."""
    pos = pos.contiguous()
    n, nnz = pos.numel() - 1, int(pos[-1])
    nbytes = (nnz + 7) // 8 + pad
    out = torch.zeros(nbytes, dtype=torch.uint8)
    if n > 0:
        itype = _ITYPES[pos.dtype]
        fn = codegen.load("segments", ("heads", itype), lambda: _heads_kernel(itype))
        fn(build.threads_for(n), n, nbytes, pos.data_ptr(), out.data_ptr())
    return out
