"""torch functions that decompose into other ops (A.H, moveaxis, hstack, diff, linalg.matmul...)
and the reductions of :mod:`scorch.ops.statistics` on SparseTensors.

Oracle: the same call on the dense tensor with plain torch.  None may reach the dense fallback
(set to raise here); gradients are checked with gradcheck on the stored values.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import scorch
from scorch import SparseTensor

from strategies import make_dense
from test_shape_ops import SETTINGS, sparse_tensors


@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


def dense(y):
    return y.to_dense() if isinstance(y, SparseTensor) else y


X = make_dense((3, 4), 0.5, 1, torch.float64)
W = torch.arange(1.0, 9.0, dtype=torch.float64).view(4, 2)

COMPOSITES = {  # name: (function, sparse result?)
    "H": (lambda t: t.H, True), "mH": (lambda t: t.mH, True), "adjoint": (lambda t: t.adjoint(), True),
    "moveaxis": (lambda t: torch.moveaxis(t, 0, 1), True), "swapaxes": (lambda t: t.swapaxes(0, 1), True),
    "fliplr": (torch.fliplr, True), "flipud": (torch.flipud, True),
    "hstack": (lambda t: torch.hstack([t, t]), True), "vstack": (lambda t: torch.vstack([t, t]), True),
    "dstack": (lambda t: torch.dstack([t, t]), True), "column_stack": (lambda t: torch.column_stack([t, t]), True),
    "atleast_3d": (torch.atleast_3d, True), "view_as": (lambda t: t.view_as(X), True),
    "reshape_as": (lambda t: t.reshape_as(X.t()), True), "narrow": (lambda t: t.narrow(1, 1, 2), True),
    "diff": (lambda t: torch.diff(t, dim=1), True), "diff n=2 dim 0": (lambda t: torch.diff(t, n=2, dim=0), True),
    "linalg.matmul": (lambda t: torch.linalg.matmul(t, W), False),
    "cosine_similarity": (lambda t: torch.nn.functional.cosine_similarity(t, t + 0, dim=1), False),
}


@pytest.mark.parametrize("name", list(COMPOSITES))
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell"])
def test_composite_functions_run_sparse(name, fmt):
    f, sparse = COMPOSITES[name]
    out = f(scorch.as_sparse(X, fmt))
    assert isinstance(out, SparseTensor) == sparse
    torch.testing.assert_close(dense(out), f(X), rtol=1e-12, atol=0)


GRAD_CASES = ["H", "moveaxis", "fliplr", "hstack", "dstack", "narrow", "diff", "diff n=2 dim 0", "linalg.matmul"]


@pytest.mark.parametrize("name", GRAD_CASES)
def test_composite_functions_are_differentiable(name):
    """torch records the decomposed ops; their backward (slice_backward, select_backward, permute,
    cat, mm...) runs on sparse gradients too, and the leaf's gradient keeps its pattern."""
    f = COMPOSITES[name][0]
    A = scorch.as_sparse(X, "csr")
    v = A.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: dense(f(A.with_values(v))), (v,))
    L = A.detach().clone().requires_grad_()
    weights = torch.linspace(-1, 1, dense(f(X)).numel(), dtype=torch.float64).view(dense(f(X)).shape)
    (dense(f(L)) * weights).sum().backward()
    Xg = X.clone().requires_grad_()
    (f(Xg) * weights).sum().backward()
    assert isinstance(L.grad, SparseTensor) and L.grad.nnz == L.nnz
    torch.testing.assert_close(L.grad.to_dense(), Xg.grad * (X != 0))


# ================================================================ statistics


def _with_nan(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with some nonzeros replaced by NaN."""
    g = torch.Generator().manual_seed(seed)
    hit = (x != 0) & (torch.rand(x.shape, generator=g) < 0.3)
    return torch.where(hit, torch.full((), float("nan"), dtype=x.dtype), x)


@SETTINGS
@given(st.data())
def test_nan_reductions_match_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    if not x.dtype.is_floating_point:
        return
    x = _with_nan(x, data.draw(st.integers(0, 99)))
    A = scorch.as_sparse(x, A.format)
    dim = data.draw(st.sampled_from([None, 0, -1, tuple(range(x.dim()))]))
    keepdim = data.draw(st.booleans())
    if dim is None:
        torch.testing.assert_close(torch.nansum(A), torch.nansum(x), equal_nan=True)
        torch.testing.assert_close(torch.nanmean(A), torch.nanmean(x), equal_nan=True)
    else:
        torch.testing.assert_close(torch.nansum(A, dim, keepdim), torch.nansum(x, dim, keepdim), equal_nan=True)
        torch.testing.assert_close(torch.nanmean(A, dim, keepdim), torch.nanmean(x, dim, keepdim), equal_nan=True)


@SETTINGS
@given(st.data())
def test_logsumexp_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    dim = data.draw(st.sampled_from([0, -1, tuple(range(x.dim()))]))
    keepdim = data.draw(st.booleans())
    want = torch.logsumexp(x, dim, keepdim)
    got = torch.logsumexp(A, dim, keepdim)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True)


def test_logsumexp_extremes_match_dense():
    """Large values (the shift matters), -inf and +inf entries, all-absent fibres."""
    x = torch.tensor([[1000.0, 0, 999.0], [float("-inf"), 0, 0], [float("inf"), 0, 1], [0, 0, 0]],
                     dtype=torch.float64)
    for fmt in ("csr", "coo"):
        A = scorch.as_sparse(x, fmt)
        for dim in (0, 1):
            torch.testing.assert_close(torch.logsumexp(A, dim), torch.logsumexp(x, dim), equal_nan=True)
    full = torch.tensor([[float("-inf"), float("-inf")]], dtype=torch.float64)
    assert torch.equal(torch.logsumexp(scorch.as_sparse(full, "csr"), 1), torch.logsumexp(full, 1))


def test_statistics_match_dense_and_are_differentiable():
    A = scorch.as_sparse(X, "csr")
    for dim in (None, 0, 1):
        kw = {} if dim is None else {"dim": dim}
        for got, want in zip(torch.aminmax(A, **kw), torch.aminmax(X, **kw)):
            assert torch.equal(got, want)
        for f in (torch.var_mean, torch.std_mean):
            for got, want in zip(f(A, **kw), f(X, **kw)):
                torch.testing.assert_close(got, want)
    B = scorch.as_sparse(make_dense((3, 4), 0.5, 7, torch.float64), "csr")
    for p in (1, 2, 3, float("inf")):
        torch.testing.assert_close(torch.dist(A, B, p), torch.dist(X, B.to_dense(), p))
    v = A.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: torch.logsumexp(A.with_values(v), 1), (v,))
    assert torch.autograd.gradcheck(lambda v: torch.nanmean(A.with_values(v), 0), (v,))
    assert torch.autograd.gradcheck(lambda v: torch.dist(A.with_values(v), B), (v,))


# ================================================================ value statistics


@SETTINGS
@given(st.data())
def test_unique_histc_bincount_match_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    for kw in ({}, {"return_counts": True}):
        got, want = torch.unique(A, **kw), torch.unique(x, **kw)
        for g, w in zip(got if kw else (got,), want if kw else (want,)):
            assert g.dtype == w.dtype and torch.equal(g, w)
    if x.dtype.is_floating_point:
        bins = data.draw(st.integers(1, 6))
        lo, hi = data.draw(st.sampled_from([(0, 0), (-1, 1), (0.5, 2.0), (3, 3)]))
        assert torch.equal(torch.histc(A, bins, lo, hi), torch.histc(x, bins, lo, hi))
    else:
        v = x.reshape(-1).abs().long()
        B = scorch.as_sparse(v, "coo")
        w = torch.linspace(0, 1, v.numel(), dtype=torch.float64)
        for kw in ({}, {"minlength": 5}, {"weights": w}):
            got, want = torch.bincount(B, **kw), torch.bincount(v, **kw)
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want)


# ================================================================ diag / diag_embed / block_diag / rot90


def test_matrix_ops_match_dense():
    v = torch.tensor([1.5, 0, -2], dtype=torch.float64)
    T = make_dense((2, 3, 4), 0.5, 3, torch.float64)
    for fmt in ("coo", "csr"):
        A, V, B = scorch.as_sparse(X, fmt), scorch.as_sparse(v, "coo"), scorch.as_sparse(T, "coo")
        for k in (-2, 0, 1):
            torch.testing.assert_close(dense(torch.diag(V, k)), torch.diag(v, k), rtol=0, atol=0)
            torch.testing.assert_close(dense(A.diag(k)), X.diag(k), rtol=0, atol=0)
        for args in ((0, -2, -1), (1, 0, 2), (-1, 2, 0)):
            out = torch.diag_embed(B, *args)
            assert isinstance(out, SparseTensor)
            torch.testing.assert_close(out.to_dense(), torch.diag_embed(T, *args), rtol=0, atol=0)
        parts = (A, torch.tensor([[5.0, 0]], dtype=torch.float64), V, torch.tensor(7.0, dtype=torch.float64))
        want = torch.block_diag(X, parts[1], v, parts[3])
        torch.testing.assert_close(torch.block_diag(*parts).to_dense(), want, rtol=0, atol=0)
        for k in (-1, 0, 1, 2, 3, 5):
            torch.testing.assert_close(dense(torch.rot90(A, k, (1, 0))), torch.rot90(X, k, (1, 0)), rtol=0, atol=0)
            torch.testing.assert_close(dense(torch.rot90(B, k, (2, 0))), torch.rot90(T, k, (2, 0)), rtol=0, atol=0)


def test_matrix_ops_are_differentiable():
    A = scorch.as_sparse(X, "csr")
    v = A.values().clone().requires_grad_()
    y = torch.arange(2.0, dtype=torch.float64).requires_grad_()
    for f in (lambda B: torch.diag_embed(B, 1), lambda B: torch.rot90(B), lambda B: torch.block_diag(B, y, B)):
        assert torch.autograd.gradcheck(lambda v, y: dense(f(A.with_values(v))), (v, y))


def test_value_statistics_read_stored_entries_not_ell_padding():
    """ELL's padding slots hold whatever an in-place op left there (``add_(1)`` makes them 1); the
    value statistics counted them as stored values; oracle: the dense tensor."""
    A = scorch.as_sparse(X, "ell")
    A.add_(1)
    dense_A = A.to_dense()
    for got, want in zip(torch.unique(A, return_counts=True), torch.unique(dense_A, return_counts=True)):
        assert torch.equal(got, want)
    assert torch.equal(torch.histc(A, bins=5), torch.histc(dense_A, bins=5))


@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_diff_of_order_zero_is_a_differentiable_copy(fmt):
    """torch.diff(x, n=0) is a copy of x, in the graph (torch's copies with copy_, which scorch
    refuses from a source that requires grad: an error about a copy_ the caller never wrote)."""
    A = scorch.as_sparse(X, fmt).requires_grad_()
    Xg = X.clone().requires_grad_()
    got, want = torch.diff(A, n=0, dim=0), torch.diff(Xg, n=0, dim=0)
    assert isinstance(got, SparseTensor) and got.requires_grad
    torch.testing.assert_close(dense(got), want)
    weights = torch.linspace(-1, 1, X.numel(), dtype=torch.float64).view(X.shape)
    (ga,), (gd,) = torch.autograd.grad((dense(got) * weights).sum(), A), torch.autograd.grad((want * weights).sum(), Xg)
    torch.testing.assert_close(ga.to_dense(), gd * (X != 0))
    torch.testing.assert_close(dense(A.diff(n=0)), X.diff(n=0))
    with pytest.raises(RuntimeError, match="order must be non-negative"):   # torch's own check, as on dense
        torch.diff(A, n=-1)
