"""Integer values through the compiler: computed in float64 where every partial sum is below
2^53 (exact), cast back -- wrapping around for narrow types as torch's integer arithmetic does.
Oracle: the same ops on dense integer tensors with plain torch (torch.equal, not allclose)."""

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
FORMATS = ["csr", "coo", "csc", "dcsr", "ell", "bsr"]


def _fmt(name):
    return scorch.formats.bsr(2, 1) if name == "bsr" else name


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_integer_products_sums_and_elementwise_match_torch(dtype, fmt):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-6 if dtype != torch.uint8 else 0, 7, (6, 7), generator=g).to(dtype)
    x = x * (torch.rand(6, 7, generator=g) < 0.4).to(dtype)
    y = torch.randint(0, 9, (7, 4), generator=g).to(dtype)
    A, B = scorch.as_sparse(x, _fmt(fmt)), scorch.as_sparse(y, "csr")
    cases = [(A @ y, x @ y), (A @ y[:, 0], x @ y[:, 0]), ((A @ B).to_dense(), x @ y),
             ((A + A).to_dense(), x + x), ((A * A).to_dense(), x * x), (A.sum(1), x.sum(1)),
             (A.prod(1), x.prod(1)), (A.prod(), x.prod()), ((A != 0).prod(0), (x != 0).prod(0)),
             (A.prod(1, dtype=torch.float64), x.prod(1, dtype=torch.float64)),
             (scorch.einsum("ij,ij->", A, x), torch.einsum("ij,ij->", x, x))]
    for got, want in cases:
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_narrow_integers_wrap_around_like_torch():
    x = torch.full((3, 4), 100, dtype=torch.int8)
    y = torch.full((4, 2), 3, dtype=torch.int8)
    A = scorch.as_sparse(x, "csr")
    assert torch.equal(A @ y, x @ y)  # 1200 wraps to -80 in int8, as torch's own
    u = torch.full((2, 3), 200, dtype=torch.uint8)
    assert torch.equal((scorch.as_sparse(u, "coo") * scorch.as_sparse(u, "csr")).to_dense(), u * u)


def test_integer_sums_past_2_to_the_53_are_refused():
    A = scorch.as_sparse(torch.tensor([[2 ** 40, 0], [0, 3]]), "csr")
    with pytest.raises(scorch.errors.NotSupportedError, match="2\\^53"):
        A @ torch.tensor([[2 ** 20], [1]])
    assert torch.equal(A @ torch.tensor([[2 ** 11], [1]]), torch.tensor([[2 ** 51], [3]]))  # just below
    # (complex computes, as real einsums of the parts: test_reduce)


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_bool_einsum_follows_torch(fmt):
    """Bool operands: products are ands (bool results), a sum over one operand's own index counts
    (int64), as torch's einsum; a sum over an index several bool operands share (a matrix product of
    bools, which torch refuses too) is refused with a clear error."""
    g = torch.Generator().manual_seed(0)
    a, b, c = torch.rand(3, 4, generator=g) > 0.5, torch.rand(3, 4, generator=g) > 0.5, torch.rand(4, generator=g) > 0.5
    for eq, ops in [("ij,j->ij", (a, c)), ("ij->", (a,)), ("ij->i", (a,)), ("ij->ji", (a,)),
                    ("ij,kj->ikj", (a, b)), ("ij,ij->ij", (a, b))]:
        want = torch.einsum(eq, *ops)
        got = scorch.einsum(eq, scorch.as_sparse(ops[0], fmt), *ops[1:])
        got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
        assert got.dtype == want.dtype and torch.equal(got, want), eq
    for eq, ops in [("ij,ij->i", (a, b)), ("ij,j->i", (a, c))]:
        with pytest.raises(NotImplementedError):
            torch.einsum(eq, *ops)
        with pytest.raises(NotImplementedError, match="matrix product of bools"):
            scorch.einsum(eq, scorch.as_sparse(ops[0], fmt), *ops[1:])
