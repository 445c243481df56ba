"""scorch.nn.Recommender against the same LightFM formula on dense tensors (plain torch)."""

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.datasets import multi_hot
from scorch.nn import Recommender

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def _model(dim, bias=True, dtype=torch.float32):
    torch.manual_seed(0)
    m = Recommender(60, 40, dim, bias=bias).to(dtype)
    if bias:
        with torch.no_grad():
            m.user_bias.normal_()
            m.item_bias.normal_()
    return m


def _dense_scores(m, Xu, Xi):
    Xu, Xi = Xu.to_dense(), Xi.to_dense()
    s = (Xu @ m.user_embedding) @ (Xi @ m.item_embedding).T
    if m.user_bias is not None:
        s = s + (Xu @ m.user_bias)[:, None] + (Xi @ m.item_bias)[None, :]
    return s


@pytest.mark.parametrize("dim", [8, 14, 64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_all_pairs_and_candidate_pairs(dim, bias, dtype):
    m = _model(dim, bias, dtype)
    Xu, Xi = multi_hot(12, 60, 5, seed=1, dtype=dtype), multi_hot(9, 40, 3, seed=2, dtype=dtype)
    want = _dense_scores(m, Xu, Xi)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(m(Xu, Xi), want, **tol)
        keep = torch.rand(12, 9, generator=torch.Generator().manual_seed(3)) < 0.3
        pairs = scorch.as_sparse(keep.to(dtype), "csr")
        got = m(Xu, Xi, pairs)
        assert isinstance(got, scorch.SparseTensor) and got.nnz == pairs.nnz
        torch.testing.assert_close(got.to_dense(), want * keep, **tol)
        # torch.sparse inputs are accepted as they are
        got2 = m(Xu.to_torch(), Xi.to_torch(), pairs.to_torch())
        torch.testing.assert_close(got2.to_dense(), want * keep, **tol)


def test_gradients_match_dense():
    m = _model(8, dtype=torch.float64)
    Xu, Xi = multi_hot(6, 60, 4, seed=1, dtype=torch.float64), multi_hot(5, 40, 3, seed=2, dtype=torch.float64)
    pairs = scorch.as_sparse((torch.rand(6, 5, generator=torch.Generator().manual_seed(4)) < 0.5).double(), "csr")
    m(Xu, Xi, pairs).values().sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    (_dense_scores(m, Xu, Xi) * pairs.to_dense()).sum().backward()
    for g, p in zip(got, m.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_bad_input():
    m = _model(8)
    Xu, Xi = multi_hot(4, 60, 2), multi_hot(3, 40, 2)
    with pytest.raises(ValueError, match="user_features must have shape"):
        m(multi_hot(4, 59, 2), Xi)
    with pytest.raises(ValueError, match="pairs must have shape"):
        m(Xu, Xi, scorch.as_sparse(torch.ones(3, 4), "csr"))
    with pytest.raises(TypeError, match="pairs must be a SparseTensor"):
        m(Xu, Xi, torch.ones(4, 3))
    with pytest.raises(TypeError, match="item_features must be a tensor"):
        m(Xu, [[1.0]])
    with pytest.raises(ValueError, match="dim must be a positive int"):
        Recommender(3, 3, 0)
