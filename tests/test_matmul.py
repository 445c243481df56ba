"""matmul / mm / bmm / @ with SparseTensor operands, against dense torch."""

import contextlib
import warnings

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
    with pytest.raises(TypeError, match="unsupported operand"):
        A @ 3
    with pytest.raises(TypeError, match="unsupported operand"):
        [[1.0]] @ A


def test_matmul_operator_autograd():
    """``@`` (SparseTensor.__matmul__ / __rmatmul__) keeps the autograd of torch.matmul."""
    a, x = rnd(5, 6), rnd(6, 3, density=1, seed=1).requires_grad_()
    A = scorch.as_sparse(a, "csr").requires_grad_()
    (A @ x).sum().backward()
    torch.testing.assert_close(x.grad, a.t() @ torch.ones(5, 3, dtype=torch.float64))
    torch.testing.assert_close(A.grad.to_dense(), torch.ones(5, 3, dtype=torch.float64) @ x.detach().t()
                               * (a != 0))
    y = rnd(4, 5, density=1, seed=2).requires_grad_()
    (y @ A).sum().backward()
    torch.testing.assert_close(y.grad, torch.ones(4, 6, dtype=torch.float64) @ a.t())


def test_linear_addmm_tensordot_dropout():
    import torch.nn.functional as F
    w, x, b = rnd(6, 5), rnd(3, 5, density=1, seed=1), rnd(6, density=1, seed=2)
    W = scorch.as_sparse(w, "csr")
    torch.testing.assert_close(F.linear(x, W, b), F.linear(x, w, b))        # sparse weight
    torch.testing.assert_close(F.linear(x[0], W), F.linear(x[0], w))         # 1-d input
    xs = x * (x > 0)
    torch.testing.assert_close(F.linear(scorch.as_sparse(xs, "csr"), w, b), F.linear(xs, w, b))  # sparse input
    inp = rnd(6, 3, density=1, seed=3)
    torch.testing.assert_close(torch.addmm(inp, W, x.t(), beta=0.5, alpha=2), torch.addmm(inp, w, x.t(), beta=0.5, alpha=2))
    torch.testing.assert_close(torch.addmm(inp, W, x.t(), beta=0), w @ x.t())
    a3, b3 = rnd(3, 4, 5), rnd(4, 5, 2, density=1)
    A3 = scorch.as_sparse(a3, "csf")
    torch.testing.assert_close(torch.tensordot(A3, b3, dims=2), torch.tensordot(a3, b3, dims=2))
    torch.testing.assert_close(torch.tensordot(A3, b3, dims=([1], [0])), torch.tensordot(a3, b3, dims=([1], [0])))
    torch.manual_seed(0)
    D = F.dropout(W, 0.5, training=True)
    assert isinstance(D, scorch.SparseTensor) and D.nnz == W.nnz
    kept = D.to_dense() != 0
    torch.testing.assert_close(D.to_dense()[kept], 2 * w[kept])  # survivors scaled by 1/(1-p)
    assert F.dropout(W, 0.5, training=False) is W


def test_linear_layer_with_sparse_weight_trains():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).double()
    mask = rnd(4, 8) != 0
    lin.weight = torch.nn.Parameter(scorch.as_sparse(lin.weight.detach() * mask, "csr"))
    x = rnd(16, 8, density=1, seed=1)
    y = x @ (rnd(4, 8, density=1, seed=2) * mask).t()  # reachable with the masked weight
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(lin(x), y)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert loss.item() < 0.3 * first and isinstance(lin.weight, scorch.SparseTensor)
    P = scorch.as_sparse(rnd(4, 8), "csr")
    v, b = P.values().clone().requires_grad_(), rnd(4, density=1).requires_grad_()
    xx = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v, b, xx: torch.nn.functional.linear(xx, P.with_values(v), b), (v, b, xx))


def test_too_many_batch_dims_is_a_clear_error():
    """More batch dims than the einsum letters reserved for them: a ValueError naming the limit
    and the operands' dims, never a wrong equation."""
    A = scorch.as_sparse(torch.eye(2), "csr")
    x = torch.ones((1,) * 9 + (2, 2))
    with pytest.raises(ValueError, match="at most 8 batch dims with a sparse operand, got 2-d and 11-d"):
        A @ x


@contextlib.contextmanager
def no_fallback():
    """scorch's dense-fallback warning raised as an error: these ops must run sparse."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        yield


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_mv_addmv_baddbmm_sparse_addmm_against_dense(fmt):
    """torch.mv / addmv / baddbmm / sparse.addmm take SparseTensors without densifying;
    oracle: the same call on dense tensors (beta = 0 ignores a NaN input, as torch does)."""
    x = rnd(5, 6)
    x[2] = 0                                                              # an empty row
    A, v, X = scorch.as_sparse(x, fmt), rnd(6, density=1, seed=1), rnd(6, 3, density=1, seed=2)
    y, Y = rnd(5, density=1, seed=3), rnd(5, 3, density=1, seed=4)
    nan = torch.full((5,), float("nan"), dtype=torch.float64)
    with no_fallback():
        cases = [(torch.mv(A, v), torch.mv(x, v)), (A.mv(v), x.mv(v)),
                 (torch.addmv(y, A, v), torch.addmv(y, x, v)),
                 (torch.addmv(y, A, v, beta=0.5, alpha=-2), torch.addmv(y, x, v, beta=0.5, alpha=-2)),
                 (torch.addmv(nan, A, v, beta=0), torch.addmv(nan, x, v, beta=0)),
                 (torch.sparse.addmm(Y, A, X), torch.addmm(Y, x, X)),
                 (torch.sparse.addmm(Y, A, X, beta=2.0, alpha=0.5), torch.addmm(Y, x, X, beta=2.0, alpha=0.5))]
        B = scorch.as_sparse(torch.stack([x, 2 * x]), "csf" if fmt == "ell" else fmt)
        Xb, Yb = rnd(2, 6, 3, density=1, seed=5), rnd(2, 5, 3, density=1, seed=6)
        cases.append((torch.baddbmm(Yb, B, Xb, beta=0.5, alpha=3), torch.baddbmm(Yb, B.to_dense(), Xb, beta=0.5,
                                                                               alpha=3)))
    for got, want in cases:
        torch.testing.assert_close(dense(got), want)
    with pytest.raises(ValueError, match="mv: expects a 2-d matrix and a 1-d vector, got 2-d and 2-d"):
        torch.mv(A, X)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_sparse_mm_reductions_match_torch_sparse(reduce, fmt):
    """torch.sparse.mm(A, X, reduce=...) on a SparseTensor; oracle: torch's own CSR kernel."""
    x = rnd(6, 5)
    x[1] = 0
    A, X = scorch.as_sparse(x, fmt), rnd(5, 4, density=1, seed=1)
    with no_fallback():
        got = torch.sparse.mm(A, X, reduce=reduce) if reduce != "sum" else torch.sparse.mm(A, X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "sparse CSR support is in beta"
        want = torch.sparse.mm(x.to_sparse_csr(), X, reduce=reduce)
    torch.testing.assert_close(got, want)


def test_sparse_mm_and_sampled_addmm_errors_and_sampled_values():
    """sampled_addmm keeps the input's pattern: alpha * (mat1 @ mat2) + beta * input at its
    entries (oracle: torch's sampled_addmm on the CSR); bad reduce / operands: clear errors."""
    x = rnd(5, 6)
    A, Q, K = scorch.as_sparse(x, "csr"), rnd(5, 3, density=1, seed=1), rnd(3, 6, density=1, seed=2)
    for beta, alpha in [(1.0, 1.0), (0.0, 2.0), (0.5, -1.0)]:
        got = torch.sparse.sampled_addmm(A, Q, K, beta=beta, alpha=alpha)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = torch.sparse.sampled_addmm(x.to_sparse_csr(), Q, K, beta=beta, alpha=alpha).to_dense()
        assert isinstance(got, scorch.SparseTensor) and got.nnz == A.nnz
        torch.testing.assert_close(got.to_dense(), want)
    with pytest.raises(ValueError, match="reduce must be 'sum', 'mean', 'amax' or 'amin', got 'max'"):
        torch.sparse.mm(A, K.t(), reduce="max")
    with pytest.raises(ValueError, match="needs a 2-d sparse mat1 and a dense mat2"):
        torch.sparse.mm(A, A, reduce="mean")
    with pytest.raises(ValueError, match="do not chain"):
        torch.sparse.mm(A, Q, reduce="amax")


def test_dot_and_inner_with_sparse_operands():
    """torch.dot / inner contract the last dims through the compiled einsum; oracle: dense torch."""
    x = rnd(5, 6)
    A = scorch.as_sparse(x, "csr")
    with no_fallback():
        cases = [(torch.dot(A[0], A[1]), torch.dot(x[0], x[1])), (A[2].dot(x[3]), x[2].dot(x[3])),
                 (torch.inner(A, A), torch.inner(x, x)), (torch.inner(A, x[0]), torch.inner(x, x[0])),
                 (A.inner(x), x.inner(x))]
    for got, want in cases:
        torch.testing.assert_close(dense(got), want)
    with pytest.raises(ValueError, match="inner: the last dims differ"):
        torch.inner(A, rnd(5))


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_addbmm_addr_and_in_place_products_against_dense(fmt):
    """addbmm / addr and the in-place forms on a dense self (dense.addmm_(A, X), ...) take
    SparseTensors without the fallback; oracle: the same calls on dense tensors."""
    x, X = rnd(5, 6), rnd(6, 3, density=1, seed=1)
    A = scorch.as_sparse(x, fmt)
    xb = torch.stack([x, rnd(5, 6, seed=7)])
    B = scorch.as_sparse(xb, "csf" if fmt == "ell" else fmt)
    Xb, Y = rnd(2, 6, 3, density=1, seed=2), rnd(5, 3, density=1, seed=3)
    u, w = rnd(5, seed=4), rnd(6, seed=5)
    U, W = scorch.as_sparse(u, "coo" if fmt == "ell" else fmt), scorch.as_sparse(w, "coo" if fmt == "ell" else fmt)
    with no_fallback():
        cases = [(torch.addbmm(Y, B, Xb), torch.addbmm(Y, xb, Xb)),
                 (torch.addbmm(Y, B, Xb, beta=0.5, alpha=2), torch.addbmm(Y, xb, Xb, beta=0.5, alpha=2)),
                 (Y.addbmm(B, Xb), Y.addbmm(xb, Xb)),
                 (torch.addr(A, u, w), torch.addr(x, u, w)),
                 (torch.addr(x, U, w, beta=2, alpha=-1), torch.addr(x, u, w, beta=2, alpha=-1)),
                 (torch.addr(A, U, W), torch.addr(x, u, w)),
                 (Y.clone().addmm_(A, X, beta=0.5), Y.clone().addmm_(x, X, beta=0.5)),
                 (Y[:, 0].clone().addmv_(A, w, alpha=3), Y[:, 0].clone().addmv_(x, w, alpha=3)),
                 (Y.clone().addbmm_(B, Xb), Y.clone().addbmm_(xb, Xb)),
                 (torch.stack([Y, Y]).baddbmm_(B, Xb), torch.stack([Y, Y]).baddbmm_(xb, Xb)),
                 (x.clone().addr_(U, w), x.clone().addr_(u, w))]
        out = torch.empty(0, dtype=torch.float64)
        cases.append((torch.addbmm(Y, B, Xb, out=out), torch.addbmm(Y, xb, Xb)))
    for got, want in cases:
        torch.testing.assert_close(dense(got), want)
    assert out.shape == (5, 3)
    Z = Y.clone()
    assert Z.addmm_(A, X) is Z                                     # in place: self returned
    with pytest.raises(NotImplementedError, match="addmm_: writing a product into a sparse tensor in place"):
        A.addmm_(x, X[:, :1].expand(6, 6).contiguous())
    with pytest.raises(ValueError, match=r"addmm_: the result has shape \(5, 3\), but self has \(3,\)"):
        Y[0].clone().addmm_(A, X)
    with pytest.raises(ValueError, match="addbmm: expects 3-d batches, got 2-d and 3-d"):
        torch.addbmm(Y, A, Xb)
    with pytest.raises(ValueError, match="addr: expects 1-d vectors, got 2-d and 1-d"):
        torch.addr(A, A, w)


@pytest.mark.parametrize("sparse_arg", ["input1", "weight", "input2"])
def test_bilinear_with_a_sparse_operand_and_its_gradients(sparse_arg):
    """F.bilinear (nn.Bilinear) as one einsum with any operand sparse, gradients in the sparse
    operand's pattern; oracle: dense F.bilinear and its gradients (masked to the pattern)."""
    x1, x2 = rnd(4, 5, density=0.5, seed=1), rnd(4, 3, density=0.5, seed=2)
    Wt, b = rnd(2, 5, 3, density=0.5, seed=3), rnd(2, density=1, seed=4)
    dense_args = {"input1": x1, "weight": Wt, "input2": x2}
    args = {k: (scorch.as_sparse(v, "coo" if v.dim() == 3 else "csr") if k == sparse_arg else v.clone())
            for k, v in dense_args.items()}
    args[sparse_arg].requires_grad_()
    ref = {k: v.clone().requires_grad_(k == sparse_arg) for k, v in dense_args.items()}
    with no_fallback():
        got = torch.nn.functional.bilinear(args["input1"], args["input2"], args["weight"], b)
        (got * torch.arange(8.0, dtype=torch.float64).reshape(4, 2)).sum().backward()
    want = torch.nn.functional.bilinear(ref["input1"], ref["input2"], ref["weight"], b)
    (want * torch.arange(8.0, dtype=torch.float64).reshape(4, 2)).sum().backward()
    torch.testing.assert_close(dense(got), want)
    mask = dense_args[sparse_arg] != 0
    torch.testing.assert_close(dense(args[sparse_arg].grad), ref[sparse_arg].grad * mask)
    with pytest.raises(ValueError, match="bilinear: weight must be 3-d"):
        torch.nn.functional.bilinear(args["input1"], args["input2"], scorch.as_sparse(x1, "csr"))
    with pytest.raises(ValueError, match="must be at least 1-d with the same leading dims"):
        torch.nn.functional.bilinear(args["input1"][:3], args["input2"], args["weight"])


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_cross_products_stay_sparse(fmt):
    """torch.linalg.cross / torch.cross of sparse 3-vectors: sparse (the union of the products'
    patterns), broadcasting like torch; oracle: dense torch."""
    a, b = rnd(6, 3, seed=1), rnd(6, 3, seed=2)
    A, B = scorch.as_sparse(a, fmt), scorch.as_sparse(b, fmt)
    with no_fallback():
        got = torch.linalg.cross(A, B)
        cases = [(got, torch.linalg.cross(a, b)), (torch.linalg.cross(A, b[:1]), torch.linalg.cross(a, b[:1])),
                 (torch.linalg.cross(A.t(), B.t(), dim=0), torch.linalg.cross(a.t(), b.t(), dim=0)),
                 (A.cross(B, dim=1), a.cross(b, dim=1)), (torch.cross(A, B, dim=-1), torch.cross(a, b, dim=-1))]
    assert isinstance(got, scorch.SparseTensor)
    for got, want in cases:
        torch.testing.assert_close(dense(got), want)
    with pytest.warns(UserWarning, match="without specifying the dim arg is deprecated"):
        torch.testing.assert_close(dense(torch.cross(A.t(), B.t())), torch.linalg.cross(a.t(), b.t(), dim=0))
    with pytest.raises(ValueError, match=r"linalg.cross: input \(6, 3\) must have size 3 at dim 0"):
        torch.linalg.cross(A, B, dim=0)
    with pytest.raises(ValueError, match="the same number of dims .as in torch., got 2-d and 1-d"):
        torch.linalg.cross(A, b[0])


def test_scaled_products_take_torchs_keyword_names():
    """addmm(input=, mat1=, mat2=), addmv(..., vec=), addr(vec1=, vec2=) and the in-place forms by
    keyword, as torch names them; oracle: the dense calls."""
    x, X, y = rnd(5, 6), rnd(6, 3, density=1, seed=1), rnd(5, 3, density=1, seed=2)
    A, v, w = scorch.as_sparse(x, "csr"), rnd(6, density=1, seed=3), rnd(5, density=1, seed=4)
    with no_fallback():
        cases = [(torch.addmm(input=y, mat1=A, mat2=X, beta=2), torch.addmm(y, x, X, beta=2)),
                 (torch.addmv(y[:, 0], A, vec=v), torch.addmv(y[:, 0], x, v)),
                 (torch.addr(A, vec1=w, vec2=v, alpha=3), torch.addr(x, w, v, alpha=3)),
                 (y.clone().addmm_(A, mat2=X), y + x @ X)]
    for got, want in cases:
        torch.testing.assert_close(dense(got), want)


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "ell"])
def test_smm_hspmm_sspaddmm_stay_sparse_like_torch_sparse(fmt):
    """torch.sparse's sparse-result products: smm (in the operand's format), hspmm (rows stored,
    each dense: [compressed, dense]), sspaddmm (beta * input + alpha * product, input's format);
    oracle: the same calls on torch's COO tensors -- values and the number of stored entries."""
    x = rnd(6, 5)
    x[1] = 0                                                              # a row with nothing stored
    X, y = rnd(5, 3, density=1, seed=1), rnd(6, 3, seed=2)
    A, Y = scorch.as_sparse(x, fmt), scorch.as_sparse(y, fmt)
    with no_fallback():
        got = [torch.smm(A, X), A.smm(X), torch.hspmm(A, X), torch.sspaddmm(Y, A, X),
               Y.sspaddmm(A, X, beta=2.0, alpha=-0.5)]
    S, T = x.to_sparse(), y.to_sparse()
    want = [torch.smm(S, X), S.smm(X), torch.hspmm(S, X), torch.sspaddmm(T, S, X),
            T.sspaddmm(S, X, beta=2.0, alpha=-0.5)]
    for g, w in zip(got, want):
        assert isinstance(g, scorch.SparseTensor)
        torch.testing.assert_close(g.to_dense(), w.to_dense())
    assert [g.format for g in got] == [A.format, A.format, scorch.Format([scorch.compressed, scorch.dense]),
                                       Y.format, Y.format]
    assert got[0].nnz == want[0].coalesce()._nnz() and got[2].nnz == want[2]._values().numel()
    Ag = A.clone().requires_grad_()                                       # differentiable as einsum is
    Xg, xg, Xd = X.clone().requires_grad_(), x.clone().requires_grad_(), X.clone().requires_grad_()
    (torch.smm(Ag, Xg) ** 2).sum().backward()
    ((xg @ Xd) ** 2).sum().backward()
    torch.testing.assert_close(Ag.grad.to_dense(), xg.grad * (x != 0))
    torch.testing.assert_close(Xg.grad, Xd.grad)
    with pytest.raises(ValueError, match="hspmm: expects a 2-d sparse mat1 and a 2-d mat2, got SparseTensor 2-d "
                                         "and Tensor 1-d"):
        torch.hspmm(A, X[:, 0])
    with pytest.raises(ValueError, match=r"smm: mat1 \(6, 5\) and mat2 \(3, 3\) do not chain"):
        torch.smm(A, X[:3])
    with pytest.raises(ValueError, match=r"sspaddmm: input \(6, 5\) must have the product's shape \(6, 3\)"):
        torch.sspaddmm(A, A, X)
    Bk = scorch.as_sparse(x[:, :4], scorch.formats.bsr(2, 2))   # blocks that do not tile the (6, 3) product
    torch.testing.assert_close(torch.smm(Bk, X[:4]).to_dense(), x[:, :4] @ X[:4])


def test_linear_with_no_input_features_gives_the_bias():
    """``F.linear`` of an ``(n, 0)`` input with a sparse ``(3, 0)`` weight (a reshape(-1, 0) could not
    infer its rows); oracle: torch's linear on the dense weight."""
    X, W, b = torch.randn(16, 0), torch.zeros(3, 0), torch.arange(3.0)
    for fmt in ("csr", "coo", "csc"):
        A = scorch.as_sparse(W, fmt)
        torch.testing.assert_close(torch.nn.functional.linear(X, A), torch.nn.functional.linear(X, W))
        torch.testing.assert_close(torch.nn.functional.linear(X, A, b), torch.nn.functional.linear(X, W, b))


def test_explain_of_a_permutation_says_what_einsum_returns(monkeypatch):
    """``einsum("ij->ji", A)`` is A's storage permuted (sparse); explain said a dense path and result
    when A was denser than the crossover."""
    monkeypatch.setattr(scorch.config, "dense_threshold", 0.0)
    A = scorch.as_sparse(torch.tensor([[1., 0, 2], [0, 0, 3]]), "csr")
    for fmt in (None, "coo"):
        plan, out = scorch.explain("ij->ji", A, format=fmt), scorch.einsum("ij->ji", A, format=fmt)
        assert isinstance(out, scorch.SparseTensor) and plan.backend == "permute (no kernel)"
        assert str(out.format) in plan.output_format
        assert torch.equal(out.to_dense(), A.to_dense().t())


@pytest.mark.parametrize("fmt", ["coo", "csr"])
@pytest.mark.parametrize("beta, alpha", [(1, 1), (3, 2), (0, 2), (2, 0), (0, 0), (True, False)])
def test_addr_of_bools_takes_alpha_and_beta_as_bools(fmt, beta, alpha):
    """For bool tensors torch reads alpha / beta as booleans (an or of and-ed terms) and returns
    bool; multiplying by them made int64 and values like 3 and 2."""
    g = torch.Generator().manual_seed(0)
    x, u, w = (torch.rand(*s, generator=g) < 0.5 for s in ((4, 5), (4,), (5,)))
    want = torch.addr(x, u, w, beta=beta, alpha=alpha)
    sparse = lambda t, f="coo": scorch.as_sparse(t, f)  # noqa: E731
    for args in ((sparse(x, fmt), u, w), (x, sparse(u), w), (x, u, sparse(w))):
        got = dense(torch.addr(*args, beta=beta, alpha=alpha))
        assert got.dtype == torch.bool
        assert torch.equal(got, want)


def test_einsum_add_of_bools_stays_bool():
    # the dense path added the inits with sum(init), which starts from 0: a bool result became int64
    from scorch.ops.einsum import einsum_add
    v, w = torch.tensor([True, True]), torch.tensor([True, False])
    b = torch.tensor([[False, True], [False, False]])
    got = einsum_add("i,j->ij", (scorch.as_sparse(v), w), (b,))
    want = torch.einsum("i,j->ij", v, w) + b
    assert got.dtype == want.dtype == torch.bool and torch.equal(got, want)
    got = torch.addr(b, scorch.as_sparse(v), w)
    assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, torch.addr(b, v, w))
