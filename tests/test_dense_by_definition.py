"""torch functions scorch runs on dense copies of its sparse arguments before dispatch
(:mod:`scorch.ops.on_dense`): values and gradients against the same call on dense tensors.

* complex ``linalg.pinv`` / ``pinverse`` / ``lstsq``: under a ``__torch_dispatch__`` torch's
  kernels used their conjugate view unconjugated (pytorch#198118): wrong values, and a wrong
  lstsq gradient;
* ``householder_product`` / ``orgqr`` / ``ormqr``: torch's backward wrote (``tril_``) into the
  saved sparse input, and raised;
* ``F.gaussian_nll_loss``: its in-place clamp of a sparse ``var`` left the absent zeros 0: NaN.

Gradients: a SparseTensor leaf receives torch's dense gradient at its stored positions.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

L = torch.linalg


@pytest.fixture(autouse=True)
def silent_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "silent")


def masked(shape, dtype, seed=0, rank_deficient=False):
    """A float64 / complex128 tensor with about half its entries zero (plus a diagonal: invertible,
    unless ``rank_deficient`` repeats the first row at the end)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.where(torch.rand(shape, generator=g) < 0.5, torch.randn(shape, generator=g, dtype=dtype), 0)
    if len(shape) == 2 and shape[0] == shape[1]:
        x = x + 3 * torch.eye(shape[0], dtype=dtype)
    if rank_deficient:
        x[-1] = x[0]
    return x


def assert_matches_dense(fn, x, fmt):
    """``fn`` of a SparseTensor leaf of ``x`` equals ``fn`` of the dense leaf, and so does its
    gradient at the stored positions."""
    A = scorch.as_sparse(x, fmt).requires_grad_()
    d = x.clone().requires_grad_()
    got, want = fn(A), fn(d)
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, want)
    (ga,), (gd,) = torch.autograd.grad(got.abs().sum(), A), torch.autograd.grad(want.abs().sum(), d)
    torch.testing.assert_close(ga.to_dense(), torch.where(x != 0, gd, 0))


B = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
PSEUDO = {
    "linalg.pinv": lambda t: L.pinv(t), "pinverse": lambda t: torch.pinverse(t),
    "Tensor.pinverse": lambda t: t.pinverse(), "pinv hermitian": lambda t: L.pinv(t @ t.mH, hermitian=True),
    "lstsq": lambda t: L.lstsq(t, B.to(t.dtype)).solution,
    "lstsq gelsd": lambda t: L.lstsq(t, B.to(t.dtype), driver="gelsd").solution,
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("rank_deficient", [False, True])
@pytest.mark.parametrize("name", list(PSEUDO))
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_pseudo_inverses_and_least_squares_match_dense(name, fmt, dtype, rank_deficient):
    x = masked((5, 5), dtype, rank_deficient=rank_deficient)
    assert_matches_dense(PSEUDO[name], x, fmt)


def test_complex_pinv_is_a_pseudo_inverse():
    """The report's case: x @ pinv(A) @ x == x."""
    x = torch.tensor([[1 + 2j, 0], [3j, 4 - 1j]], dtype=torch.complex64)
    P = L.pinv(scorch.as_sparse(x, "csr"))
    torch.testing.assert_close(x @ P @ x, x)
    torch.testing.assert_close(P, L.pinv(x))


TAU = torch.tensor([0.5, -1.2, 0.3, 0.8, 0.0], dtype=torch.float64)
C = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
HOUSEHOLDER = {
    "householder_product": lambda t: L.householder_product(t, TAU.to(t.dtype)),
    "orgqr": lambda t: torch.orgqr(t, TAU.to(t.dtype)), "Tensor.orgqr": lambda t: t.orgqr(TAU.to(t.dtype)),
    "ormqr": lambda t: torch.ormqr(t, TAU.to(t.dtype), C.to(t.dtype)),
    "ormqr right transposed": lambda t: torch.ormqr(t, TAU.to(t.dtype), C.to(t.dtype), left=False, transpose=True),
    "Tensor.ormqr": lambda t: t.ormqr(TAU.to(t.dtype), C.to(t.dtype)),
    "ormqr sparse other": lambda t: torch.ormqr(C.to(t.dtype), TAU.to(t.dtype), t),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("name", list(HOUSEHOLDER))
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_householder_products_are_differentiable(name, fmt, dtype):
    """Their backward wrote into the saved sparse input (``tril_``: NotSupportedError)."""
    assert_matches_dense(HOUSEHOLDER[name], masked((5, 5), dtype, seed=1), fmt)


def test_householder_product_keeps_the_fallback_rules(monkeypatch):
    """Run on the dense copy, as the aten fallback ran it: config.dense_fallback still applies."""
    A = scorch.as_sparse(masked((5, 5), torch.float64), "csr")
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")
    with pytest.raises(scorch.NotSupportedError, match="householder_product has no sparse implementation"):
        L.householder_product(A, TAU)


@pytest.mark.parametrize("sparse", [(2,), (0, 1, 2), (0,)])
@pytest.mark.parametrize("full, reduction", [(False, "none"), (True, "mean"), (False, "sum")])
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_gaussian_nll_loss_with_sparse_arguments(sparse, full, reduction, fmt):
    """torch's body clamps a clone of ``var`` in place; on a SparseTensor that changes the stored
    values only, and the absent zeros gave log(0): NaN.  Now as torch's on the dense tensors."""
    inp, tgt = masked((4, 5), torch.float64, seed=2), masked((4, 5), torch.float64, seed=3)
    var = masked((4, 5), torch.float64, seed=4).abs()
    dense_args = [inp, tgt, var]
    leaves = [scorch.as_sparse(a, fmt).requires_grad_() if i in sparse else a.clone().requires_grad_()
              for i, a in enumerate(dense_args)]
    oracle = [a.clone().requires_grad_() for a in dense_args]
    loss = lambda a, b, v: F.gaussian_nll_loss(a, b, v, full=full, eps=1e-3, reduction=reduction)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # dense by definition: no fallback warning
        got = loss(*leaves)
    want = loss(*oracle)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want)
    weights = torch.linspace(-1, 1, want.numel(), dtype=torch.float64).view(want.shape)
    grads = torch.autograd.grad((got * weights).sum(), leaves)
    wants = torch.autograd.grad((want * weights).sum(), oracle)
    for i, (g, w) in enumerate(zip(grads, wants)):
        if i in sparse:
            assert isinstance(g, scorch.SparseTensor)
            g, w = g.to_dense(), torch.where(dense_args[i] != 0, w, 0)
        torch.testing.assert_close(g, w)


def test_gaussian_nll_loss_module_with_a_sparse_variance():
    inp, tgt = torch.tensor([[0.5, 1.0], [2.0, -1.0]]), torch.tensor([[0.0, 1.0], [0.0, 0.5]])
    var = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    got = torch.nn.GaussianNLLLoss()(inp, tgt, scorch.as_sparse(var, "csr"))
    torch.testing.assert_close(got, torch.nn.GaussianNLLLoss()(inp, tgt, var))
