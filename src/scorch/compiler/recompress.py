"""CSR <-> CSC: a compressed matrix's storage sorted by its other dimension, by counting.

``recompressed(pos, crd, values, n_major, n_minor)`` gives the positions, coordinates and
values of the same matrix compressed along the other dimension (CSR's pos / col / values ->
CSC's colptr / row / values), the way scipy transposes: count the
entries of each minor coordinate, a prefix sum, one pass placing each entry (entries of one
minor coordinate stay in major order: sorted).  O(nnz + n) where the general conversion
sorts packed keys (O(nnz log nnz)): Cora 0.36 ms, 1M entries 22 ms before.  The loop nest is
built in the compiler's IR and compiled and cached like the einsum kernels.

Inputs come from a SparseTensor (validated storage: every coordinate below ``n_minor``).
"""

from __future__ import annotations

import torch

from . import build, codegen
from .ir import Assign, Block, Const, Decl, For, Kernel, Param, Var

_ITYPES = {torch.int32: "int32_t", torch.int64: "int64_t"}
_WORDS = {4: "uint32_t", 8: "uint64_t"}


def _kernel(itype: str, wtype: str | None) -> Kernel:
    """``wtype``: the values moved as words of that type inside the loop (any 4- or 8-byte
    dtype, bit for bit); None: only the entry order (``perm``, always written) moves them."""
    n_major, n_minor, pos, crd = Var("n_major"), Var("n_minor"), Var("pos"), Var("crd")
    opos, cur, ocrd, perm, out = Var("opos"), Var("cur"), Var("ocrd"), Var("perm"), Var("out")
    i, q, c, d = Var("i"), Var("q"), Var("c"), Var("d")
    body = Block((
        Decl("const int64_t", "nnz", pos[n_major]),
        For("q", Const(0), Var("nnz"), Block((Assign(opos[crd[q] + 1], opos[crd[q] + 1] + 1),))),
        For("c", Const(0), n_minor, Block((Assign(opos[c + 1], opos[c + 1] + opos[c]),
                                           Assign(cur[c], opos[c])))),
        For("i", Const(0), n_major, Block((
            For("q", pos[i], pos[i + 1], Block((
                Decl("const int64_t", "k", crd[q]),
                Decl("const int64_t", "d", cur[Var("k")]),
                Assign(cur[Var("k")], d + 1),
                Assign(ocrd[d], i),
                Assign(perm[d], q),
            ) + ((Assign(out[d], Var("vals")[q]),) if wtype else ()))),
        ))),
    ))
    params = (Param("n_major", "int64_t", ("size", "major")), Param("n_minor", "int64_t", ("size", "minor")),
              Param("pos", f"const {itype} *", ("pos",)), Param("crd", f"const {itype} *", ("crd",)),
              Param("opos", f"{itype} *", ("out_pos",)), Param("cur", "int64_t *", ("scratch",)),
              Param("ocrd", f"{itype} *", ("out_crd",)), Param("perm", "int64_t *", ("perm",)))
    if wtype:
        params += (Param("vals", f"const {wtype} *", ("vals",)), Param("out", f"{wtype} *", ("out",)))
    return Kernel(f"recompress_{itype}_{wtype or 'perm'}", params, body, vector_bytes=build.vector_bytes())


def _function(itype: str, wtype: str | None):
    return codegen.load("recompress", (itype, wtype), lambda: _kernel(itype, wtype))


def source(itype: str = "int32_t", wtype: str | None = "uint32_t") -> str:
    """The generated C (for inspection and tests)."""
    return codegen.render(_kernel(itype, wtype))


def recompressed(pos: torch.Tensor, crd: torch.Tensor, values: torch.Tensor, n_major: int, n_minor: int):
    """``(pos, crd, values)`` of the matrix whose major-compressed storage is ``pos`` / ``crd``
    / ``values`` (``n_major + 1`` positions, minor coordinates below ``n_minor``, contiguous,
    one integer type for both index arrays), compressed along the minor dimension instead.
    Values of 4 or 8 bytes move inside the kernel, others by the entry order it writes.  The
    pattern's part is remembered on ``crd`` beside the ``pos`` it came from (and their versions): a
    pattern recompressed again -- ``A^T X`` in every training step, the re-formats a schedule asks
    for per call -- costs one gather of the values (1M: 8 -> 0.8-1.8 ms).  None without a C compiler or for another index type (the caller converts generally)."""
    cached = getattr(crd, "_scorch_recompressed", None)
    if cached is not None and cached[0] is pos and cached[1] == n_minor and cached[3] == _versions(pos, crd) \
            and (cached[4] is None or cached[4] == _versions(*cached[2][:2])):   # (the way back: its arrays too)
        out_pos, out_crd, perm = cached[2]
        if perm is None:   # the way back (see below): the inverse permutation, made on first use
            back = out_crd._scorch_recompressed[2][2]
            perm = torch.empty_like(back)
            perm[back] = torch.arange(back.numel(), dtype=back.dtype)
            crd._scorch_recompressed = (pos, n_minor, (out_pos, out_crd, perm), cached[3], cached[4])
        return out_pos, out_crd, torch.index_select(values, 0, perm)
    itype = _ITYPES.get(crd.dtype)
    if itype is None or pos.dtype != crd.dtype or not build.have_compiler():
        return None
    nnz = crd.numel()
    wtype = _WORDS.get(values.element_size()) if values.is_contiguous() and values.numel() == nnz else None
    out_pos = torch.zeros(n_minor + 1, dtype=crd.dtype)
    out_crd = torch.empty(nnz, dtype=crd.dtype)
    perm = torch.empty(nnz, dtype=torch.int64)
    cursor = torch.empty(max(n_minor, 1), dtype=torch.int64)
    out = torch.empty(nnz, dtype=values.dtype) if wtype else None
    args = (values.data_ptr(), out.data_ptr()) if wtype else ()
    _function(itype, wtype)(n_major, n_minor, pos.data_ptr(), crd.data_ptr(), out_pos.data_ptr(), cursor.data_ptr(),
                            out_crd.data_ptr(), perm.data_ptr(), *args)
    crd._scorch_recompressed = (pos, n_minor, (out_pos, out_crd, perm), _versions(pos, crd), None)
    # and the way back, to these very arrays: transposing the result again (x = x.t().asformat("csr") in a
    # loop) reuses them instead of making a new pattern whose cache would hold the next (a chain that
    # grew by a pattern per step); the two arrays refer to each other: a cycle the collector frees
    out_crd._scorch_recompressed = (out_pos, n_major, (pos, crd, None), _versions(out_pos, out_crd),
                                    _versions(pos, crd))
    return out_pos, out_crd, (out if wtype else torch.index_select(values, 0, perm))


def _versions(pos: torch.Tensor, crd: torch.Tensor) -> tuple:
    """The arrays' versions: scorch never writes a pattern, but one taken without a copy (a torch
    CSR's) may be rewritten by its owner, and the remembered recompression is then stale."""
    return pos._version, crd._version
