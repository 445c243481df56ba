"""Row-segment kernels: softmax / log_softmax over runs of stored values.

A CSR row (or a CSF fibre) is a contiguous run ``vals[pos[r] : pos[r+1]]`` of the
innermost compressed level.  A softmax over that level is, per run, a max
reduction, a sum of exponentials and a scaling: three loops over the run, which
the einsum lowering does not express (it has no ``exp``).  This module builds
that loop nest in the same IR, printed by the same code generator and compiled
and cached by the same build step as the einsum kernels; runs are split across
threads by stored entries (``scorch_lower_bound`` over ``pos``) like the
einsum kernels' rows.

    softmax(pos, vals, scale, log=False) -> values
"""

from __future__ import annotations

import ctypes

import torch

from . import build, codegen
from .ir import Addr, Assign, Bin, Block, Call, Cast, Const, Decl, For, If, Kernel, Param, Parallel, Var, Vec

_C = Var
_FNS: dict = {}


def _kernel(vtype: str, itype: str, log: bool, vbytes: int = 64) -> Kernel:
    pos, vals, out = _C("pos"), _C("vals"), _C("out")
    lo, hi = Cast("int64_t", pos[_C("r")]), Cast("int64_t", pos[_C("r") + Const(1)])
    q, m, s = _C("q"), _C("m"), _C("s")
    x = _C("scale") * vals[q]
    body = [Decl("const int64_t", "lo", lo), Decl("const int64_t", "hi", hi), Decl(vtype, "m", _C("-INFINITY")),
            For("q", _C("lo"), _C("hi"), Block((Assign(m, Call("SCORCH_MAX", (m, x))),)), simd=True,
                reduction="max:m")]
    # out = exp(x - m): a vector of lanes at a time through the vector exp, then the rest one by one
    rest = _C("lo")
    if vtype == "float":
        lanes = vbytes // 4
        blocks = Bin("/", _C("hi") - _C("lo"), Const(lanes))
        vq = _C("lo") + _C("b") * Const(lanes)
        vx = _C("scale") * Vec(Addr(vals, vq), vtype)
        body.append(For("b", Const(0), blocks, Block((
            Assign(Vec(Addr(out, vq), vtype), Call("scorch_exp_vec_float", (vx - m,))),))))
        rest = _C("lo") + blocks * Const(lanes)
    body += [For("q", rest, _C("hi"), Block((Assign(out[q], Call(f"scorch_exp_{vtype}", (x - m,))),))),
             Decl(vtype, "s", Const(0.0)),
             For("q", _C("lo"), _C("hi"), Block((Assign(s, out[q], "+="),)), simd=True, reduction="s")]
    if log:
        shift = m + Call("log" + ("f" if vtype == "float" else ""), (s,))
        body += [Decl(f"const {vtype}", "shift", shift),
                 For("q", _C("lo"), _C("hi"), Block((Assign(out[q], x - _C("shift")),)), simd=True)]
    else:
        body += [Decl(f"const {vtype}", "inv", Cast(vtype, Const(1.0)) / s),
                 For("q", _C("lo"), _C("hi"), Block((Assign(out[q], out[q] * _C("inv")),)), simd=True)]
    wide = Const(1 if itype == "int64_t" else 0)
    total = Cast("int64_t", pos[_C("n")])

    def bound(k):
        return Call("scorch_lower_bound", (pos, wide, _C("n"), total * k / _C("nthr")))
    region = [Decl("int64_t", "lo_t", bound(_C("tid"))), Decl("int64_t", "hi_t", bound(_C("tid") + Const(1))),
              If(_C("tid").eq(_C("nthr") - Const(1)), Block((Assign(_C("hi_t"), _C("n")),))),
              For("r", _C("lo_t"), _C("hi_t"), Block(tuple(body)))]
    params = (Param("nthreads", "int64_t", ("nthreads",)), Param("n", "int64_t", ("size", "n")),
              Param("pos", f"const {itype} *", ("pos",)), Param("vals", f"const {vtype} *", ("vals",)),
              Param("scale", vtype, ("scale",)), Param("out", f"{vtype} *", ("out",)))
    name = "log_softmax" if log else "softmax"
    return Kernel(name, params, Block((Parallel(Block(tuple(region)), _C("nthreads")),)), vector_bytes=vbytes)


def _function(vtype: str, itype: str, log: bool):
    key = (vtype, itype, log, build.vector_bytes())
    fn = _FNS.get(key)
    if fn is None:
        k = _kernel(vtype, itype, log, key[-1])
        fn = getattr(build.compile_library(codegen.render(k), tag="segments"), k.name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p if p.ctype.endswith("*") else
                       (ctypes.c_float if p.ctype == "float" else ctypes.c_double if p.ctype == "double"
                        else ctypes.c_int64) for p in k.params]
        _FNS[key] = fn
    return fn


def source(vtype: str = "float", itype: str = "int32_t", log: bool = False) -> str:
    """The generated C of one softmax kernel (for inspection and tests)."""
    return codegen.render(_kernel(vtype, itype, log, build.vector_bytes()))


def softmax(pos: torch.Tensor, vals: torch.Tensor, scale: float = 1.0, log: bool = False) -> torch.Tensor:
    """``softmax(scale * vals)`` (or log_softmax) within each run ``pos[r] : pos[r+1]``.

    ``pos``: int32/int64, non-decreasing from 0 to ``vals.numel()`` (validated where the
    SparseTensor was built); ``vals``: contiguous float32/float64.  An empty run has no
    values; a run of -inf gives NaN, as torch's softmax does."""
    vtype = {torch.float32: "float", torch.float64: "double"}[vals.dtype]
    itype = {torch.int32: "int32_t", torch.int64: "int64_t"}[pos.dtype]
    pos, vals = pos.contiguous(), vals.contiguous()
    out = torch.empty_like(vals)
    n = pos.numel() - 1
    if n <= 0 or vals.numel() == 0:
        return out
    _function(vtype, itype, log)(build.threads_for(vals.numel() * 8), n, pos.data_ptr(), vals.data_ptr(), scale,
                                 out.data_ptr())
    return out
