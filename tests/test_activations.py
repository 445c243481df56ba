"""torch.nn.functional activations written in Python (softsign, rrelu, the alpha and channel dropouts) on
SparseTensors: against the same calls on the dense tensor, no dense fallback."""

import pytest
import torch
import torch.nn.functional as F

import scorch
from strategies import make_dense


@pytest.fixture(autouse=True)
def no_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_softsign_and_rrelu_keep_the_pattern(fmt):
    x = make_dense((6, 8), 0.4, seed=0)
    A = scorch.as_sparse(x, fmt)
    for got, want in [(F.softsign(A), F.softsign(x)), (F.rrelu(A), F.rrelu(x)),
                      (F.rrelu(A, 0.2, 0.4, training=False), F.rrelu(x, 0.2, 0.4, training=False))]:
        assert isinstance(got, scorch.SparseTensor) and got.nnz == A.nnz
        torch.testing.assert_close(got.to_dense(), want)
    got = F.rrelu(A, 0.2, 0.4, training=True).to_dense()   # random slopes in [lower, upper] for negatives
    neg = x < 0
    torch.testing.assert_close(got[~neg], x[~neg])
    slopes = got[neg] / x[neg]
    assert ((slopes >= 0.2) & (slopes <= 0.4)).all()
    B = A.clone()
    assert F.rrelu(B, training=True, inplace=True) is B and B.nnz == A.nnz
    with pytest.raises(ValueError, match="inplace=True on a SparseTensor that requires grad"):
        F.rrelu(A.detach().requires_grad_(), inplace=True)
    P, xd = A.detach().requires_grad_(), x.clone().requires_grad_()
    (F.softsign(P) * 3).sum().backward()
    (F.softsign(xd) * 3).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), xd.grad * (x != 0))


@pytest.mark.parametrize("op", [F.alpha_dropout, F.feature_alpha_dropout])
def test_alpha_dropouts_are_dense_in_training_and_identity_out_of_it(op):
    x = make_dense((4, 6, 5), 0.4, seed=1)
    A = scorch.as_sparse(x, "coo")
    assert op(A, 0.5) is A and op(A, 0.0, training=True) is A
    torch.manual_seed(3)
    got = op(A, 0.3, training=True)
    torch.manual_seed(3)
    want = op(x, 0.3, training=True)
    assert not isinstance(got, scorch.SparseTensor)
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
        op(A, 1.5, training=True)
    with pytest.raises(NotImplementedError, match="in place on a SparseTensor is not supported"):
        op(A, 0.3, training=True, inplace=True)


@pytest.mark.parametrize("op,shape", [(F.dropout1d, (2, 3, 5)), (F.dropout1d, (3, 5)), (F.dropout2d, (2, 3, 4, 4)),
                                      (F.dropout2d, (3, 4, 4)), (F.dropout3d, (2, 3, 2, 3, 3)),
                                      (F.dropout3d, (3, 2, 3, 3))])
@pytest.mark.filterwarnings("ignore:dropout[23]d. Received a")   # torch's, for the unbatched shapes
def test_channel_dropouts_keep_the_pattern_and_draw_torchs_noise(op, shape):
    """dropout1d/2d/3d (whole channels dropped, the rest scaled): the same random draws as on the
    dense tensor, so the same result -- in the input's pattern; in place on the stored values;
    gradients masked to the pattern."""
    x = make_dense(shape, 0.5, seed=1)
    A = scorch.as_sparse(x, "csf")
    for p in (0.0, 0.4, 1.0):
        torch.manual_seed(3)
        got = op(A, p, True)
        torch.manual_seed(3)
        want = op(x, p, True)
        assert isinstance(got, scorch.SparseTensor) and got.nnz == A.nnz
        torch.testing.assert_close(got.to_dense(), want)
        B = A.clone()
        torch.manual_seed(3)
        op(B, p, True, inplace=True)
        torch.testing.assert_close(B.to_dense(), want)
    torch.testing.assert_close(op(A, 0.5, False).to_dense(), x)
    P, xd = A.detach().requires_grad_(), x.clone().requires_grad_()
    torch.manual_seed(4)
    (op(P, 0.3) ** 2).sum().backward()
    torch.manual_seed(4)
    (op(xd, 0.3) ** 2).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), xd.grad * (x != 0))
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
        op(A, 1.5)


@pytest.mark.parametrize("fmt", ["csr", "csc", "ell"])
def test_gumbel_softmax_of_sparse_logits_samples_among_stored_entries(fmt):
    # torch's body gave NaN (noise drawn for the stored entries, log(0) at the absent ones) and
    # hard=True raised (an aten scatter_ into the SparseTensor it made)
    x = torch.tensor([[1., 0, 2, 0], [0, 3, 0, 0], [0.5, 0.5, 0, 1]])
    A = scorch.as_sparse(x, fmt).requires_grad_()
    for hard in (False, True):
        torch.manual_seed(0)
        g = F.gumbel_softmax(A, tau=0.5, hard=hard)
        d = g.to_dense()
        torch.testing.assert_close(d.sum(1), torch.ones(3))
        assert bool((d[x == 0] == 0).all()) and bool((d >= 0).all())
        if hard:
            assert bool(((d == 0) | (d == 1)).all())
        g.values().sum().backward()
    # the oracle's noise model: with one stored entry per row the sample is that entry
    one = scorch.as_sparse(torch.eye(3) * 5, fmt)
    assert torch.equal(F.gumbel_softmax(one, hard=True).to_dense(), torch.eye(3))
    # an aten scatter_ into a SparseTensor a composite made works as the torch-level one
    z = torch.zeros_like(scorch.as_sparse(x, fmt))
    torch.ops.aten.scatter_.value(z, 1, torch.tensor([[1], [0], [3]]), 1.0)
    assert torch.equal(z.to_dense(), torch.zeros(3, 4).scatter_(1, torch.tensor([[1], [0], [3]]), 1.0))
