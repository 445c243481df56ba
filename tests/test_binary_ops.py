"""+ - * / with SparseTensors against the same op on dense tensors (result layout included),
and their gradients (gradcheck, float64)."""

import warnings

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (x * (torch.rand(*shape, generator=g) < density)) + 0.0  # + 0.0: no negative zeros


def dense(y):
    return y.to_dense() if isinstance(y, scorch.SparseTensor) else y


CASES = [  # (name, function, sparse result?)
    ("A+B", lambda A, B, x: A + B, True),
    ("A-B", lambda A, B, x: A - B, True),
    ("A*B", lambda A, B, x: A * B, True),
    ("A*x", lambda A, B, x: A * x, True),
    ("x*A", lambda A, B, x: x * A, True),
    ("A*row", lambda A, B, x: A * x[0], True),
    ("A/x", lambda A, B, x: A / (x.abs() + 1), True),
    ("A+x", lambda A, B, x: A + x, False),
    ("x-A", lambda A, B, x: x - A, False),
    ("A*2", lambda A, B, x: A * 2, True),
    ("2*A", lambda A, B, x: 2 * A, True),
    ("A/2", lambda A, B, x: A / 2, True),
    ("A-1", lambda A, B, x: A - 1, False),
    ("1-A", lambda A, B, x: 1 - A, False),
    ("-A", lambda A, B, x: -A, True),
    ("add alpha", lambda A, B, x: torch.add(A, B, alpha=2), True),
    ("sub", lambda A, B, x: torch.sub(A, B), True),
    ("mul", lambda A, B, x: torch.mul(A, x), True),
    ("A+A", lambda A, B, x: A + A, True),
]


@pytest.mark.parametrize("name,f,sparse", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("coo", "dcsr"), ("csc", "ell")])
def test_against_dense(name, f, sparse, fa, fb):
    a, b, x = rnd(5, 6), rnd(5, 6, seed=1), rnd(5, 6, density=1, seed=2)
    A, B = scorch.as_sparse(a, fa), scorch.as_sparse(b, fb)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these is a fallback
        got = f(A, B, x)
    want = f(a, b, x)
    assert isinstance(got, scorch.SparseTensor) == sparse, type(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(dense(got), want)


def test_union_and_intersection_patterns():
    a, b = rnd(6, 7), rnd(6, 7, seed=1)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "csr")
    assert (A + B).nnz == int(((a != 0) | (b != 0)).sum())
    assert (A * B).nnz == int(((a != 0) & (b != 0)).sum())


def test_division_that_would_make_nans_is_dense():
    a, b = rnd(4, 5), rnd(4, 5, seed=1)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "csr")
    out = A / B  # 0/0 at entries absent in both: NaN, as in dense torch
    assert not isinstance(out, scorch.SparseTensor)
    torch.testing.assert_close(out, a / b, equal_nan=True)


@pytest.mark.parametrize("name,f", [("A+B", lambda A, B, x: A + B), ("A-B", lambda A, B, x: A - B),
                                    ("A*B", lambda A, B, x: A * B), ("A*x", lambda A, B, x: A * x),
                                    ("A+x", lambda A, B, x: A + x), ("x-A", lambda A, B, x: x - A),
                                    ("A/x", lambda A, B, x: A / (x * x + 1))])
def test_gradcheck(name, f):
    P, Q = scorch.as_sparse(rnd(4, 5), "csr"), scorch.as_sparse(rnd(4, 5, seed=1), "coo")
    v, w = P.values().clone().requires_grad_(), Q.values().clone().requires_grad_()
    x = rnd(4, 5, density=1, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, w, x: dense(f(P.with_values(v), Q.with_values(w), x)), (v, w, x))
