"""``out=`` with SparseTensor operands, as torch writes it: the dense result copied into ``out``
(resized when its shape differs, silently when empty), ``out`` returned; the oracle is the same
call with ``out=`` on the dense operands."""

import warnings

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density) + 0.0


X, Y, V, B3 = rnd(4, 5), rnd(5, 3, density=1, seed=1), rnd(5, density=1, seed=2), rnd(2, 5, 3, density=1, seed=3)
CASES = {  # name: f(a, out=...) with a the 4 x 5 operand (sparse or its dense value)
    "matmul": lambda a, **o: torch.matmul(a, Y, **o),
    "mm": lambda a, **o: torch.mm(a, Y, **o),
    "mv": lambda a, **o: torch.mv(a, V, **o),
    "bmm": lambda a, **o: torch.bmm(a.unsqueeze(0).expand(2, 4, 5) if not isinstance(a, scorch.SparseTensor)
                                    else torch.stack([a, a]), B3, **o),
    "addmm": lambda a, **o: torch.addmm(torch.ones(4, 3, dtype=torch.float64), a, Y, beta=0.5, alpha=2, **o),
    "addmv": lambda a, **o: torch.addmv(torch.ones(4, dtype=torch.float64), a, V, **o),
    "inner": lambda a, **o: torch.inner(a, rnd(2, 5, seed=4), **o),
    "tensordot": lambda a, **o: torch.tensordot(a, Y, dims=1, **o),
    "gather": lambda a, **o: torch.gather(a, 1, torch.tensor([[0, 4], [1, 1], [2, 0], [3, 3]]), **o),
    "take_along_dim": lambda a, **o: torch.take_along_dim(a, torch.tensor([[0], [4], [2], [1]]), 1, **o),
    "masked_select": lambda a, **o: torch.masked_select(a, torch.arange(5) % 2 == 0, **o),
    "index_add": lambda a, **o: torch.index_add(torch.ones(4, 5, dtype=torch.float64), 0, torch.tensor([1, 0, 3, 2]),
                                                a, **o),
    "diag": lambda a, **o: torch.diag(a, 1, **o),
    "nonzero": lambda a, **o: torch.nonzero(a, **o),
    "logsumexp": lambda a, **o: torch.logsumexp(a, 1, **o),
    "histc": lambda a, **o: torch.histc(a, 4, **o),
    "norm": lambda a, **o: torch.norm(a, 2, 1, **o),
    "vector_norm": lambda a, **o: torch.linalg.vector_norm(a, 1, dim=0, **o),
    "linalg.norm": lambda a, **o: torch.linalg.norm(a, **o),
}
TUPLE_CASES = {  # name: (f, dim)
    "topk": (lambda a, **o: torch.topk(a, 2, 1, **o), 1),
    "kthvalue": (lambda a, **o: torch.kthvalue(a, 2, 1, **o), 1),
    "median": (lambda a, **o: torch.median(a, 0, **o), 0),
    "nanmedian": (lambda a, **o: torch.nanmedian(a, 1, **o), 1),
}


def empty_like(t):
    return torch.empty(0, dtype=t.dtype)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_out_matches_torch(name, fmt):
    f = CASES[name]
    A = scorch.as_sparse(X, fmt)
    want = f(X)
    for out in (empty_like(want), torch.full(want.shape, 7.0, dtype=want.dtype)):   # resized / written over
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = f(A, out=out)
        assert got is out and type(got) is torch.Tensor
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    wrong = torch.zeros(7, dtype=want.dtype)
    with pytest.warns(UserWarning, match="resized"):
        got = f(A, out=wrong)
    assert got is wrong
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(TUPLE_CASES))
def test_tuple_out_matches_torch(name):
    f, d = TUPLE_CASES[name]
    A = scorch.as_sparse(X, "csr")
    want = f(X)
    outs = (torch.empty(0, dtype=want[0].dtype), torch.empty(0, dtype=torch.int64))
    got = f(A, out=outs)
    assert got[0] is outs[0] and got[1] is outs[1] and type(got) is type(want)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    idx = got[1] if got[1].dim() == X.dim() else got[1].unsqueeze(d)   # ties (the zeros): any of them
    torch.testing.assert_close(X.gather(d, idx).reshape(want[0].shape), want[0], rtol=0, atol=0)


def test_out_errors():
    A = scorch.as_sparse(X, "csr")
    with pytest.raises(ValueError, match="dtype"):
        torch.mm(A, Y, out=torch.empty(4, 3, dtype=torch.float32))
    out = torch.empty(4, 3, dtype=torch.float64)   # SpGEMM: a sparse result, written densely (as torch's)
    assert torch.mm(A, scorch.as_sparse(Y, "csr"), out=out) is out
    torch.testing.assert_close(out, X @ Y)
    with pytest.raises(NotImplementedError, match="SparseTensor"):
        torch.mm(A, Y, out=scorch.as_sparse(torch.zeros(4, 3, dtype=torch.float64), "csr"))
    with pytest.raises(TypeError, match="tuple"):   # (torch's argument parser says so first)
        torch.topk(A, 2, 1, out=torch.empty(0, dtype=torch.float64))
    y = Y.clone().requires_grad_()
    with pytest.raises(ValueError, match="automatic differentiation"):
        torch.mm(A, y, out=torch.empty(4, 3, dtype=torch.float64))
    with torch.no_grad():
        torch.testing.assert_close(torch.mm(A, y, out=torch.empty(0, dtype=torch.float64)), X @ Y)


ELEMENTWISE_OUT = {  # name: (f(a, b, out), the result's pattern is A's)
    "mul scalar": (lambda a, b, **o: torch.mul(a, 2, **o), True),
    "add same pattern": (lambda a, b, **o: torch.add(a, a, alpha=2, **o), True),
    "abs": (lambda a, b, **o: torch.abs(a, **o), True),
    "add scalar (dense)": (lambda a, b, **o: torch.add(a, 1, **o), False),
    "exp (dense)": (lambda a, b, **o: torch.exp(a, **o), False),
    "maximum of two patterns": (lambda a, b, **o: torch.maximum(a, b, **o), False),
    "sub of two patterns": (lambda a, b, **o: torch.sub(a, b, **o), False),
    "where (an untagged out= overload)": (lambda a, b, **o: torch.where(a > 0, a, b, **o), False),
    "clamp": (lambda a, b, **o: torch.clamp(a, -0.5, 0.5, **o), True),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE_OUT))
def test_elementwise_out(name):
    """Elementwise ops with out=: a dense out takes the (densified) result; a SparseTensor out
    takes a result in its own pattern in place, and any other as ``copy_`` takes it (its pattern
    becomes the result's nonzeros; the result went into a dense copy of it and was lost once)."""
    f, in_pattern = ELEMENTWISE_OUT[name]
    A, B = scorch.as_sparse(X, "csr"), scorch.as_sparse(rnd(4, 5, seed=9), "coo")
    want = f(X, B.to_dense())
    out = torch.empty(0, dtype=X.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no dense fallback
        assert f(A, B, out=out) is out
    torch.testing.assert_close(out, want)
    C = A.clone()
    values = C._vals
    assert f(A, B, out=C) is C
    torch.testing.assert_close(C.to_dense(), want)
    assert (C._vals is values) == in_pattern   # in place in its pattern, new storage otherwise
