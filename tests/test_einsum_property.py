"""Property test: scorch.einsum == torch.einsum on the densified operands, for random
expressions of 1-4 operands of up to 4 dims over every preset format (and the
named kernels of the compiler issue), always through generated code."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

LETTERS = "ijklm"


def presets(ndim, shape):
    names = ["dense", "coo", "csr", "dcsr", "csf", "ell"] + (["csc", "dcsc"] if ndim >= 2 else [])
    fmts = list(names)
    if ndim == 2:
        for bh in (1, 2):
            for bw in (1, 2, 3):
                if shape[0] % bh == 0 and shape[1] % bw == 0 and (bh, bw) != (1, 1):
                    fmts.append(scorch.formats.bsr(bh, bw))
                    fmts.append(scorch.formats.bsc(bh, bw))
    return fmts


@st.composite
def problems(draw):
    nops = draw(st.integers(1, 4))
    letters = LETTERS[:draw(st.integers(1, 5))]
    sizes = {c: draw(st.integers(0, 5)) for c in letters}
    terms = []
    for _ in range(nops):
        nd = draw(st.integers(1, min(4, len(letters))))
        terms.append("".join(draw(st.permutations(letters))[:nd]))
    used = sorted(set("".join(terms)))
    out = "".join(draw(st.permutations(used))[:draw(st.integers(0, len(used)))])
    ops = []
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    for k, t in enumerate(terms):
        shape = tuple(sizes[c] for c in t)
        density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        x = x * (torch.rand(shape, generator=g) < density)
        sparse = k == 0 or draw(st.booleans())
        if sparse:
            fmt = draw(st.sampled_from(presets(len(t), shape)))
            ops.append(scorch.as_sparse(x, fmt))
        else:
            ops.append(x)
    return ",".join(terms) + "->" + out, ops


def dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_random_einsums_match_torch(problem):
    eq, ops = problem
    want = torch.einsum(eq, *[dense(x) for x in ops])
    plan = scorch.explain(eq, *ops)
    got = scorch.einsum(eq, *ops)
    if plan.backend == "permute (no kernel)":  # "ij->ji" of one sparse operand: its storage, dims reordered
        assert len(ops) == 1 and isinstance(got, scorch.SparseTensor) and got._vals is ops[0]._vals
    else:
        assert plan.backend == "generated C" and plan.kernels
    assert tuple(got.shape) == tuple(want.shape)
    torch.testing.assert_close(dense(got), want, rtol=1e-9, atol=1e-9)
    # the same formats, dtypes and shapes again, new values and patterns: the cached-call path
    ops = [redrawn(x, seed) for seed, x in enumerate(ops)]
    got = scorch.einsum(eq, *ops)
    torch.testing.assert_close(dense(got), torch.einsum(eq, *[dense(x) for x in ops]), rtol=1e-9, atol=1e-9)


def redrawn(x, seed):
    """An operand like ``x`` (format, dtype, shape) with other values, about half of them zero."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(x.shape, generator=g, dtype=x.dtype) * (torch.rand(x.shape, generator=g) < 0.5)
    return scorch.as_sparse(values, x.format) if isinstance(x, scorch.SparseTensor) else values


NAMED = [
    ("SpMV", "ij,j->i", [(7, 9), (9,)]),
    ("SpMM", "ij,jk->ik", [(7, 9), (9, 5)]),
    ("SDDMM", "ij,ik,jk->ij", [(7, 9), (7, 4), (9, 4)]),
    ("SpGEMM", "ij,jk->ik", [(7, 9), (9, 6)]),
    ("MTTKRP", "ijk,jr,kr->ir", [(4, 5, 6), (5, 3), (6, 3)]),
    ("TTV", "ijk,k->ij", [(4, 5, 6), (6,)]),
    ("TTM", "ijk,kl->ijl", [(4, 5, 6), (6, 3)]),
    ("batched", "bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("add", "ij,ij->ij", [(6, 7), (6, 7)]),
    ("MoE gating", "bnd,bn->bd", [(8, 4, 5), (8, 4)]),
]


@pytest.mark.parametrize("name,eq,shapes", NAMED, ids=[n[0] for n in NAMED])
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "dcsr", "csf", "ell"])
def test_named_kernels_over_formats(name, eq, shapes, fmt):
    g = torch.Generator().manual_seed(len(name))
    ops = []
    for k, s in enumerate(shapes):
        x = torch.randn(s, generator=g, dtype=torch.float64)
        sparse_here = k == 0 or name in ("SpGEMM", "add") or (name == "MoE gating" and k == 1)
        if name == "MoE gating" and k == 0:
            sparse_here = False
        if sparse_here:
            x = x * (torch.rand(s, generator=g) < 0.4)
            f = fmt if (len(s) >= 2 or fmt not in ("csc", "dcsc")) else "csr"
            x = scorch.as_sparse(x, f)
        ops.append(x)
    want = torch.einsum(eq, *[dense(x) for x in ops])
    plan = scorch.explain(eq, *ops)
    assert plan.backend == "generated C"
    got = scorch.einsum(eq, *ops)
    if name in ("SDDMM", "SpGEMM", "add"):
        assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(dense(got), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "dcsr", "csf", "ell", "bsr"])
def test_permutation_einsum_is_a_sparse_transpose(fmt):
    # "ij->ji" of a sparse operand: the operand's storage with its dims reordered (it was a scatter
    # into a dense result), values and gradients as torch's, format= still honoured
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64) * (torch.rand(4, 6, generator=g) < 0.4)
    A = scorch.as_sparse(x, scorch.formats.bsr(2, 2) if fmt == "bsr" else fmt).requires_grad_()
    out = torch.einsum("ij->ji", A)
    assert isinstance(out, scorch.SparseTensor) and out.format == A.format.permuted((1, 0))
    torch.testing.assert_close(out.to_dense(), x.t())
    w = torch.randn(6, 4, generator=g, dtype=torch.float64)
    (out * w).sum().backward()
    stored = torch.zeros(4, 6, dtype=torch.float64)
    stored[tuple(A.detach().indices())] = 1  # BSR stores its blocks' zeros too
    torch.testing.assert_close(A.grad.to_dense(), w.t() * stored)
    plan = scorch.explain("ij->ji", A)
    assert plan.backend == "permute (no kernel)" and "dims reordered" in plan.output_format
    assert isinstance(scorch.einsum("ij->ji", A, format="dense"), torch.Tensor)
    assert scorch.einsum("ij->ji", A.detach(), format="coo").format == scorch.formats.preset("coo", 2)
    B = scorch.as_sparse(torch.randn(2, 3, 4, dtype=torch.float64), "csf")
    torch.testing.assert_close(scorch.einsum("ijk->kij", B).to_dense(), B.to_dense().permute(2, 0, 1))
