"""Dense transposes as generated tiled kernels: ``transposed(x)`` is ``x.t().contiguous()``.

A 2-d float tensor is copied in square tiles, 16 x 16 floats or 8 x 8 doubles (one vector
register a row on AVX-512), each transposed in registers (``scorch_tile_t_*`` in codegen's
TILE_PRELUDE; element by element on other targets): every cache line of the input is read
once and the output rows are written in runs.  The loop nest -- the threads' shares of the
column tiles, the rows and columns past the last whole tile -- is built in the compiler's IR
and printed, compiled and cached like the einsum kernels.  torch's strided copy moves one
element at a time (256 x 1024 floats: 128 -> 24 us on 2 cores here).

    transposed(x) -> x.t().contiguous()
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwAD

from . import build, codegen
from .ir import Addr, Assign, Block, Call, Const, Decl, Eval, For, If, Kernel, Param, Parallel, Var

_C = Var
_TILE = {"float": 16, "double": 8}
_VTYPES = {torch.float32: "float", torch.float64: "double"}


def _kernel(vtype: str) -> Kernel:
    """``y[c * rows + r] = x[r * cols + c]``: the thread's whole column tiles, all rows, in tiles;
    the rows past the last whole row tile element by element; the last thread also the
    columns past the last whole column tile."""
    t = _TILE[vtype]
    rows, cols, x, y = _C("rows"), _C("cols"), _C("x"), _C("y")
    r, c, ct, rt = _C("r"), _C("c"), _C("ct"), _C("rt")

    def element(r, c):
        return Assign(y[c * rows + r], x[r * cols + c])
    tile = Eval(Call(f"scorch_tile_t_{vtype}", (Addr(x, rt * Const(t) * cols + ct * Const(t)), cols,
                                                  Addr(y, ct * Const(t) * rows + rt * Const(t)), rows)))
    region = (
        Decl("const int64_t", "tiles", cols / Const(t)),
        Decl("const int64_t", "t_lo", _C("tiles") * _C("tid") / _C("nthr")),
        Decl("const int64_t", "t_hi", _C("tiles") * (_C("tid") + Const(1)) / _C("nthr")),
        Decl("const int64_t", "whole", Const(t) * (rows / Const(t))),
        For("ct", _C("t_lo"), _C("t_hi"), Block((For("rt", Const(0), rows / Const(t), Block((tile,))),))),
        For("c", Const(t) * _C("t_lo"), Const(t) * _C("t_hi"),
            Block((For("r", _C("whole"), rows, Block((element(r, c),))),))),
        If(_C("tid").eq(_C("nthr") - Const(1)),
           Block((For("c", Const(t) * _C("tiles"), cols,
                      Block((For("r", Const(0), rows, Block((element(r, c),))),))),))),
    )
    params = (Param("nthreads", "int64_t", ("nthreads",)), Param("rows", "int64_t", ("size", "rows")),
              Param("cols", "int64_t", ("size", "cols")), Param("x", f"const {vtype} *", ("x",)),
              Param("y", f"{vtype} *", ("out",)))
    return Kernel(f"transpose_{vtype}", params, Block((Parallel(Block(region), _C("nthreads")),)),
                  writes_every_output=True, vector_bytes=build.vector_bytes())


def _function(vtype: str):
    return codegen.load("permute", vtype, lambda: _kernel(vtype))


def source(vtype: str = "float") -> str:
    """The generated C of the transpose kernel (for inspection and tests)."""
    return codegen.render(_kernel(vtype))


def transposed(x: torch.Tensor) -> torch.Tensor:
    """``x.t().contiguous()`` for a 2-d tensor: the tiled kernel for a contiguous float32 /
    float64 CPU tensor (no grad), else torch's copy."""
    vtype = _VTYPES.get(x.dtype)
    if (vtype is None or x.dim() != 2 or not x.is_contiguous() or x.device.type != "cpu" or x.is_neg()
            or (x.requires_grad and torch.is_grad_enabled()) or not build.have_compiler()
            or _fwAD._current_level >= 0 or torch._C._functorch.maybe_current_level() is not None):
        # (forward-mode AD or a torch.func transform: torch's copy keeps the tangent / the wrapping;
        # a lazily negated tensor: torch's copy applies the negation the raw memory lacks)
        return x.t().contiguous()
    rows, cols = x.shape
    out = torch.empty((cols, rows), dtype=x.dtype)
    if x.numel():
        _function(vtype)(build.threads_for(x.numel()), rows, cols, x.data_ptr(), out.data_ptr())
    return out
