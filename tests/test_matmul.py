"""matmul / mm / bmm / @ with SparseTensor operands, against dense torch."""

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density)


def dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


@pytest.mark.parametrize("sa,sb,sparse_side", [
    ((5, 6), (6, 3), "a"), ((5, 6), (6,), "a"), ((6,), (6, 3), "b"), ((6,), (6,), "a"),
    ((2, 5, 6), (6, 3), "a"), ((2, 5, 6), (2, 6, 3), "a"), ((4, 5), (2, 5, 3), "a"),
    ((5, 6), (6, 3), "b"), ((2, 5, 6), (2, 6, 3), "b"), ((5, 6), (6, 3), "both"),
])
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_matmul_shapes(sa, sb, sparse_side, fmt):
    if fmt == "csc" and (len(sa) < 2 and sparse_side == "a" or len(sb) < 2 and sparse_side == "b"):
        pytest.skip("csc needs 2 dims")
    a, b = rnd(*sa), rnd(*sb, seed=1)
    A = scorch.as_sparse(a, fmt) if sparse_side in ("a", "both") else a
    B = scorch.as_sparse(b, fmt) if sparse_side in ("b", "both") else b
    want = a @ b
    for got in (A @ B, torch.matmul(A, B), scorch.matmul(A, B)):
        assert got.shape == want.shape
        torch.testing.assert_close(dense(got), want)


def test_mm_bmm_and_errors():
    a, b = rnd(5, 6), rnd(6, 3, seed=1)
    A = scorch.as_sparse(a, "csr")
    torch.testing.assert_close(torch.mm(A, b), a @ b)
    torch.testing.assert_close(A.mm(b), a @ b)
    a3, b3 = rnd(2, 5, 6), rnd(2, 6, 3, seed=1)
    torch.testing.assert_close(torch.bmm(scorch.as_sparse(a3, "csr"), b3), torch.bmm(a3, b3))
    with pytest.raises(ValueError, match="mm: expects 2-d"):
        torch.mm(A, rnd(6))
    with pytest.raises(ValueError, match="index 'j' has size 6"):
        A @ rnd(5, 2)
