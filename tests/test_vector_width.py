"""Kernels lowered for each vector width (16, 32, 64 bytes) agree with dense torch.

The driver sizes ``scorch_vec_*`` by the target's registers (``build.vector_bytes``); a GCC
vector of any width is valid C on any machine (wider ones are split), so every width is
exercised here whatever this machine has.  Oracles: the same product in float64 on dense
tensors.
"""

import pytest
import torch

import scorch
from scorch.compiler import build, codegen, driver, segments


@pytest.fixture(params=[16, 32, 64])
def width(request, monkeypatch):
    def clear():
        driver._PLANS.clear(), driver._BOUND.clear(), codegen._LOADED.clear()
    clear()
    monkeypatch.setattr(build, "vector_bytes", lambda: request.param)
    yield request.param
    clear()


def graph(n=70, m=90, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 12, (n,), generator=g)
    lengths[3], lengths[5] = 0, 40  # an empty row, a long one
    rows = torch.repeat_interleave(torch.arange(n), lengths)
    cols = torch.randint(0, m, (rows.numel(),), generator=g)
    D = torch.zeros(n, m, dtype=dtype)
    D[rows, cols] = torch.rand(rows.numel(), generator=g, dtype=dtype) + 0.5
    return D


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("K", [4, 8, 16, 24, 64, 128, 256])
def test_spmm(width, dtype, K):
    D = graph(dtype=dtype)
    X = torch.randn(D.shape[1], K, dtype=dtype)
    A = scorch.as_sparse(D, "csr")
    plan = scorch.explain("ij,jk->ik", A, X)
    assert f"#define SCORCH_VB {width}" in plan.source
    got = scorch.einsum("ij,jk->ik", A, X)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.double(), D.double() @ X.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("K", [8, 16, 32, 64, 256])
def test_sddmm(width, dtype, K):
    """The row-wise SDDMM reduces four entries at once through ``scorch_hsum4`` (generated per
    width); a sum per entry checks every lane lands in its own entry."""
    D = graph(dtype=dtype, m=70)
    Q, Kt = torch.randn(70, K, dtype=dtype), torch.randn(70, K, dtype=dtype)
    got = scorch.einsum("ij,ik,jk->ij", scorch.as_sparse(D, "csr"), Q, Kt)
    want = D.double() * (Q.double() @ Kt.double().t())
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.to_dense().double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_sums_and_spmv(width, dtype):
    D = graph(dtype=dtype)
    A = scorch.as_sparse(D, "csr")
    x = torch.randn(D.shape[1], dtype=dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).double(), D.double() @ x.double(), atol=tol, rtol=tol)
    torch.testing.assert_close(scorch.einsum("ij->i", A).double(), D.double().sum(1), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_rows(width, dtype):
    """Rows longer and shorter than a vector: the vector exp blocks and the scalar rest."""
    D = graph(dtype=dtype)
    pos = torch.zeros(D.shape[0] + 1, dtype=torch.int64)
    pos[1:] = torch.cumsum((D != 0).sum(1), 0)
    vals = D[D != 0] * 3 - 2
    got = segments.softmax(pos, vals)
    for r in range(D.shape[0]):
        seg = vals[pos[r]:pos[r + 1]].double()
        if seg.numel():
            torch.testing.assert_close(got[pos[r]:pos[r + 1]].double(), torch.softmax(seg, 0), atol=1e-6, rtol=1e-5)


def test_prelude_helpers_per_width():
    """Each width's prelude declares vectors of that width and a shuffle tree over its lanes."""
    for vb in (16, 32, 64):
        text = codegen.prelude(vb)
        assert f"#define SCORCH_VB {vb}" in text
        for vt in ("float", "double"):
            assert f"scorch_hsum4_{vt}(" in text and f"scorch_hsum_{vt}(" in text
    # 64-byte float lanes: the shuffle tree's last step pairs neighbouring lanes
    assert "SCORCH_SHUF(f0, f0, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6)" in codegen.prelude(64)


def test_vector_bytes_follows_flags(monkeypatch):
    import platform
    if not build.have_compiler() or platform.machine() != "x86_64":
        pytest.skip("needs a C compiler for x86-64")
    assert build.vector_bytes() in (16, 32, 64)
    monkeypatch.setenv("SCORCH_CFLAGS", "-mno-avx")
    assert build.vector_bytes() == 16
    monkeypatch.setenv("SCORCH_CFLAGS", "-mavx2")
    assert build.vector_bytes() in (32, 64)
    monkeypatch.setenv("SCORCH_CC", "/nonexistent/cc")
    assert build.vector_bytes() == 64  # no compiler: no kernel is built, any width will do


def test_lower_rejects_other_widths():
    from scorch.compiler.lower import lower
    from scorch.compiler.notation import parse
    from scorch.compiler.schedule import Operand, make_schedule
    from scorch.format import preset
    ein = parse("ij,jk->ik", [(4, 4), (4, 8)])
    sched = make_schedule(ein, (Operand("ij", preset("csr", 2), "int32_t"), Operand("jk", None)), "auto")
    with pytest.raises(ValueError, match="vector_bytes must be 16, 32 or 64, got 48"):
        lower(sched, "float", vector_bytes=48)
