"""Autograd: gradients w.r.t. dense operands and the values of sparse operands (gradcheck,
float64), sparse parameters under torch optimizers, and a GCN that trains on Cora."""

import warnings

import numpy as np
import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density)


def dense(y):
    return y.to_dense() if isinstance(y, scorch.SparseTensor) else y


EINSUMS = [
    ("ij,jk->ik", [(4, 5), (5, 3)], [0]),
    ("ij,j->i", [(4, 5), (5,)], [0]),
    ("ij,i->j", [(4, 5), (4,)], [0]),
    ("ij,ik,jk->ij", [(4, 5), (4, 2), (5, 2)], [0]),
    ("ij,jk->ik", [(4, 5), (5, 3)], [1]),
    ("ij,jk->ik", [(4, 5), (5, 3)], [0, 1]),            # SpGEMM: both sparse
    ("ijk,jr,kr->ir", [(3, 4, 5), (4, 2), (5, 2)], [0]),
    ("bnd,bn->bd", [(5, 3, 2), (5, 3)], [1]),
    ("ij->", [(4, 5)], [0]),
    ("ij,jk->ik", [(4, 5), (1, 3)], [0]),               # broadcast dense operand
    ("ij,k->ijk", [(3, 4), (2,)], [0]),
]


@pytest.mark.parametrize("eq,shapes,sparse", EINSUMS, ids=[e[0] + str(e[2]) for e in EINSUMS])
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "ell"])
def test_einsum_gradcheck(eq, shapes, sparse, fmt):
    pats, args = [], []
    for k, s in enumerate(shapes):
        x = rnd(*s, seed=k, density=0.5 if k in sparse else 1)
        if k in sparse:
            P = scorch.as_sparse(x, fmt if len(s) >= 2 or fmt not in ("csc",) else "csr")
            pats.append(P)
            args.append(P.values().clone().requires_grad_())
        else:
            pats.append(None)
            args.append(x.clone().requires_grad_())

    def f(*a):
        ops = [P.with_values(v) if P is not None else v for P, v in zip(pats, a)]
        return dense(scorch.einsum(eq, *ops))
    assert torch.autograd.gradcheck(f, tuple(args))


def test_sparse_gradient_keeps_the_pattern():
    A = scorch.as_sparse(rnd(6, 7), "csr").requires_grad_()
    X = rnd(7, 3, density=1).requires_grad_()
    (A @ X).pow(2).sum().backward()
    assert isinstance(A.grad, scorch.SparseTensor) and A.grad.format == A.format
    assert A.grad.crd(1) is A.crd(1) or torch.equal(A.grad.crd(1), A.crd(1))
    Ad, Xd = A.detach().to_dense().requires_grad_(), X.detach().clone().requires_grad_()
    (Ad @ Xd).pow(2).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), Ad.grad * (Ad != 0))
    torch.testing.assert_close(X.grad, Xd.grad)


@pytest.mark.parametrize("op", [torch.relu, torch.neg, torch.abs, torch.tanh, torch.sin,
                                lambda x: x * 3, lambda x: x.pow(2), lambda x: torch.exp(x)])
def test_pointwise_gradcheck(op):
    P = scorch.as_sparse(rnd(5, 6), "csr")
    v = P.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: dense(op(P.with_values(v))), (v,))


OPTIMIZERS = {  # torch.optim on CPU loops over the tensors unless foreach=True (then torch._foreach_* ops)
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=0.05),
    "SGD foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "Adam foreach amsgrad": lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True, foreach=True),
    "AdamW foreach": lambda p: torch.optim.AdamW(p, lr=0.05, foreach=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.2),   # its denominator is a dense state
    "Adagrad foreach": lambda p: torch.optim.Adagrad(p, lr=0.2, foreach=True),
    "RMSprop foreach": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, foreach=True),
    "Adamax foreach": lambda p: torch.optim.Adamax(p, lr=0.05, foreach=True),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=0.05),
    "RAdam foreach": lambda p: torch.optim.RAdam(p, lr=0.3, foreach=True),
    "Adadelta foreach": lambda p: torch.optim.Adadelta(p, lr=5.0, foreach=True),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=0.01),   # writes sign[sign == 0] = 1 into a temporary
    "Rprop foreach": lambda p: torch.optim.Rprop(p, lr=0.01, foreach=True),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=0.05),
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=2),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_update_a_sparse_parameter_in_place(name):
    opt = OPTIMIZERS[name]
    torch.manual_seed(0)
    target = rnd(6, 4, density=1)
    mask = rnd(6, 8) != 0
    W = torch.nn.Parameter(scorch.as_sparse(rnd(6, 8) * mask, "csr"))
    crd_before, X = W.crd(1).clone(), rnd(8, 4, density=1, seed=3)
    o = opt([W])
    losses = []
    for _ in range(40):
        def closure():
            o.zero_grad()
            loss = (W @ X - target).pow(2).mean()
            loss.backward()
            return loss
        losses.append(o.step(closure).item())
    assert isinstance(W, scorch.SparseTensor) and torch.equal(W.crd(1), crd_before)  # pattern unchanged
    assert losses[-1] < 0.5 * losses[0]
    # the reference: the same model with a dense masked weight
    torch.manual_seed(0)
    Wd = torch.nn.Parameter((rnd(6, 8) * mask).clone())
    od = opt([Wd])
    for _ in range(40):
        def closure_dense():
            od.zero_grad()
            loss = ((Wd * mask) @ X - target).pow(2).mean()
            loss.backward()
            return loss
        od.step(closure_dense)
    torch.testing.assert_close(W.to_dense(), (Wd * mask).detach(), rtol=1e-6, atol=1e-8)


def test_gcn_trains_on_cora(data_dir):
    """A 2-layer GCN written with plain torch calls on a SparseTensor adjacency."""
    z = np.load(data_dir / "cora.npz")
    n = int(z["num_nodes"])
    ei = torch.from_numpy(z["edge_index"])
    ei = torch.cat([ei, torch.arange(n).repeat(2, 1)], 1)  # self-loops
    deg = torch.bincount(ei[0], minlength=n).float()
    w = deg[ei[0]].rsqrt() * deg[ei[1]].rsqrt()
    A = scorch.from_coo(ei, w, (n, n), format="csr")
    import scipy.sparse as sp
    feats = sp.csr_array((z["x_data"], z["x_indices"], z["x_indptr"]), shape=tuple(z["x_shape"]))
    X = torch.from_numpy(feats.toarray().astype(np.float32))
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    y = torch.from_numpy(z["y"]).long()
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(n, generator=g)
    train, test = perm[:140 * 5], perm[1708:]

    torch.manual_seed(0)
    W1 = torch.nn.Parameter(torch.randn(X.shape[1], 16) * (2 / X.shape[1]) ** 0.5)
    W2 = torch.nn.Parameter(torch.randn(16, 7) * (2 / 16) ** 0.5)
    opt = torch.optim.Adam([W1, W2], lr=0.02, weight_decay=5e-4)
    losses = []
    for epoch in range(100):
        opt.zero_grad()
        h = torch.relu(A @ (X @ W1))
        h = torch.nn.functional.dropout(h, 0.5, training=True)
        out = A @ (h @ W2)
        loss = torch.nn.functional.cross_entropy(out[train], y[train])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        pred = (A @ (torch.relu(A @ (X @ W1)) @ W2)).argmax(1)
    acc = (pred[test] == y[test]).float().mean().item()
    print(f"GCN on Cora: loss {losses[0]:.3f} -> {losses[-1]:.3f}, test accuracy {acc:.3f}")
    assert all(b < a for a, b in zip(losses[::20], losses[20::20]))  # going down
    assert acc > 0.75, acc


VIEWS_AND_COPIES = {  # ops returning a SparseTensor on (or copied from) the input's values
    "t": lambda A: A.t(), "T": lambda A: A.T, "mT": lambda A: A.mT, "torch.t": lambda A: torch.t(A),
    "transpose": lambda A: A.transpose(0, 1), "permute": lambda A: A.permute(1, 0),
    "asformat coo": lambda A: A.asformat("coo"), "asformat csc": lambda A: A.asformat("csc"),
    "asformat ell": lambda A: A.asformat("ell"), "asformat dcsr": lambda A: A.asformat("dcsr"),
    "int64 indices": lambda A: A.asformat(A.format, index_dtype=torch.int64),
    "clone": lambda A: A.clone(), "to float32": lambda A: A.to(torch.float32), "float": lambda A: A.float(),
}


@pytest.mark.parametrize("name", list(VIEWS_AND_COPIES))
@pytest.mark.parametrize("fmt", ["csr", "ell"])
def test_views_and_copies_keep_the_gradient(name, fmt):
    """Transposes, format and dtype conversions and clones of a SparseTensor that requires grad
    stay in the autograd graph (they returned a tensor without a grad_fn: a gradient silently
    lost); oracle: gradcheck's finite differences on the stored values."""
    f = VIEWS_AND_COPIES[name]
    A = scorch.as_sparse(rnd(4, 5), fmt)
    weights = torch.arange(20, dtype=torch.float64).view(4, 5)

    def loss(v):
        y = f(A.with_values(v))
        assert y.requires_grad and y.grad_fn is not None
        d = y.to_dense().double()
        return (d * (weights.t() if d.shape == (5, 4) else weights)).sum()
    v = A.values().clone().requires_grad_()
    lossy = "float" in name or "32" in name   # a float32 cast: wider steps, looser match (the loss is linear)
    assert torch.autograd.gradcheck(loss, (v,), eps=1e-2 if lossy else 1e-6, atol=1e-3 if lossy else 1e-8)
    with torch.no_grad():
        assert f(A.requires_grad_()).grad_fn is None   # no graph where none is wanted


NORMS = {
    "norm": lambda A: A.norm(), "norm p=1": lambda A: torch.norm(A, p=1), "norm dim": lambda A: A.norm(dim=1),
    "norm keepdim": lambda A: torch.norm(A, keepdim=True), "vector_norm": lambda A: torch.linalg.vector_norm(A),
    "vector_norm inf": lambda A: torch.linalg.vector_norm(A, float("inf")),
    "vector_norm -inf": lambda A: torch.linalg.vector_norm(A, float("-inf")),
    "vector_norm 3 dim": lambda A: torch.linalg.vector_norm(A, 3, dim=0), "linalg.norm": lambda A: torch.linalg.norm(A),
    "linalg.norm fro": lambda A: torch.linalg.norm(A, "fro"), "linalg.norm nuc": lambda A: torch.linalg.norm(A, "nuc"),
    "linalg.norm dim": lambda A: torch.linalg.norm(A, dim=1), "norm p=3 dim": lambda A: torch.norm(A, p=3, dim=0),
    "vector_norm inf dim": lambda A: torch.linalg.vector_norm(A, float("inf"), dim=1, keepdim=True),
    "vector_norm 1 dims": lambda A: torch.linalg.vector_norm(A, 1, dim=(0, 1)),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_norms_and_their_gradients_match_dense(name):
    """Norms of a SparseTensor (torch's backward of a norm wrote into its sparse input in place
    and failed); oracle: the norm of the dense tensor and its gradient at the stored entries."""
    f = NORMS[name]
    D = torch.tensor([[1.0, 0, -3, 0], [2, 3, 0, 0], [0, 0, 0, 4]], dtype=torch.float64)
    A, Ad = scorch.as_sparse(D, "csr").requires_grad_(), D.clone().requires_grad_()
    y, want = f(A), f(Ad)
    torch.testing.assert_close(y, want)
    w = torch.arange(1, want.numel() + 1, dtype=torch.float64).view(want.shape)
    (g,), (gd,) = torch.autograd.grad((y * w).sum(), A), torch.autograd.grad((want * w).sum(), Ad)
    assert isinstance(g, scorch.SparseTensor)
    torch.testing.assert_close(g.to_dense(), gd * (D != 0))
    E = scorch.as_sparse(torch.zeros(2, 3, dtype=torch.float64), "csr")   # no entries: 0, as dense
    torch.testing.assert_close(f(E), f(torch.zeros(2, 3, dtype=torch.float64)))


@pytest.mark.parametrize("how", ["requires_grad_", "setter", "Parameter", "constructor"])
def test_dense_gradients_reach_a_sparse_leaf_in_its_pattern(how):
    """exp (f(0) != 0) runs on the dense tensor, and torch's gradient for it is dense; a sparse
    leaf still receives its gradient in its pattern (accumulated with a sparse one), and an
    optimizer steps its stored values.  Oracle: the dense tensor's gradient at the stored entries."""
    D = torch.tensor([[1.0, 0, 3, 0], [2, 3, 0, 0], [0, 0, 0, 4]], dtype=torch.float64)
    A = scorch.as_sparse(D, "csr")
    if how == "requires_grad_":
        A.requires_grad_()
    elif how == "setter":
        A.requires_grad = True
    elif how == "Parameter":
        A = torch.nn.Parameter(A)
    else:
        A = scorch.SparseTensor(A.format, A.shape, A._pos, A._crd, A._vals.clone(), requires_grad=True)
    x = torch.arange(4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exp of a SparseTensor: computed on the dense tensor, by design
        loss = torch.exp(A).sum() + (A @ x).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # summing the sparse and the dense gradient is no fallback
        loss.backward()
    Dg = D.clone().requires_grad_()
    (torch.exp(Dg).sum() + (Dg @ x).sum()).backward()
    assert isinstance(A.grad, scorch.SparseTensor) and A.grad.nnz == A.nnz
    torch.testing.assert_close(A.grad.to_dense(), Dg.grad * (D != 0))
    torch.optim.SGD([A], lr=0.1).step()
    torch.testing.assert_close(A.detach().to_dense(), (D - 0.1 * Dg.grad) * (D != 0))


@pytest.mark.parametrize("p,dim", [(2, 1), (1, 0), (float("inf"), 1), (3, -1)])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_normalize_keeps_the_pattern(p, dim, fmt):
    """F.normalize of a SparseTensor (a row with no entries and a row of stored zeros included)
    is sparse in its pattern; oracle: F.normalize of the dense tensor, values and gradient."""
    D = torch.tensor([[1.0, 0, -3, 0], [0, 0, 0, 0], [2, 3, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    P = scorch.as_sparse(D + torch.tensor([0.0, 0, 0, 7]).view(4, 1) * torch.tensor([0.0, 1, 1, 0]), fmt)
    vals = torch.where(P.values() == 7, 0.0, P.values())   # row 3 stores two zeros; row 1 stores nothing
    A = scorch.SparseTensor(P.format, P.shape, P._pos, P._crd, vals, requires_grad=True)
    assert A.nnz == 6 and torch.equal(A.to_dense(), D)
    Dg = D.clone().requires_grad_()
    y, want = torch.nn.functional.normalize(A, p=p, dim=dim), torch.nn.functional.normalize(Dg, p=p, dim=dim)
    assert isinstance(y, scorch.SparseTensor) and y.nnz == A.nnz
    torch.testing.assert_close(y.to_dense(), want)
    w = torch.arange(1, 17, dtype=torch.float64).view(4, 4)
    (g,), (gd,) = torch.autograd.grad((y.to_dense() * w).sum(), A), torch.autograd.grad((want * w).sum(), Dg)
    torch.testing.assert_close(g.to_dense(), gd * (P.to_dense() != 0))


def test_matrix_norm_needing_the_dense_tensor_respects_the_limit(monkeypatch):
    """A norm that needs the dense tensor (nuclear) refuses one over dense_fallback_max_bytes."""
    A = scorch.as_sparse(rnd(6, 5), "csr")
    monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", 8)
    with pytest.raises(NotImplementedError, match="norm: this case needs the dense tensor"):
        torch.linalg.norm(A, "nuc")
    assert A.norm(dim=1).shape == (6,)   # entrywise norms never densify


def test_double_backward_through_sparse_products():
    """A backward with create_graph=True runs differentiable einsums, so Hessians / HVPs and
    gradient penalties are right (the gradient came back detached: a Hessian of zeros); a
    convolution with a sparse weight refuses a double backward.  Oracles: gradgradcheck's finite
    differences, the dense Hessian."""
    D = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    A = scorch.as_sparse(D, "csr")
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.functional.hessian(lambda v: (A @ v).pow(3).sum(), x),
                               torch.autograd.functional.hessian(lambda v: (D @ v).pow(3).sum(), x))
    v = A.values().clone().requires_grad_()
    g = torch.Generator().manual_seed(0)
    X, Q, K = (torch.randn(*s, dtype=torch.float64, generator=g).requires_grad_() for s in ((3, 2), (2, 4), (3, 4)))
    B = scorch.as_sparse(torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]], dtype=torch.float64), "coo")
    w = B.values().clone().requires_grad_()
    cases = [(lambda v, X: scorch.einsum("ij,jk->ik", A.with_values(v), X) ** 2, (v, X)),
             (lambda v, Q, K: scorch.einsum("ij,ik,jk->ij", A.with_values(v), Q, K).values() ** 2, (v, Q, K)),
             (lambda v: (A.with_values(v) * A.with_values(2 * v)).to_dense() ** 2, (v,)),
             (lambda v: torch.relu(A.with_values(v)).to_dense() ** 2, (v,)),
             (lambda v, w: (A.with_values(v) + B.t().with_values(w)).to_dense() ** 3, (v, w))]
    for f, inputs in cases:
        assert torch.autograd.gradgradcheck(f, inputs)
    weight = scorch.as_sparse(torch.randn(2, 1, 3, dtype=torch.float64), "csf").requires_grad_()
    inp = torch.randn(1, 1, 5, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(torch.nn.functional.conv1d(inp, weight).pow(2).sum(), inp, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        gx.sum().backward()


def test_masked_fill_with_a_value_that_requires_grad_counts_every_masked_entry():
    """A 0-d value requiring grad reaches the masked entries where nothing is stored too: the
    result is dense (as torch's), so the value's gradient counts them all, not only the stored hits."""
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    m = torch.tensor([[True, True, False], [False, True, True]])
    for val in (0.0, 5.0):
        v, w = torch.tensor(val, requires_grad=True), torch.tensor(val, requires_grad=True)
        got = scorch.as_sparse(d, "csr").masked_fill(m, v)
        want = d.masked_fill(m, w)
        torch.testing.assert_close(got, want)
        (got * torch.arange(6.0).view(2, 3)).sum().backward()
        (want * torch.arange(6.0).view(2, 3)).sum().backward()
        torch.testing.assert_close(v.grad, w.grad)
    A = scorch.as_sparse(d, "csr")
    assert isinstance(A.masked_fill(m, torch.tensor(0.0)), scorch.SparseTensor)   # no grad: the pattern kept


def _in_place_then_backward(A, forward, write):
    y = forward(A)
    with torch.no_grad():
        write(A)
    y.backward()


@pytest.mark.parametrize("fmt", ["csr", "coo"])
@pytest.mark.parametrize("case", ["norm", "softsign", "inf-norm", "matmul via detach", "matmul via t()",
                                  "matmul via reshape"])
def test_a_write_between_forward_and_backward_is_caught_as_torch_catches_it(fmt, case):
    """A SparseTensor written in place (directly, or through an alias: detach(), t(), reshape)
    after a forward saved its values: the backward raises as dense torch's does -- it used to
    read the new values and return a wrong gradient."""
    import torch.nn.functional as F
    X = torch.ones(2, 1)
    forward, write = {
        "norm": (lambda A: A.norm(), lambda A: A.mul_(2)),
        "softsign": (lambda A: F.softsign(A).sum(), lambda A: A.mul_(2)),
        "inf-norm": (lambda A: torch.linalg.vector_norm(A, float("inf")), lambda A: A.mul_(2)),
        "matmul via detach": (lambda A: (A @ X.requires_grad_()).sum(), lambda A: A.detach().mul_(10)),
        "matmul via t()": (lambda A: (A @ X.requires_grad_()).sum(), lambda A: A.t().mul_(10)),
        "matmul via reshape": (lambda A: (A @ X.requires_grad_()).sum(), lambda A: A.reshape(-1).mul_(10)),
    }[case]
    d = torch.tensor([[3.0, 0.0], [0.0, 4.0]])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _in_place_then_backward(d.clone().requires_grad_(), forward, write)   # (torch's own, the rule)
    with pytest.raises(RuntimeError, match="inplace"):
        _in_place_then_backward(scorch.as_sparse(d, fmt).requires_grad_(), forward, write)


@pytest.mark.parametrize("write", ["t", "reshape", "with_values"])
def test_writes_through_a_view_of_a_tensor_that_requires_grad_are_refused_in_grad_mode(write):
    """torch rebases a view's base on an in-place write; scorch's views share the values array but
    autograd would not see the write (B.t().mul_(3) changed B and left its gradient at 1x), so
    the write is refused while grad mode is on; under no_grad it goes through, as torch's."""
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    A = scorch.as_sparse(d, "csr").requires_grad_()
    views = {"t": lambda B: B.t(), "reshape": lambda B: B.reshape(-1),
             "with_values": lambda B: B.with_values(A.values())}
    for B in (A, A * 2):
        with pytest.raises(RuntimeError, match="shares its values with a tensor that requires grad"):
            views[write](B).mul_(3)
    with torch.no_grad():
        views[write](A).mul_(3)
    assert torch.equal(A.detach().to_dense(), 3 * d)
    C = A * 2
    C.mul_(3)   # the tensor itself, in place: recorded
    (C.to_dense() * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), torch.tensor([[6.0, 0.0], [0.0, 24.0]]))


def test_a_transposed_weight_held_across_optimizer_steps_still_trains():
    """A view made once (w.t()) sees every in-place update of its base and carries the gradient
    back to it, as a dense view does."""
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    A = scorch.as_sparse(d, "csr").requires_grad_()
    D = d.clone().requires_grad_()
    At, Dt = A.t(), D.t()
    for _ in range(2):
        with torch.no_grad():
            A.mul_(2)
            D.mul_(2)
        (At @ X).pow(2).sum().backward()
        (Dt @ X).pow(2).sum().backward()
        torch.testing.assert_close(A.grad.to_dense(), D.grad * (d != 0))
        torch.testing.assert_close(At.detach().to_dense(), Dt.detach())


def test_is_grads_batched_through_a_sparse_product():
    """autograd.grad(..., is_grads_batched=True) runs the backward under torch's old vmap, whose
    tensors have no data for a kernel: the dense operands' gradients come from tensordots of the
    densified others; a sparse operand's gradient or a batch index is refused, naming torch.func."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(3, 4, generator=g) * (torch.rand(3, 4, generator=g) < 0.5)
    A = scorch.as_sparse(d, "csr")
    for fn, shape, gshape in [(lambda M, Z: M @ Z, (4, 2), (5, 3, 2)), (lambda M, Z: M @ Z, (4,), (5, 3)),
                              (lambda M, Z: M.t() @ Z, (3, 2), (5, 4, 2)),
                              (lambda M, Z: torch.nn.functional.linear(M, Z), (2, 4), (5, 3, 2))]:
        Z = torch.randn(*shape, generator=g, requires_grad=True)
        gs = torch.randn(*gshape, generator=g)
        got = torch.autograd.grad(fn(A, Z), Z, gs, is_grads_batched=True)[0]
        want = torch.autograd.grad(fn(d, Z), Z, gs, is_grads_batched=True)[0]
        torch.testing.assert_close(got, want)
    # a sparse operand's gradients: dense, 0 off its pattern; a sparse weight that requires grad does not
    # stop a Jacobian with respect to the input (it refused both)
    B, D = scorch.as_sparse(d, "csr").requires_grad_(), d.clone().requires_grad_()
    Z, gs = torch.randn(4, 2, generator=g), torch.randn(5, 3, 2, generator=g)
    got = torch.autograd.grad(B @ Z, B, gs, is_grads_batched=True)[0]
    torch.testing.assert_close(got, torch.autograd.grad(D @ Z, D, gs, is_grads_batched=True)[0] * (d != 0))
    lin = torch.nn.Linear(4, 3, bias=False)
    lin.weight = torch.nn.Parameter(scorch.as_sparse(d, "csr"))
    x = torch.randn(2, 4, generator=g)
    torch.testing.assert_close(torch.autograd.functional.jacobian(lin, x, vectorize=True),
                               torch.autograd.functional.jacobian(lambda v: v @ d.t(), x, vectorize=True))
    B3 = scorch.as_sparse(torch.stack([d, d]), "csr")
    Y = torch.randn(2, 4, 2, requires_grad=True)
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.autograd.grad(B3 @ Y, Y, torch.randn(5, 2, 3, 2), is_grads_batched=True)


def test_writes_above_the_aten_level_through_a_view_are_refused_too():
    """out= into a view, apply_ on one, and in-place dropout write above torch_dispatch; they are
    refused through a view of a tensor that requires grad in grad mode, and in-place dropout of a
    tensor in the graph is an in-place product autograd records (its gradient ignored the mask)."""
    import torch.nn.functional as F
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 4.0]])
    W = torch.nn.Parameter(scorch.as_sparse(w, "csr"))
    for write in (lambda: torch.mul(W.detach().t(), 2, out=W.t()), lambda: W.t().apply_(lambda v: 0.0),
                  lambda: F.dropout(W.t(), 0.5, True, inplace=True)):
        with pytest.raises(RuntimeError, match="shares its values"):
            write()
    assert torch.equal(W.detach().to_dense(), w)
    torch.manual_seed(0)
    H = W * 2
    F.dropout(H, 0.5, True, inplace=True)
    X = torch.tensor([[1.0], [2.0], [3.0]])
    (H @ X).sum().backward()
    kept = (H.detach().to_dense() != 0).to(w.dtype)   # the surviving entries, scaled by 2 / (1 - p) = 4
    torch.testing.assert_close(W.grad.to_dense(), 4 * kept * X.t())


def test_torch_func_through_a_view_made_inside_the_transform():
    from torch.func import grad, jacrev, vmap
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g) * (torch.rand(6, 5, generator=g) < 0.5)
    W = torch.nn.Parameter(scorch.as_sparse(w, "csr"))
    X = torch.randn(6, 3, generator=g)
    for f in (lambda M: grad(lambda X: (M.t() @ X).pow(2).sum())(X), lambda M: jacrev(lambda X: M.t() @ X)(X),
              lambda M: vmap(grad(lambda x: (M.t() @ x).pow(2).sum()))(X.t()),
              lambda M: grad(lambda X: (M.reshape(5, 6) @ X).pow(2).sum())(X)):
        torch.testing.assert_close(f(W), f(w))


def test_a_complex_sparse_result_stays_in_the_graph():
    g = torch.Generator().manual_seed(0)
    d = torch.complex(torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)) * (torch.rand(4, 5, generator=g) < .5)
    P = torch.complex(torch.randn(4, 2, generator=g), torch.randn(4, 2, generator=g))
    Q = torch.complex(torch.randn(5, 2, generator=g), torch.randn(5, 2, generator=g))
    A, Ps = scorch.as_sparse(d, "csr").requires_grad_(), P.clone().requires_grad_()
    D, Pd = d.clone().requires_grad_(), P.clone().requires_grad_()
    out = torch.einsum("ij,ik,jk->ij", A, Ps, Q)
    assert isinstance(out, scorch.SparseTensor) and out.requires_grad
    (out.to_dense().abs().sum() + (A @ A.t()).to_dense().abs().sum()).backward()
    (torch.einsum("ij,ik,jk->ij", D, Pd, Q).abs().sum() + (D @ D.t()).abs().sum()).backward()
    torch.testing.assert_close(Ps.grad, Pd.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(A.grad.to_dense(), D.grad * (d != 0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["sum", "sum(1)", "mean", "to_dense", "plus dense", "times dense"])
def test_a_write_the_gradient_does_not_read_goes_through(case):
    """A gradient that does not read a tensor's values (a sum's, to_dense's, + dense's; A * X's
    gradient for A reads X only) is not stopped by a write into those values between forward and
    backward -- as torch saves only what the backward reads (it raised "modified by an inplace op")."""
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    X = torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    f = {"sum": lambda A: A.sum(), "sum(1)": lambda A: A.sum(1).sum(), "mean": lambda A: A.mean(),
         "to_dense": lambda A: A.to_dense().sum(), "plus dense": lambda A: (A + X).sum(),
         "times dense": lambda A: (A * X).sum()}[case]
    A, D = scorch.as_sparse(d, "csr").requires_grad_(), d.clone().requires_grad_()
    ya, yd = f(A), f(D)
    with torch.no_grad():
        A.mul_(2)
        D.mul_(2)
    ya.backward()
    yd.backward()
    torch.testing.assert_close(A.grad.to_dense(), D.grad * (d != 0))


# ================================================================ forward mode and torch's tracers

def _fw_case():
    D = torch.tensor([[1., 0, 2], [0, 3, 0], [4, 0, 5]], dtype=torch.float64)
    T = torch.tensor([[1., 0, -1], [0, 2, 0], [1, 0, 3]], dtype=torch.float64)
    return D, T, scorch.as_sparse(D, "csr"), scorch.as_sparse(T, "csr"), torch.randn(3, 2, dtype=torch.float64)


@pytest.mark.parametrize("name", ["to_dense", "t", "values", "clone", "norm", "asformat"])
def test_forward_mode_tangents_pass_the_structure_ops(name):
    """A dual SparseTensor (``fwAD.make_dual(A, T)``) keeps its tangent through to_dense, t(),
    values(), clone, norm and asformat (they dropped it: a zero derivative, silently); oracle:
    the same forward-mode computation on the dense tensors."""
    import torch.autograd.forward_ad as fwAD
    D, Tn, A, T, x = _fw_case()
    ops = {"to_dense": lambda M: M.to_dense() if isinstance(M, scorch.SparseTensor) else M,
           "t": lambda M: M.t() @ x, "norm": lambda M: M.norm(),
           "values": lambda M: M.values() if isinstance(M, scorch.SparseTensor) else M[M != 0],
           "clone": lambda M: M.clone() @ x, "asformat": lambda M: (M.asformat("coo") if isinstance(M, scorch.SparseTensor) else M) @ x}
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ops[name](fwAD.make_dual(A, T))).tangent
        want = fwAD.unpack_dual(ops[name](fwAD.make_dual(D, Tn))).tangent
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, want)


def test_torch_func_through_the_values_of_a_sparse_tensor():
    """torch.func.jvp / vjp / grad of ``v -> A.with_values(v) @ x`` (jvp gave a zero tangent,
    vjp and grad raised); oracle: the dense matrix holding ``v`` at A's positions."""
    D, _, A, _, x = _fw_case()
    mask = D != 0
    v = A.values().clone()
    f = lambda vv: A.with_values(vv) @ x   # noqa: E731
    dense = lambda vv: torch.zeros(3, 3, dtype=vv.dtype).masked_scatter(mask, vv) @ x   # noqa: E731
    t = torch.linspace(-1, 1, v.numel(), dtype=v.dtype)
    torch.testing.assert_close(torch.func.jvp(f, (v,), (t,))[1], torch.func.jvp(dense, (v,), (t,))[1])
    g = torch.randn(3, 2, dtype=v.dtype)
    torch.testing.assert_close(torch.func.vjp(f, v)[1](g)[0], torch.func.vjp(dense, v)[1](g)[0])
    torch.testing.assert_close(torch.func.grad(lambda vv: f(vv).sum())(v), torch.func.grad(lambda vv: dense(vv).sum())(v))
    with pytest.raises(NotImplementedError, match="vmap over"):
        torch.func.jacfwd(f)(v)


def test_torch_func_over_dense_inputs_with_sparse_tensors_built_inside():
    """from_coo inside torch.func.grad (a GCN layer builds its adjacency on every call) and vmap of
    ``A + y`` / ``A / y`` over a batch of dense ``y`` (they reached the kernels with wrapped tensors:
    internal errors); oracle: the dense computations."""
    from scorch.nn import GCNConv
    torch.manual_seed(0)
    ei, x = torch.randint(0, 8, (2, 20)), torch.randn(8, 6)
    conv = GCNConv(6, 4)
    xr = x.clone().requires_grad_()
    conv(xr, ei).pow(2).sum().backward()
    torch.testing.assert_close(torch.func.grad(lambda xx: conv(xx, ei).pow(2).sum())(x), xr.grad)
    W = torch.zeros(8, 8).index_put_((ei[0], ei[1]), torch.ones(20), accumulate=True)
    g = torch.func.grad(lambda xx: (scorch.from_coo(ei, torch.ones(20), (8, 8), format="csr") @ xx).pow(2).sum())(x)
    torch.testing.assert_close(g, torch.func.grad(lambda xx: (W @ xx).pow(2).sum())(x))
    D, _, A, _, _ = _fw_case()
    y = torch.rand(4, 3, 3, dtype=torch.float64) + 1
    for op in (torch.add, torch.sub, torch.div):
        torch.testing.assert_close(torch.func.vmap(lambda yy: op(A, yy))(y), op(D, y))


def test_tracers_that_cannot_see_a_kernel_are_refused():
    """make_fx and torch.jit.trace record a kernel's output buffer as an uninitialised tensor (the
    kernel writes through a pointer): refused with a clear error instead of a wrong graph."""
    from torch.fx.experimental.proxy_tensor import make_fx
    _, _, A, _, x = _fw_case()
    with pytest.raises(NotImplementedError, match="tracing mode"):
        make_fx(lambda y: A @ y)(x)
    with pytest.raises(NotImplementedError, match="jit.trace"), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the tracer's own warnings on the shapes read as ints)
        torch.jit.trace(lambda y: A @ y, (x,))
    torch.testing.assert_close(A @ x, A.to_dense() @ x)   # eager after a refused trace


def test_make_dual_of_a_huge_sparse_tensor_does_not_densify():
    """make_dual's size checks on a SparseTensor compare shapes (they densified both: 26.8 GiB)."""
    import torch.autograd.forward_ad as fwAD
    n = 60000
    idx = torch.stack([torch.arange(1000) * 7, torch.arange(1000) * 11])
    A = scorch.from_coo(idx, torch.rand(1000), (n, n), format="csr")
    x = torch.rand(n, 2)
    with fwAD.dual_level():
        out = fwAD.make_dual(A, A) @ x
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, A @ x)


def test_jacfwd_through_sparse_intermediates_made_inside_the_transform():
    """A SparseTensor made inside torch.func.jacfwd / jvp ((A @ A) @ y, (A * y).sum(1)) reached
    torch's unpack_dual below autograd: an internal assert; oracle: the dense functions."""
    torch.manual_seed(0)
    D = torch.randn(4, 4, dtype=torch.float64) * (torch.rand(4, 4) < 0.5)
    A = scorch.as_sparse(D, "csr")
    x = torch.randn(4, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (a dense fallback's one-time warning under the transform)
        for f, g in ((lambda y: (A @ A) @ y, lambda y: (D @ D) @ y), (lambda y: (A * y).sum(1), lambda y: (D * y).sum(1))):
            torch.testing.assert_close(torch.func.jacfwd(f)(x), torch.func.jacfwd(g)(x))


def test_forward_mode_through_from_coo_and_a_dense_sum():
    """from_coo of values carrying a tangent (torch.func.jvp, fwAD) kept none (a zero derivative),
    as did a dual SparseTensor plus / minus a dense tensor; oracle: the dense computations."""
    import torch.autograd.forward_ad as fwAD
    idx = torch.tensor([[0, 1, 2], [1, 2, 0]])
    h = lambda v: (scorch.from_coo(idx, v, (3, 3), format="csr") @ torch.ones(3)).pow(2).sum()   # noqa: E731
    hd = lambda v: (torch.zeros(3, 3).index_put((idx[0], idx[1]), v) @ torch.ones(3)).pow(2).sum()   # noqa: E731
    v, t = torch.tensor([1., 2., 3.]), torch.tensor([1., -1., 2.])
    torch.testing.assert_close(torch.func.jvp(h, (v,), (t,))[1], torch.func.jvp(hd, (v,), (t,))[1])
    with fwAD.dual_level():
        d = fwAD.make_dual(v, t)
        torch.testing.assert_close(fwAD.unpack_dual(h(d)).tangent, fwAD.unpack_dual(hd(d)).tangent)
    x, tx = torch.tensor([[1., 0], [0, 2.]]), torch.tensor([[1., 0], [0, -1.]])
    with fwAD.dual_level():
        A = fwAD.make_dual(scorch.as_sparse(x, "csr"), scorch.as_sparse(tx, "csr"))
        D = fwAD.make_dual(x, tx)
        for op in (torch.add, torch.sub):
            torch.testing.assert_close(fwAD.unpack_dual(op(A, torch.ones(2, 2))).tangent,
                                       fwAD.unpack_dual(op(D, torch.ones(2, 2))).tangent)


@pytest.mark.parametrize("op", [torch.exp, torch.sigmoid, lambda w: w + 1, lambda w: w * w])
def test_create_graph_gradient_of_a_sparse_leaf_stays_in_the_graph(op):
    # a gradient arriving dense (exp, sigmoid, w + 1) lost its graph in the leaf's pattern hook:
    # the gradient penalty was silently dropped, and HVPs raised
    W0 = torch.tensor([[0.5, 0.], [0., -1.]])
    mask = W0 != 0
    W = torch.nn.Parameter(scorch.as_sparse(W0.clone(), "csr"))
    D = torch.nn.Parameter(W0.clone())
    g, = torch.autograd.grad(op(W).sum(), W, create_graph=True)
    gd, = torch.autograd.grad(op(D).sum(), D, create_graph=True)
    assert g.requires_grad == gd.requires_grad
    (op(W).sum() + g.pow(2).sum()).backward()
    (op(D).sum() + (gd * mask).pow(2).sum()).backward()
    torch.testing.assert_close(W.grad.to_dense(), D.grad * mask)
    # backward(create_graph=True) accumulates a sparse gradient that stays in the graph
    W.grad = None
    op(W).sum().backward(create_graph=True)
    D.grad = None
    op(D).sum().backward(create_graph=True)
    assert isinstance(W.grad, scorch.SparseTensor) and W.grad.requires_grad == D.grad.requires_grad
    if D.grad.requires_grad:
        hv, = torch.autograd.grad(W.grad.sum(), W)
        hvd, = torch.autograd.grad((D.grad * mask).sum(), D)
        torch.testing.assert_close(hv.to_dense(), hvd * mask)


def test_a_set_gradient_storing_part_of_the_pattern_takes_the_parameters_pattern():
    # Adamax's grad.abs() + eps reached only the gradient's stored entries: 0 / 0 = NaN elsewhere
    W, G = torch.tensor([[1., 0], [0, 2]]), torch.tensor([[0.5, 0], [0, 0]])
    for grad in (scorch.as_sparse(G, "csr"), scorch.as_sparse(torch.zeros(2, 2), "csr"), scorch.as_sparse(G, "coo")):
        p, d = torch.nn.Parameter(scorch.as_sparse(W.clone(), "csr")), torch.nn.Parameter(W.clone())
        p.grad, d.grad = grad, grad.to_dense()
        assert p.grad.format == p.format and p.grad.nnz == p.nnz
        torch.optim.Adamax([p], lr=0.1).step()
        torch.optim.Adamax([d], lr=0.1).step()
        torch.testing.assert_close(p.to_dense().detach(), d.detach())
    # a fused step with a gradient of the same entries in another format keeps the parameter's storage
    p = torch.nn.Parameter(scorch.as_sparse(W.clone(), "csr", index_dtype=torch.int64))
    alias = p.detach()
    p.grad = scorch.as_sparse(torch.tensor([[0.5, 0], [0, 1.]]), "coo")
    torch.optim.Adam([p], lr=0.1, fused=True).step()
    assert p.index_dtype == torch.int64 and torch.equal(alias.to_dense(), p.to_dense().detach())
    wider = scorch.as_sparse(torch.ones(2, 2), "csr")   # not within: set as it is
    p.grad = wider
    assert p.grad is wider


def test_vmap_of_grad_over_with_values():
    # per-sample gradients of a sparse layer: project wrote in place into an unbatched buffer
    from torch.func import grad, vmap
    torch.manual_seed(0)
    W = torch.randn(6, 8) * (torch.rand(6, 8) < 0.5)
    A = scorch.as_sparse(W, "csr")
    v = A.values().detach().clone()
    ij = tuple(W.nonzero().t())
    xs, ys = torch.randn(4, 8), torch.randn(4, 6)

    def dense_loss(v, x, y):
        return ((torch.zeros(6, 8).index_put(ij, v) @ x) - y).pow(2).sum()

    def sparse_loss(v, x, y):
        return ((A.with_values(v) @ x) - y).pow(2).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = vmap(grad(sparse_loss), in_dims=(None, 0, 0))(v, xs, ys)
    torch.testing.assert_close(got, vmap(grad(dense_loss), in_dims=(None, 0, 0))(v, xs, ys))


def test_gather_with_an_empty_index_stays_in_the_graph():
    x = torch.tensor([[[1., 0, 2], [0, 3, 0]]])
    idx = torch.zeros(1, 2, 0, dtype=torch.long)
    for gather in (lambda t: torch.gather(t, 2, idx), lambda t: torch.take_along_dim(t, idx, 2)):
        A, d = scorch.as_sparse(x, "coo").requires_grad_(), x.clone().requires_grad_()
        got, want = gather(A), gather(d)
        assert got.requires_grad == want.requires_grad and got.shape == want.shape
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(A.grad.to_dense(), d.grad)


def test_forward_mode_tangent_of_a_sparse_product_stays_in_the_reverse_graph():
    # the tangent of lin(dual sparse x) came from the raw kernel: not in W's graph, so its grad raised
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    lin = torch.nn.Linear(3, 2)
    grads = []
    for t in (x, scorch.as_sparse(x, format="csr")):
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(lin(fwAD.make_dual(t, t.clone()))).tangent
            assert tangent.requires_grad
            grads.append(torch.autograd.grad(tangent.sum(), lin.weight)[0])
    torch.testing.assert_close(grads[1], grads[0])
