"""Point lookups on SparseTensors: ``x[i, j]`` with broadcast index tensors, bool masks,
``take``, ``gather``, ``take_along_dim``, ``masked_select``.

Oracle: the same indexing of the dense tensor with plain torch.  Lookups covering every dim
give dense results (as torch's), others SparseTensors; none may reach the dense fallback.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import scorch
from scorch import SparseTensor

from strategies import assert_dense_equal, make_dense
from test_shape_ops import SETTINGS, sparse_tensors


@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


def dense(y):
    return y.to_dense() if isinstance(y, SparseTensor) else y


@st.composite
def index_tensor(draw, size, shape):
    return torch.tensor(draw(st.lists(st.integers(-size, size - 1), min_size=int(torch.Size(shape).numel()),
                                      max_size=int(torch.Size(shape).numel()))), dtype=torch.int64).reshape(shape)


@SETTINGS
@given(st.data())
def test_point_lookups_match_dense(data):
    A, x = data.draw(sparse_tensors(min_dims=1, max_dims=3))
    if any(s == 0 for s in x.shape):
        return
    m = data.draw(st.integers(1, x.dim()))
    shape = data.draw(st.sampled_from([(3,), (2, 2), (1, 3), (0,)]))
    key = []
    for d in range(m):   # broadcastable shapes: the drawn shape, or its last dim alone, or an int
        kind = data.draw(st.sampled_from(["full", "last", "int"]))
        if kind == "int":
            key.append(data.draw(st.integers(-x.shape[d], x.shape[d] - 1)))
        else:
            key.append(data.draw(index_tensor(x.shape[d], shape if kind == "full" else shape[-1:])))
    if all(isinstance(k, int) for k in key):
        key[0] = torch.tensor([key[0]])
    key = tuple(key)
    got, want = A[key], x[key]
    tensors = [k for k in key if isinstance(k, torch.Tensor)]
    if m == x.dim() and (len(tensors) > 1 or tensors[0].dim() != 1):
        assert_dense_equal(got, want)   # a lookup of points: dense, as torch's
    else:
        assert_dense_equal(dense(got), want)   # one 1-d index is index_select: sparse


@SETTINGS
@given(st.data())
def test_bool_masks_match_dense(data):
    A, x = data.draw(sparse_tensors(min_dims=1, max_dims=3))
    k = data.draw(st.integers(1, x.dim()))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    mask = torch.rand(x.shape[:k], generator=g) < 0.5
    assert_dense_equal(dense(A[mask]), x[mask])
    row = torch.rand(x.shape[-1:], generator=g) < 0.5
    key = (slice(None),) * (x.dim() - 1) + (row,)
    assert_dense_equal(dense(A[key]), x[key])
    assert_dense_equal(torch.masked_select(A, mask.reshape(mask.shape + (1,) * (x.dim() - k))),
                       torch.masked_select(x, mask.reshape(mask.shape + (1,) * (x.dim() - k))))


@SETTINGS
@given(st.data())
def test_take_and_gather_match_dense(data):
    A, x = data.draw(sparse_tensors(min_dims=1, max_dims=3))
    if x.numel() == 0:
        return
    flat = data.draw(index_tensor(x.numel(), (2, 3)))
    assert_dense_equal(torch.take(A, flat), torch.take(x, flat))
    assert_dense_equal(torch.take_along_dim(A, flat % x.numel()), torch.take_along_dim(x, flat % x.numel()))
    d = data.draw(st.integers(0, x.dim() - 1))
    shape = [data.draw(st.integers(1, s)) if e != d else data.draw(st.integers(0, 4)) for e, s in enumerate(x.shape)]
    index = torch.randint(0, x.shape[d], shape, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    assert_dense_equal(torch.gather(A, d, index), torch.gather(x, d, index))
    assert_dense_equal(A.gather(d - x.dim(), index), x.gather(d - x.dim(), index))
    along = torch.randint(0, x.shape[d], [s if e != d else 2 for e, s in enumerate(x.shape)])
    assert_dense_equal(torch.take_along_dim(A, along, d), torch.take_along_dim(x, along, d))


def test_lookups_are_differentiable():
    x = make_dense((3, 4), 0.6, 2, torch.float64)
    A = scorch.as_sparse(x, "csr")
    v = A.values().clone().requires_grad_()
    rows, cols = torch.tensor([0, 2, 2, 1]), torch.tensor([1, 3, 3, 0])
    for f in (lambda B: B[rows, cols], lambda B: B[x != 0], lambda B: torch.gather(B, 1, torch.tensor([[0, 1]] * 3)),
              lambda B: torch.take(B, torch.tensor([0, 5, 11])), lambda B: dense(B[torch.tensor([[0], [2]])])):
        assert torch.autograd.gradcheck(lambda v: f(A.with_values(v)), (v,))


@pytest.mark.parametrize("call, error, message", [
    (lambda A: A[torch.tensor([True, False])], IndexError, "mask's shape"),
    (lambda A: A[torch.tensor([0, 5]), torch.tensor([0, 1])], IndexError, "index 5 is out of range"),
    (lambda A: A[torch.tensor([0, 1]), torch.tensor([0, 1, 2])], IndexError, "do not broadcast"),
    (lambda A: A[:, torch.tensor([0]), torch.tensor([1])], NotImplementedError, "leading dims"),
    (lambda A: torch.gather(A, 1, torch.tensor([0, 1])), ValueError, "as many dims"),
    (lambda A: torch.gather(A, 1, torch.tensor([[[-1]]])), IndexError, "index -1 is out of range for dim 1"),
    (lambda A: torch.gather(A, 1, torch.tensor([[0.5]])), TypeError, "integers"),
    (lambda A: torch.masked_select(A, torch.ones(3, 4)), TypeError, "bool"),
])
def test_bad_lookups_raise_clear_errors(call, error, message):
    A = scorch.as_sparse(make_dense((3, 4, 2), 0.5, 0, torch.float64), "coo")
    with pytest.raises(error, match=message):
        call(A)


# ================================================================ writes from a SparseTensor into a dense tensor


WRITES = {
    "index_add_": lambda s, src: s.index_add_(0, torch.tensor([2, 0, 2]), src),
    "index_add alpha dim 1": lambda s, src: torch.index_add(s, 1, torch.tensor([3, 0, 3, 1]), src, alpha=-2),
    "scatter_add": lambda s, src: s.scatter_add(0, torch.tensor([[0, 1, 2, 0], [2, 2, 0, 1]]), src),
    "scatter": lambda s, src: torch.scatter(s, 1, torch.tensor([[0, 1], [3, 2], [1, 1]]), src),
    "scatter_reduce amax": lambda s, src: s.scatter_reduce(1, torch.tensor([[0, 1], [3, 2], [1, 1]]), src, "amax"),
    "scatter_": lambda s, src: s.scatter_(0, torch.tensor([[0, 1, 2, 0]]), src),
}


@pytest.mark.parametrize("name", list(WRITES))
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_writes_into_a_dense_tensor_match_dense(name, fmt):
    x = make_dense((3, 4), 0.5, 4, torch.float64)
    target = torch.linspace(-1, 1, 12, dtype=torch.float64).view(3, 4)
    got = WRITES[name](target.clone(), scorch.as_sparse(x, fmt))
    assert_dense_equal(got, WRITES[name](target.clone(), x))


def test_index_add_is_differentiable_and_writes_into_a_sparse_target():
    x = make_dense((3, 4), 0.5, 5, torch.float64)
    A = scorch.as_sparse(x, "csr")
    v = A.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda v: torch.index_add(torch.zeros(3, 4, dtype=torch.float64), 0, torch.tensor([2, 0, 2]), A.with_values(v)), (v,))
    ones = torch.ones(3, 4, dtype=torch.float64)
    assert A.index_add_(0, torch.tensor([0, 1, 2]), ones) is A   # every position now nonzero or stored
    assert_dense_equal(A.to_dense(), x + 1)
    B = scorch.as_sparse(x, "csr").requires_grad_()
    with pytest.raises(NotImplementedError, match="requires grad"):
        B.index_add_(0, torch.tensor([0, 1, 2]), ones)


# ================================================================ embedding lookups in a sparse table


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_embedding_in_a_sparse_table_matches_dense(fmt):
    """``F.embedding`` / ``nn.Embedding`` with a SparseTensor table (a pruned embedding) look up
    the rows only; oracle: the same lookup in the dense table, forward and gradient (read at the
    stored positions; ``padding_idx``'s row gets none)."""
    W = make_dense((10, 4), 0.5, 6, torch.float64)
    idx = torch.tensor([[1, 2, 9], [0, 2, 2]])
    ref = torch.nn.Embedding(10, 4, padding_idx=2).double()
    with torch.no_grad():
        ref.weight.copy_(W)
    A = scorch.as_sparse(W, fmt).requires_grad_()
    out = torch.nn.functional.embedding(idx, A, padding_idx=2)
    assert_dense_equal(out.detach(), ref(idx).detach())
    weights = torch.arange(24.0, dtype=torch.float64).view(2, 3, 4)
    (out * weights).sum().backward()
    (ref(idx) * weights).sum().backward()
    stored = A.detach().with_values(torch.ones_like(A.values())).to_dense() != 0
    torch.testing.assert_close(A.grad.to_dense(), ref.weight.grad * stored)
    m = torch.nn.Embedding(10, 4).double()
    m.weight = torch.nn.Parameter(scorch.as_sparse(W, fmt))
    assert_dense_equal(m(idx).detach(), torch.nn.functional.embedding(idx, W))


@pytest.mark.parametrize("bag", [None, "sum", "mean", "max"])
@pytest.mark.parametrize("max_norm, scale", [(None, True), (1.0, False), (0.5, True)])
def test_embedding_max_norm_and_frequency_scaling_in_a_sparse_table(bag, max_norm, scale):
    """``max_norm`` renormalises the looked-up rows of the table in place (torch's
    ``embedding_renorm_``) and ``scale_grad_by_freq`` divides each row's gradient by its count in
    the batch; oracle: the dense table (torch's ``embedding_bag`` CPU backward miscounts mixed
    counts, pytorch#190063: its bags are checked against ``embedding``'s per-index gradients)."""
    F = torch.nn.functional
    W = make_dense((6, 4), 0.6, 8, torch.float64)
    W[2] = 0
    idx = torch.tensor([[0, 1, 1, 3], [3, 3, 2, 5]])
    A, D = scorch.as_sparse(W.clone(), "csr").requires_grad_(), W.clone().requires_grad_()
    kw = dict(max_norm=max_norm, scale_grad_by_freq=scale)
    if bag == "max" and scale:
        with pytest.raises(ValueError, match="scale_grad_by_freq"):
            F.embedding_bag(idx, A, mode="max", **kw)
        return
    weights = torch.linspace(-1, 2, 8, dtype=torch.float64).view(2, 4, 1)
    rows = F.embedding(idx, D, **kw)
    ref = rows if bag is None else getattr(rows, "amax" if bag == "max" else bag)(1)
    out = F.embedding(idx, A, **kw) if bag is None else F.embedding_bag(idx, A, mode=bag, **kw)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(A.detach().to_dense(), D.detach() * (W != 0))   # the same rows renormalised
    g = weights if bag is None else weights[:, 0]
    (out * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), D.grad * (W != 0))


BAGS = [dict(mode="sum"), dict(mode="mean"), dict(mode="max"), dict(mode="sum", per_sample_weights=True),
        dict(mode="mean", padding_idx=2), dict(mode="sum", include_last_offset=True), dict(mode="max", padding_idx=-1)]


@pytest.mark.parametrize("kw", BAGS, ids=[str(b) for b in BAGS])
def test_embedding_bag_in_a_sparse_table_matches_dense(kw):
    """``F.embedding_bag`` / ``nn.EmbeddingBag`` with a SparseTensor table: torch's reduction over
    the looked-up rows; oracle: the dense table, forward and (gradcheck) the stored values."""
    W = make_dense((10, 4), 0.5, 7, torch.float64)
    A = scorch.as_sparse(W, "csr")
    inp, off = torch.tensor([1, 2, 9, 0, 2, 2, 5]), torch.tensor([0, 3, 3, 5])
    kw = dict(kw)
    if kw.get("per_sample_weights"):
        kw["per_sample_weights"] = torch.linspace(0.5, 2, 7, dtype=torch.float64)
    F = torch.nn.functional
    torch.testing.assert_close(F.embedding_bag(inp, A, off, **kw), F.embedding_bag(inp, W, off, **kw))
    v = A.values().clone().requires_grad_()
    if kw["mode"] != "max":   # max: gradcheck's steps may swap a tie
        assert torch.autograd.gradcheck(lambda v: F.embedding_bag(inp, A.with_values(v), off, **kw), (v,))
    bag = torch.nn.EmbeddingBag(10, 4, mode=kw["mode"]).double()
    bag.weight = torch.nn.Parameter(A)
    torch.testing.assert_close(bag(inp, off), F.embedding_bag(inp, W, off, mode=kw["mode"]))
