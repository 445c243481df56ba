"""Edge cases of the reductions against plain torch on the dense tensor (the oracle): complex
values (logsumexp, var / std, norms), ties of an extreme with the absent zeros and NaNs in its
gradient, weighted bincount's bin 0, torch's positional forms and its errors."""

import warnings

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

NAN, INF = float("nan"), float("inf")
Z = [[1 + 2j, 0, 3 - 1j], [0, 0, 0], [-2 + 0.5j, 1j, 0.25 - 3j]]


def leaf(x, fmt):
    """A SparseTensor of ``x`` whose values require grad, and the dense leaf ``x``."""
    A = scorch.as_sparse(x, fmt).requires_grad_()
    return A, x.clone().requires_grad_()


def stored_mask(A):
    """1 at the positions ``A`` stores (a BSR block's explicit zeros included), else 0."""
    A = A.detach()
    return A.with_values(torch.ones_like(A.values())).to_dense().real


def assert_same_grad(A, d, got, want, upstream=None):
    """The sparse gradient equals torch's dense one at the stored positions."""
    up = torch.ones_like(want) if upstream is None else upstream
    (ga,), (gd,) = torch.autograd.grad((got * up).sum().real, A), torch.autograd.grad((want * up).sum().real, d)
    torch.testing.assert_close(ga.to_dense(), torch.where(stored_mask(A) != 0, gd, 0), equal_nan=True)


# ------------------------------------------------------------------ complex values

@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell"])
@pytest.mark.parametrize("dim", [0, 1, (0, 1)])
def test_logsumexp_of_complex_stays_complex_and_differentiates(fmt, dim):
    z = torch.tensor(Z, dtype=torch.complex128)
    A, d = leaf(z, fmt)
    got, want = torch.logsumexp(A, dim), torch.logsumexp(d, dim)
    assert got.dtype == want.dtype == torch.complex128
    torch.testing.assert_close(got, want)
    assert_same_grad(A, d, got, want, upstream=torch.full_like(want, 0.5 - 2j))


def test_logsumexp_of_complex64_keeps_its_dtype():
    z = torch.tensor([[1 + 2j, 0, 3 - 1j], [0, 0, 0]], dtype=torch.complex64)
    got, want = torch.logsumexp(scorch.as_sparse(z, "coo"), 1), torch.logsumexp(z, 1)
    assert got.dtype == want.dtype == torch.complex64
    torch.testing.assert_close(got, want)


SPREADS = {
    "var": lambda t: t.var(), "var 1": lambda t: torch.var(t, 1), "var 0 keepdim": lambda t: t.var(0, keepdim=True),
    "var correction=0": lambda t: t.var(1, correction=0), "std": lambda t: t.std(), "std 0": lambda t: torch.std(t, 0),
    "var_mean": lambda t: torch.var_mean(t, 1)[0], "var_mean mean": lambda t: torch.var_mean(t, 1)[1],
    "std_mean": lambda t: torch.std_mean(t, 0, unbiased=False)[0],
}


@pytest.mark.parametrize("name", list(SPREADS))
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_var_std_of_complex_are_real_as_torch(name, dtype, fmt):
    z = torch.tensor(Z, dtype=dtype)
    A, d = leaf(z, fmt)
    got, want = SPREADS[name](A), SPREADS[name](d)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)
    assert_same_grad(A, d, got, want)


# ------------------------------------------------------------------ torch's positional forms

@pytest.mark.parametrize("call", [lambda t: torch.var_mean(t, 0, True), lambda t: torch.std_mean(t, False),
                                  lambda t: torch.var_mean(t, 1, False, True), lambda t: torch.std_mean(t, 0, True),
                                  lambda t: torch.var_mean(t, True), lambda t: torch.std_mean(t, (0, 1), False)],
                         ids=["var_mean dim unbiased", "std_mean unbiased", "var_mean dim unbiased keepdim",
                              "std_mean dim unbiased", "var_mean unbiased", "std_mean dims unbiased"])
def test_var_mean_std_mean_take_torchs_positional_forms(call):
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    got, want = call(scorch.as_sparse(x, "csr")), call(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w)


# ------------------------------------------------------------------ norms

NORMS = {
    "vector_norm": lambda t: torch.linalg.vector_norm(t),
    "vector_norm 1 dim": lambda t: torch.linalg.vector_norm(t, 1, 1),
    "vector_norm complex128": lambda t: torch.linalg.vector_norm(t, dtype=torch.complex128),
    "norm": lambda t: torch.norm(t), "linalg.norm": lambda t: torch.linalg.norm(t),
    "dist": lambda t: torch.dist(t, t), "vector_norm inf": lambda t: torch.linalg.vector_norm(t, INF),
}


@pytest.mark.parametrize("name", list(NORMS))
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_norms_of_a_complex_tensor_with_nothing_stored_are_real(name, fmt):
    z = torch.zeros(2, 3, dtype=torch.complex64)
    A = scorch.as_sparse(z, fmt)
    assert A.nnz == 0
    got, want = NORMS[name](A), NORMS[name](z)
    assert got.dtype == want.dtype and not got.dtype.is_complex
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dim", [None, 1, 0])
@pytest.mark.parametrize("fmt", ["coo", "csr", "bsr"])
def test_inf_norm_with_a_stored_nan_is_nan_with_torchs_gradient(dim, fmt):
    """torch's inf-norm gradient goes to a fibre's NaNs (NaN there, 0 at the others); a scatter's
    gave every entry 0."""
    x = torch.tensor([[NAN, 1., 0., 0.], [0., 0., -3., 0.], [2., -4., 0., 0.], [0., 0., 0., 0.]], dtype=torch.float64)
    A, d = leaf(x, scorch.formats.bsr(2, 2) if fmt == "bsr" else fmt)
    got, want = torch.linalg.vector_norm(A, INF, dim), torch.linalg.vector_norm(d, INF, dim)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert_same_grad(A, d, got, want)


# ------------------------------------------------------------------ extremes: ties and NaNs

TIES = torch.tensor([[0., 0., 0., -1.], [0., -2., 0., 0.], [-1., -2., -3., -4.], [5., 0., 5., 0.]], dtype=torch.float64)
# the stored positions: zeros among them, tied with absent ones
STORE = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)

EXTREMES = {
    "amax()": lambda t: t.amax(), "amax 1": lambda t: t.amax(1), "amax 0 keepdim": lambda t: t.amax(0, keepdim=True),
    "amin of -x 1": lambda t: (-t).amin(1), "amax (0, 1)": lambda t: t.amax((0, 1)), "max()": lambda t: t.max(),
    "min() of -x": lambda t: (-t).min(), "aminmax max": lambda t: torch.aminmax(t).max,
    "aminmax 1": lambda t: sum(torch.aminmax(t, dim=1)), "aminmax min of -x 0": lambda t: torch.aminmax(-t, dim=0).min,
}


def _explicit(fmt):
    """TIES storing the positions of STORE, zeros among them (a stored 0 tied with absent ones)."""
    A = scorch.from_coo(STORE.nonzero().t(), TIES[STORE], tuple(TIES.shape), format=fmt)
    assert A.nnz == int(STORE.sum())
    return A


@pytest.mark.parametrize("name", list(EXTREMES))
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_extreme_gradient_at_a_stored_zero_counts_the_absent_ties(name, fmt):
    """torch spreads the gradient evenly over every element equal to the extreme, the absent zeros
    included: a stored 0 tied with two absent ones gets 1/3 (it got 1/2)."""
    A = _explicit(fmt).requires_grad_()
    d = TIES.clone().requires_grad_()
    got, want = EXTREMES[name](A), EXTREMES[name](d)
    torch.testing.assert_close(got, want)
    up = torch.arange(1.0, want.numel() + 1, dtype=want.dtype).reshape(want.shape)
    assert_same_grad(A, d, got, want, upstream=up)


@pytest.mark.parametrize("name", ["amax()", "amax 1", "amax 0 keepdim", "max()", "aminmax 1"])
def test_extreme_gradient_over_a_bsr_blocks_explicit_zeros(name):
    x = torch.tensor([[0., -1., 0., 0.], [-2., 0., 0., 0.], [0., 0., -3., -1.], [0., 0., -2., -5.]],
                     dtype=torch.float64)
    A, d = leaf(x, scorch.formats.bsr(2, 2))
    assert A.nnz == 8   # blocks (0, 0) and (1, 1): two explicit zeros in the first
    got, want = EXTREMES[name](A), EXTREMES[name](d)
    torch.testing.assert_close(got, want)
    up = torch.arange(1.0, want.numel() + 1, dtype=want.dtype).reshape(want.shape)
    assert_same_grad(A, d, got, want, upstream=up)


NANS = {
    "max()": lambda t: t.max(), "min()": lambda t: t.min(), "amax 1": lambda t: t.amax(1), "amax()": lambda t: t.amax(),
    "amin 0": lambda t: t.amin(0), "aminmax": lambda t: sum(torch.aminmax(t)),
}


@pytest.mark.parametrize("name", list(NANS))
@pytest.mark.parametrize("x", [[[NAN, 1., 0.], [0., 2., 0.]], [[NAN, 1., NAN], [0., 2., 0.]],
                               [[INF, 1., 0.], [0., -INF, 0.]]],
                         ids=["one nan", "two nans", "infinities"])
def test_extreme_gradient_with_nans_and_infinities_is_torchs(name, x):
    """max() / min() give a NaN result's gradient to the NaNs (shared), as torch's; amax / amin /
    aminmax make the fibre's gradient NaN, as torch's; a non-finite value outside the ties does
    not leak into the result or the gradient."""
    x = torch.tensor(x, dtype=torch.float64)
    A, d = leaf(x, "csr")
    got, want = NANS[name](A), NANS[name](d)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert_same_grad(A, d, got, want)


def test_extreme_gradcheck_and_double_backward():
    x = torch.tensor([[0., 0.5, 0., -1.], [2., -2., 2., 0.]], dtype=torch.float64)
    P = scorch.as_sparse(x, "csr")
    v = P.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: P.with_values(v).amax(1), (v,))
    assert torch.autograd.gradgradcheck(lambda v: P.with_values(v).amin(0), (v,))


# ------------------------------------------------------------------ bincount, prod, errors

def test_weighted_bincount_sums_the_absent_weights_themselves():
    """Bin 0 was ``weights.sum() - stored.sum()``: 1e8 stored beside an absent 1 cancelled to 0."""
    x, w = torch.tensor([1, 0, 2]), torch.tensor([1e8, 1.0, 3.0])
    got, want = torch.bincount(scorch.as_sparse(x, "coo"), w), torch.bincount(x, w)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 4, (50,), generator=g) * (torch.rand(50, generator=g) < 0.3)
    w = torch.randn(50, generator=g, dtype=torch.float64) * 1e6
    torch.testing.assert_close(torch.bincount(scorch.as_sparse(x, "coo"), w, minlength=6),
                               torch.bincount(x, w, minlength=6))


def test_bincount_refuses_a_negative_minlength():
    with pytest.raises(ValueError, match="minlength must be >= 0.*got -1"):
        torch.bincount(scorch.as_sparse(torch.tensor([0, 2, 0, 1]), "coo"), minlength=-1)
    with pytest.raises(RuntimeError, match="minlength"):   # (the oracle: torch's refuses it too)
        torch.bincount(torch.tensor([0, 2, 0, 1]), minlength=-1)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_prod_into_bool_stays_bool(dim):
    b = torch.tensor([[True, False, True], [True, True, True]])
    B = scorch.as_sparse(b, "csr")
    got = B.prod(dtype=torch.bool) if dim is None else B.prod(dim, dtype=torch.bool)
    want = b.prod(dtype=torch.bool) if dim is None else b.prod(dim, dtype=torch.bool)
    assert got.dtype == want.dtype == torch.bool and torch.equal(got, want)


@pytest.mark.parametrize("call", [lambda t: t.amax(1), lambda t: t.amin(), lambda t: t.max(), lambda t: t.min(0),
                                  lambda t: torch.aminmax(t), lambda t: t.argmax()],
                         ids=["amax", "amin", "max", "min dim", "aminmax", "argmax"])
def test_extremes_of_complex_are_refused_clearly(call):
    z = torch.tensor([[1 + 1j, 0]])
    with pytest.raises((RuntimeError, NotImplementedError)):   # the oracle refuses them too
        call(z)
    with pytest.raises(TypeError, match="not implemented for complex.*complex64"):
        call(scorch.as_sparse(z, "coo"))


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax_of_integers_is_refused_clearly(fn):
    i = torch.tensor([[1, 0, 2]])
    with pytest.raises((RuntimeError, NotImplementedError)):
        fn(i, 1)
    with pytest.raises(TypeError, match="softmax: not implemented for torch.int64.*dtype="):
        fn(scorch.as_sparse(i, "coo"), 1)
    torch.testing.assert_close(fn(scorch.as_sparse(i, "coo"), 1, dtype=torch.float32).values(),
                               fn(torch.tensor([[1., 2.]]), 1).reshape(-1))   # dtype= still works


EMPTY_DIM = {
    "max": lambda t: t.max(1), "min": lambda t: torch.min(t, 1), "argmax": lambda t: t.argmax(1),
    "argmin": lambda t: t.argmin(1), "amax": lambda t: t.amax(1), "amin": lambda t: t.amin(-1),
    "aminmax": lambda t: torch.aminmax(t, dim=1), "kthvalue": lambda t: t.kthvalue(1, 1),
    "median": lambda t: t.median(1), "nanmedian": lambda t: t.nanmedian(1),
}


@pytest.mark.parametrize("name", list(EMPTY_DIM))
def test_reducing_a_zero_size_dim_raises_index_error(name):
    e = torch.zeros(4, 0)
    with pytest.raises(IndexError):   # the oracle
        EMPTY_DIM[name](e)
    with pytest.raises(scorch.errors.ScorchIndexError, match="zero-size dim 1"):
        EMPTY_DIM[name](scorch.as_sparse(e, "csr"))


def test_argmax_of_no_elements_raises_index_error():
    e = torch.zeros(4, 0)
    with pytest.raises(IndexError):
        e.argmax()
    with pytest.raises(scorch.errors.ScorchIndexError, match="argmax: the tensor has no elements"):
        scorch.as_sparse(e, "csr").argmax()


def test_extremes_keep_infinite_values_outside_the_ties_out_of_the_result():
    """The gradient path leaves the values alone: an infinite value outside the ties stays out."""
    x = torch.tensor([[INF, 1., 0.], [0., -INF, 0.]])
    A = scorch.as_sparse(x, "csr").requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert A.amin(1).tolist() == x.amin(1).tolist() and A.amax().item() == INF


# ------------------------------------------------------------------ nothing stored: still in the graph

NOTHING_STORED = {
    "linalg.norm": lambda t: torch.linalg.norm(t), "norm": lambda t: t.norm(), "norm p=3": lambda t: t.norm(p=3),
    "norm keepdim": lambda t: torch.norm(t, dim=None, keepdim=True),
    "vector_norm 1": lambda t: torch.linalg.vector_norm(t, 1),
    "vector_norm inf": lambda t: torch.linalg.vector_norm(t, INF),
    "vector_norm 2": lambda t: torch.linalg.vector_norm(t),
    "vector_norm 0.5": lambda t: torch.linalg.vector_norm(t, 0.5),
    "matrix_norm": lambda t: torch.linalg.matrix_norm(t), "matrix_norm nuc": lambda t: torch.linalg.matrix_norm(t, "nuc"),
    "kthvalue": lambda t: t.kthvalue(1, 1).values,
    "kthvalue dim 0": lambda t: torch.kthvalue(t, 2, 0, keepdim=True).values,
}


@pytest.mark.filterwarnings("ignore:scorch. _linalg_svd has no sparse implementation")
@pytest.mark.parametrize("name", list(NOTHING_STORED))
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_reductions_of_a_tensor_with_nothing_stored_stay_in_the_graph(name, fmt):
    """A norm / kthvalue of an all-zero leaf that requires grad requires grad, and its gradient is
    torch's at the (no) stored positions: zeros (a fresh zero for "nothing stored" left the graph:
    a backward raised)."""
    x = torch.zeros(3, 4, dtype=torch.float64)
    A, d = leaf(x, fmt)
    assert A.nnz == 0
    got, want = NOTHING_STORED[name](A), NOTHING_STORED[name](d)
    assert got.requires_grad and want.requires_grad
    torch.testing.assert_close(got, want)
    assert_same_grad(A, d, got, want)
