"""SpMM through dense row blocks (:mod:`scorch.compiler.blocks`): blocks of rows whose columns
cluster (bands, blocks) go through a dense workspace, the others row by row.  Oracles: the
same products on dense tensors in float64."""

import pytest
import torch

import scorch
from scorch.compiler import build, driver

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def band(n, m, half, seed=0, dtype=torch.float32, empty=()):
    """An n x m matrix with |i - j| <= half stored (random values), rows in ``empty`` cleared."""
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(n)[:, None]
    j = torch.arange(m)[None, :]
    D = ((i - j).abs() <= half).to(dtype) * (torch.rand(n, m, generator=g, dtype=dtype) + 0.5)
    for r in empty:
        D[r] = 0
    return D


def scattered(n, m, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, m, generator=g) < 0.02).to(dtype) * torch.rand(n, m, generator=g, dtype=dtype)


def check(A, X, want, dtype):
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(scorch.einsum(A.ndim == 3 and "hij,hjk->hik" or "ij,jk->ik", A, X).double(),
                               want, atol=tol, rtol=tol)


def test_plan_says_so():
    A = scorch.as_sparse(band(40, 40, 3), "csr")
    plan = scorch.explain("ij,jk->ik", A, torch.randn(40, 64))
    assert any("dense workspace" in n for n in plan.notes)
    assert "blk_ws_" in plan.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("K", [16, 32, 64, 128])
@pytest.mark.parametrize("n,half", [(5, 2), (37, 4), (100, 20), (61, 0)])
def test_band_matches_dense(dtype, K, n, half):
    """Bands of every width (half=0: the diagonal), row counts that leave a tail of rows."""
    D = band(n, n + 3, half, seed=n + K, dtype=dtype)
    X = torch.randn(n + 3, K, dtype=dtype)
    check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), dtype)


@pytest.mark.parametrize("empty", [(0,), (3, 4, 5), tuple(range(6)), (10, 11, 17)])
def test_empty_rows_inside_blocks(empty):
    D = band(30, 30, 3, empty=empty)
    X = torch.randn(30, 64)
    check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), torch.float32)


def test_mixed_blocks_and_scattered_rows():
    """A band over the first rows, scattered columns below: both paths in one call."""
    D = torch.cat([band(24, 500, 2), scattered(40, 500, seed=3)])
    X = torch.randn(500, 64)
    check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), torch.float32)


def test_window_wider_than_the_workspace_runs_row_by_row():
    """Six full rows of 3000 columns: dense enough, but wider than the workspace (2048)."""
    D = torch.rand(6, 3000) + 0.1
    X = torch.randn(3000, 32)
    check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), torch.float32)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_batched_band_attention_shape(nthreads, monkeypatch):
    """The attention layer's product: (heads, L, L) with a window per head, times (heads, L, d)."""
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    D = torch.stack([band(50, 50, h + 1, seed=h) for h in range(3)])
    V = torch.randn(3, 50, 64)
    A = scorch.as_sparse(D, "csr")
    assert any("dense workspace" in n for n in scorch.explain("hij,hjk->hik", A, V).notes)
    check(A, V, D.double() @ V.double(), torch.float32)


@pytest.mark.parametrize("width", [16, 32])
def test_narrower_vectors(width, monkeypatch):
    def clear():
        driver._PLANS.clear(), driver._BOUND.clear()
    clear()
    monkeypatch.setattr(build, "vector_bytes", lambda: width)
    try:
        D = band(45, 45, 5)
        X = torch.randn(45, 64)
        check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), torch.float32)
    finally:
        clear()


def test_strided_dense_operand():
    D = band(33, 40, 4)
    X = torch.randn(40, 96)[:, 16:80]     # row stride 96
    check(scorch.as_sparse(D, "csr"), X, D.double() @ X.double(), torch.float32)


# ---------------------------------------------------------------- SDDMM (BlockDots)

def sddmm_oracle(D, Q, K):
    """A[.., i, j] * (Q[.., i, :] . K[.., j, :]) in A's pattern, as a dense float64 tensor."""
    return D.double() * (Q.double() @ K.double().transpose(-1, -2))


def check_sddmm(D, Q, K, dtype):
    eq = "hij,hik,hjk->hij" if D.dim() == 3 else "ij,ik,jk->ij"
    A = scorch.as_sparse(D, "csr")
    got = scorch.einsum(eq, A, Q, K)
    assert scorch.is_sparse(got) and got.nnz == A.nnz
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.to_dense().double(), sddmm_oracle(D, Q, K), atol=tol, rtol=tol)
    return scorch.explain(eq, A, Q, K)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("K", [16, 64])
@pytest.mark.parametrize("L,half", [(5, 2), (40, 3), (70, 12), (33, 0)])
def test_batched_band_sddmm(dtype, K, L, half):
    D = torch.stack([band(L, L, half, seed=h, dtype=dtype) for h in range(3)])
    Q, Kt = torch.randn(3, L, K, dtype=dtype), torch.randn(3, L, K, dtype=dtype)
    plan = check_sddmm(D, Q, Kt, dtype)
    assert any("SDDMM rows" in n for n in plan.notes)


def test_band_sddmm_float64_two_dims():
    """Float64 leaves the sixteen-across-rows form aside: the 2-d SDDMM gets the blocks."""
    D = band(50, 60, 5, dtype=torch.float64)
    Q, Kt = torch.randn(50, 24, dtype=torch.float64), torch.randn(60, 24, dtype=torch.float64)
    plan = check_sddmm(D, Q, Kt, torch.float64)
    assert any("SDDMM rows" in n for n in plan.notes)


@pytest.mark.parametrize("empty", [(0,), (3, 4, 5), tuple(range(6)), (10, 11, 17)])
def test_sddmm_empty_rows_inside_blocks(empty):
    D = torch.stack([band(30, 30, 3, empty=empty), band(30, 30, 2, seed=1)])
    check_sddmm(D, torch.randn(2, 30, 32), torch.randn(2, 30, 32), torch.float32)


def test_sddmm_mixed_and_wide():
    """A band over the first rows, scattered columns below; and six full 3000-column rows
    (wider than the workspace): the row-wise loop where blocks do not apply."""
    D = torch.cat([band(24, 500, 2), scattered(40, 500, seed=3)]).unsqueeze(0)
    check_sddmm(D, torch.randn(1, 64, 16), torch.randn(1, 500, 16), torch.float32)
    W = (torch.rand(6, 3000) + 0.1).unsqueeze(0)
    check_sddmm(W, torch.randn(1, 6, 16), torch.randn(1, 3000, 16), torch.float32)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
@pytest.mark.parametrize("width", [16, 32, 64])
def test_sddmm_threads_and_widths(nthreads, width, monkeypatch):
    def clear():
        driver._PLANS.clear(), driver._BOUND.clear()
    clear()
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    monkeypatch.setattr(build, "vector_bytes", lambda: width)
    try:
        D = torch.stack([band(45, 45, h + 2, seed=h) for h in range(4)])
        check_sddmm(D, torch.randn(4, 45, 64), torch.randn(4, 45, 64), torch.float32)
    finally:
        clear()


def test_kernels_that_skip_the_zero_fill_write_every_output(monkeypatch):
    """Outputs of kernels that write every element (SDDMM into a pattern, SpMM rows, SpMV, the
    dense products) are allocated without zeros: allocate them full of NaN instead, and every
    result must still match its oracle (a hole would show as NaN)."""
    empty = torch.empty

    def nan_empty(*size, **kw):
        out = empty(*size, **kw)
        return out.fill_(float("nan")) if out.dtype.is_floating_point else out
    monkeypatch.setattr(torch, "empty", nan_empty)
    driver._PLANS.clear(), driver._BOUND.clear(), driver._DENSE_BOUND.clear()
    try:
        g = torch.Generator().manual_seed(7)
        D = torch.cat([band(30, 40, 3), scattered(30, 40, seed=4)])
        for fmt in ("csr", "coo", "dcsr"):
            A = scorch.as_sparse(D, fmt)
            Q, Kt = torch.randn(60, 16, generator=g), torch.randn(40, 16, generator=g)
            got = scorch.einsum("ij,ik,jk->ij", A, Q, Kt).to_dense()
            torch.testing.assert_close(got.double(), sddmm_oracle(D, Q, Kt), atol=1e-4, rtol=1e-4)
            X = torch.randn(40, 64, generator=g)
            torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, X).double(), D.double() @ X.double(),
                                       atol=1e-4, rtol=1e-4)
            x = torch.randn(40, generator=g)
            torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).double(), D.double() @ x.double(),
                                       atol=1e-4, rtol=1e-4)
        B = torch.stack([band(30, 30, 2), band(30, 30, 4, seed=2)])
        Q3, K3 = torch.randn(2, 30, 32, generator=g), torch.randn(2, 30, 32, generator=g)
        got = scorch.einsum("hij,hik,hjk->hij", scorch.as_sparse(B, "csr"), Q3, K3).to_dense()
        torch.testing.assert_close(got.double(), sddmm_oracle(B, Q3, K3), atol=1e-4, rtol=1e-4)
        a, b = torch.randn(37, 20, generator=g), torch.randn(20, 64, generator=g)
        torch.testing.assert_close(driver.compiled("ij,jk->ik", (a, b)).double(), a.double() @ b.double(),
                                   atol=1e-4, rtol=1e-4)
    finally:
        driver._PLANS.clear(), driver._BOUND.clear(), driver._DENSE_BOUND.clear()


@pytest.mark.parametrize("block", [(2, 2), (1, 4), (3, 2)])
def test_sddmm_over_a_blocked_operand_keeps_its_blocks(block):
    # SDDMM / A * X with a BSR operand gave a dense n x n result (29 MB of zeros a call on Cora,
    # 380x a CSR operand's time); it is written into the operand's blocks, gradients as dense torch's
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=g, dtype=torch.float64) * (torch.rand(6, 8, generator=g) < 0.3)
    A = scorch.as_sparse(x, scorch.formats.bsr(*block)).requires_grad_()
    Q = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    K = torch.randn(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    out = scorch.einsum("ij,ik,jk->ij", A, Q, K)
    assert isinstance(out, scorch.SparseTensor) and out.format == A.format
    w = torch.randn(6, 8, generator=g, dtype=torch.float64)
    (out.to_dense() * w).sum().backward()
    xd, Qd, Kd = (t.detach().clone().requires_grad_() for t in (x, Q, K))
    (torch.einsum("ij,ik,jk->ij", xd, Qd, Kd) * w).sum().backward()
    stored = torch.zeros(6, 8, dtype=torch.float64)
    stored[tuple(A.detach().indices())] = 1  # a block's zeros are stored too
    torch.testing.assert_close(A.grad.to_dense(), xd.grad * stored)
    torch.testing.assert_close(Q.grad, Qd.grad)
    torch.testing.assert_close(K.grad, Kd.grad)
