"""Elementwise ops over SparseTensors of one shape and different patterns (``maximum``, ``where``,
``atan2``, comparisons, ``logical_*``...): the same op on the dense tensors is the oracle; a
zero-preserving op gives a SparseTensor in the union of the patterns (where ``A + B`` stores),
any other a dense tensor; nothing takes the warned dense fallback."""

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import scorch
from scorch.compiler import build
from strategies import all_formats, make_dense, seeds

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

OPS = {  # name: (f, zero-preserving)
    "maximum": (torch.maximum, True),
    "minimum": (torch.minimum, True),
    "fmax": (torch.fmax, True),
    "fmin": (torch.fmin, True),
    "max(A, B)": (torch.max, True),
    "atan2": (torch.atan2, True),
    "hypot": (torch.hypot, True),
    "copysign": (torch.copysign, True),
    "where": (lambda a, b: torch.where(a > 0, a, b), True),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.25), True),
    "addcmul": (lambda a, b: torch.addcmul(a, a, b, value=0.5), True),
    "lt": (torch.lt, True),
    "gt": (lambda a, b: a > b, True),
    "ne": (torch.ne, True),
    "logical_and": (torch.logical_and, True),
    "logical_or": (torch.logical_or, True),
    "logical_xor": (torch.logical_xor, True),
    "xlogy": (lambda a, b: torch.xlogy(a, b.abs()), True),
    "eq": (torch.eq, False),
    "le": (torch.le, False),
    "pow": (lambda a, b: torch.pow(a.abs(), b), False),
    "remainder": (torch.remainder, False),
}


def pattern(x: scorch.SparseTensor) -> torch.Tensor:
    """Where ``x`` stores an entry (explicit zeros included), as a dense bool tensor."""
    return x._like(values=torch.ones(x._vals.shape), nnz=x._stored).to_dense() != 0


def check(name, A, B, exact_union=True):
    f, zero_preserving = OPS[name]
    a, b = A.to_dense(), B.to_dense()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no dense fallback
        got = f(A, B)
    want = f(a, b)
    assert isinstance(got, scorch.SparseTensor) == zero_preserving, (name, type(got))
    dense = got.to_dense() if zero_preserving else got
    assert dense.dtype == want.dtype and dense.shape == want.shape
    torch.testing.assert_close(dense, want, equal_nan=True, rtol=1e-12, atol=0)
    if zero_preserving:
        union = pattern(A) | pattern(B)
        # the union, and only it -- unless an operand is re-formatted to one with a dense level
        # under a sparse one (user formats), which stores whole fibres: explicit zeros, then
        assert torch.equal(pattern(got), union) if exact_union else bool((pattern(got) | union).eq(pattern(got)).all()), name


def operands(shape, fa, fb, seed, density=0.4, dtype=torch.float64):
    a = make_dense(shape, density, seed, dtype)
    b = make_dense(shape, density, seed + 1, dtype)
    return scorch.as_sparse(a, fa), scorch.as_sparse(b, fb)


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("coo", "dcsr"), ("csc", "ell"), ("dcsc", "csf")])
def test_against_dense(name, fa, fb):
    for seed in (0, 10, 20):  # the later calls take the cached union kernels
        check(name, *operands((5, 6), fa, fb, seed))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=st.sampled_from([(7,), (4, 6), (3, 4, 5), (2, 3, 2, 3), (0, 5), (4, 0)]),
       name=st.sampled_from(sorted(OPS)), seed=seeds, density=st.sampled_from([0.0, 0.3, 1.0]))
def test_any_formats(data, shape, name, seed, density):
    """Every preset and user-defined format on either side, empty and full operands."""
    fa = data.draw(st.sampled_from([f for f in all_formats(shape) if f != "dense"]), "fa")
    fb = data.draw(st.sampled_from([f for f in all_formats(shape) if f != "dense"]), "fb")
    check(name, *operands(shape, fa, fb, seed % 10_000, density), exact_union=isinstance(fa, str) and isinstance(fb, str))


def test_blocked_operand():
    A = scorch.as_sparse(make_dense((6, 6), 0.3, 1), scorch.formats.bsr(2, 2))   # stored zeros inside blocks
    B = scorch.as_sparse(make_dense((6, 6), 0.3, 2), "csr")
    for name in ("maximum", "where", "atan2", "eq"):
        check(name, A, B)


def test_nan_inf_and_promotion():
    a = make_dense((5, 6), 0.5, 3)
    a[0, 0], a[1, 1], a[2, 2] = float("nan"), float("inf"), -float("inf")
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(make_dense((5, 6), 0.5, 4, torch.float32), "coo")
    for name in ("maximum", "minimum", "fmax", "fmin", "atan2", "hypot", "lt", "copysign"):
        check(name, A, B)   # NaN propagates through maximum, fmax ignores it; float64 wins
    assert torch.maximum(A, B).dtype == torch.float64


def test_sparse_condition():
    a, b = make_dense((5, 6), 0.4, 5), make_dense((5, 6), 0.4, 6)
    c = make_dense((5, 6), 0.4, 7) > 0
    A, B, C = (scorch.as_sparse(t, f) for t, f in ((a, "csr"), (b, "dcsr"), (c, "coo")))
    got = torch.where(C, A, B)
    assert isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got.to_dense(), torch.where(c, a, b), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["maximum", "minimum", "atan2", "where", "hypot"])
def test_gradients(name):
    """Gradients against dense autograd's, each read at its operand's own pattern."""
    f = OPS[name][0]
    A, B = operands((5, 6), "csr", "coo", 30)
    a, b = A.to_dense().requires_grad_(), B.to_dense().requires_grad_()
    A.requires_grad_(), B.requires_grad_()
    w = torch.randn(5, 6, dtype=torch.float64)
    (f(A, B) * w).sum().backward()
    (f(a, b) * w).sum().backward()
    for X, x in ((A, a), (B, b)):
        assert isinstance(X.grad, scorch.SparseTensor)
        torch.testing.assert_close(X.grad.to_dense(), torch.where(pattern(X), x.grad, 0.0))  # (hypot: 0/0 off it)


def test_broadcast_sparse_operand_stays_a_fallback():
    """A sparse operand broadcast against another sparse one: dense by definition, warned."""
    A = scorch.as_sparse(make_dense((4, 5), 0.5, 8), "csr")
    B = scorch.as_sparse(make_dense((1, 5), 0.5, 9), "csr")
    with pytest.warns(UserWarning, match="no sparse implementation"):
        got = torch.maximum(A, B)
    torch.testing.assert_close(got, torch.maximum(A.to_dense(), B.to_dense()))


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_ops_with_a_small_dense_operand_keep_the_pattern(fmt):
    """prelu (scalar and per-channel weights), hardswish and a clamp by a per-column bound: zero
    wherever the sparse operand is, whatever the small dense operand holds -- sparse, same
    pattern, no fallback; an op that is not zero there (adding a per-column offset) is dense.
    Oracle: the ops on the dense tensor; prelu's gradients (through the warned fallback) too."""
    x = make_dense((6, 5), 0.4, seed=3)
    x4 = make_dense((2, 3, 4, 4), 0.4, seed=4)
    A, A4 = scorch.as_sparse(x, fmt), scorch.as_sparse(x4, "coo")
    w, wc, col = torch.tensor([0.25], dtype=x.dtype), torch.rand(3, dtype=x.dtype), torch.rand(5, dtype=x.dtype)
    saved, scorch.config.dense_fallback = scorch.config.dense_fallback, "raise"
    try:
        cases = [(torch.nn.functional.prelu(A, w), torch.nn.functional.prelu(x, w)),
                 (torch.nn.functional.prelu(A4, wc), torch.nn.functional.prelu(x4, wc)),
                 (torch.nn.functional.hardswish(A), torch.nn.functional.hardswish(x)),
                 (torch.clamp(A, min=-col, max=col), torch.clamp(x, min=-col, max=col))]
        offset = torch.ops.aten.add.Tensor(A, col)          # f(0, col) = col: dense by definition
    finally:
        scorch.config.dense_fallback = saved
    for got, want in cases:
        assert isinstance(got, scorch.SparseTensor)
        assert got.nnz == (A4 if got.dim() == 4 else A).nnz
        torch.testing.assert_close(got.to_dense(), want)
    assert not isinstance(offset, scorch.SparseTensor)
    torch.testing.assert_close(offset, x + col)
    P, xd = A4.detach().requires_grad_(), x4.clone().requires_grad_()
    wp, wd = wc.clone().requires_grad_(), wc.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # prelu's backward kernel runs on a dense copy (warned)
        (torch.nn.functional.prelu(P, wp) * 3).sum().backward()
    (torch.nn.functional.prelu(xd, wd) * 3).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), xd.grad * (x4 != 0))
    torch.testing.assert_close(wp.grad, wd.grad)
