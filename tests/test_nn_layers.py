"""scorch.nn layers (GCNConv, SAGEConv, GATConv, SparseLinear) against dense torch oracles:
forward values, gradcheck, the three adjacency inputs, errors, caching, training on Cora,
and PyG's layers when torch_geometric is importable."""

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch.compiler import build
from scorch.datasets import load_graph
from scorch.nn.gnn import GATConv, GCNConv, SAGEConv
from scorch.nn.sparse_linear import SparseLinear

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

N = 7
# (source, target) pairs, PyG style; node 6 has no incoming edge, 2 -> 2 is a self-loop
EDGE_INDEX = torch.tensor([[0, 1, 1, 2, 3, 0, 4, 5, 2, 3, 2, 6],
                           [1, 0, 2, 1, 0, 3, 5, 4, 4, 5, 2, 3]])


def graph_weights(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(EDGE_INDEX.shape[1], generator=g, dtype=dtype) + 0.5


def dense_adj(weights=None, dtype=torch.float64):
    """A[i, j] = weight of edge j -> i."""
    w = torch.ones(EDGE_INDEX.shape[1], dtype=dtype) if weights is None else weights
    return torch.zeros(N, N, dtype=dtype).index_put_((EDGE_INDEX[1], EDGE_INDEX[0]), w, accumulate=True)


def adj_input(kind, weights=None, dtype=torch.float64):
    """The adjacency as a scorch SparseTensor (csr / coo), a torch.sparse tensor, or the edge_index."""
    if kind == "edge_index":
        assert weights is None
        return EDGE_INDEX
    A = dense_adj(weights, dtype)
    if kind in ("csr", "coo"):
        return scorch.as_sparse(A, kind)
    return A.to_sparse_coo() if kind == "torch_coo" else A.to_sparse_csr()


KINDS = ["csr", "coo", "torch_coo", "torch_csr", "edge_index"]


def feats(cols=5, seed=1, dtype=torch.float64):
    return torch.randn(N, cols, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def randomize(layer, seed=0):
    """Non-trivial values in every parameter (biases are zero after reset_parameters)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            if not isinstance(p, scorch.SparseTensor):
                p.copy_(torch.randn_like(p) * 0.5)
    return layer


# ---------------------------------------------------------------- dense oracles

def gcn_oracle(layer, x, A, add_self_loops=True, normalize=True):
    A = A.clone()
    if add_self_loops:
        diag = A.diagonal()
        diag.copy_(torch.where(diag == 0, torch.ones_like(diag), diag))
    if normalize:
        deg = A.sum(1)
        dinv = torch.where(deg > 0, deg.pow(-0.5), torch.zeros_like(deg))
        A = dinv[:, None] * A * dinv[None, :]
    out = A @ (x @ layer.lin.weight.t())
    return out if layer.bias is None else out + layer.bias


def sage_oracle(layer, x, A):
    deg = A.sum(1, keepdim=True)
    mean = torch.where(deg > 0, A / deg.clamp(min=1e-300), torch.zeros_like(A)) @ x
    return layer.lin_l(mean) + layer.lin_r(x)


def gat_oracle(layer, x, A):
    mask = A != 0
    if layer.add_self_loops:
        mask.fill_diagonal_(True)
    H, C = layer.heads, layer.out_channels
    h = (x @ layer.lin.weight.t()).view(N, H, C)
    a_src, a_dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
    outs = []
    for k in range(H):
        e = F.leaky_relu(a_dst[:, k, None] + a_src[None, :, k], layer.negative_slope)
        alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), 1).nan_to_num(0.0)  # empty rows -> 0
        outs.append(alpha @ h[:, k])
    out = torch.cat(outs, 1) if layer.concat else torch.stack(outs).mean(0)
    return out if layer.bias is None else out + layer.bias


# ---------------------------------------------------------------- forward values

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("self_loops,normalize", [(True, True), (False, True), (True, False)])
def test_gcn_matches_dense(kind, self_loops, normalize):
    layer = randomize(GCNConv(5, 3, add_self_loops=self_loops, normalize=normalize).double())
    x = feats()
    got = layer(x, adj_input(kind))
    torch.testing.assert_close(got, gcn_oracle(layer, x, dense_adj(), self_loops, normalize))


@pytest.mark.parametrize("kind", ["csr", "coo", "torch_coo"])
def test_gcn_uses_edge_weights(kind):
    w = graph_weights()
    layer = randomize(GCNConv(5, 3).double())
    x = feats()
    torch.testing.assert_close(layer(x, adj_input(kind, w)), gcn_oracle(layer, x, dense_adj(w)))


@pytest.mark.parametrize("kind", ["csr", "coo", "torch_coo"])
@pytest.mark.parametrize("layer_kind", ["gcn", "sage"])
@pytest.mark.parametrize("cached", [False, True])
def test_learned_edge_weights_get_gradients(kind, layer_kind, cached):
    """Edge weights that require grad (a SparseTensor of them, or a torch.sparse one) stay in the
    graph through the normalisation (they were detached: no gradient); oracle: the dense formula."""
    w0 = graph_weights()
    make = (lambda: GCNConv(5, 3, cached=cached)) if layer_kind == "gcn" else (lambda: SAGEConv(5, 3))
    layer = randomize(make().double())
    oracle = gcn_oracle if layer_kind == "gcn" else sage_oracle
    x = feats()
    for _ in range(2):   # a second forward: a cached layer must not reuse the first graph
        w = w0.clone().requires_grad_()
        if kind == "torch_coo":
            adj = dense_adj(w).to_sparse_coo()
        else:   # A[i, j] = weight of edge j -> i
            adj = scorch.from_coo(torch.stack([EDGE_INDEX[1], EDGE_INDEX[0]]), w, (N, N), format=kind)
        layer(x, adj).pow(2).sum().backward()
        wd = w0.clone().requires_grad_()
        oracle(layer, x, dense_adj(wd)).pow(2).sum().backward()
        torch.testing.assert_close(w.grad, wd.grad)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("out", [2, 8])  # narrower (aggregate after lin_l) and wider than the input
def test_sage_matches_dense(kind, out):
    layer = randomize(SAGEConv(5, out).double())
    x = feats()
    torch.testing.assert_close(layer(x, adj_input(kind)), sage_oracle(layer, x, dense_adj()))


def test_sage_weighted_mean():
    w = graph_weights(3)
    layer = randomize(SAGEConv(5, 4).double())
    x = feats()
    torch.testing.assert_close(layer(x, adj_input("csr", w)), sage_oracle(layer, x, dense_adj(w)))


@pytest.mark.parametrize("name", ["gcn", "sage", "gat"])
def test_stored_zeros_and_block_padding_are_no_edges(name):
    """An adjacency's edges are its nonzero entries, whatever its format: a BSR block's padding and
    explicitly stored zeros (node 0's self-loop, row 6's only entries) change nothing; oracle: the
    dense formulas on the dense adjacency."""
    make, oracle = {"gcn": (lambda: GCNConv(5, 3), gcn_oracle), "sage": (lambda: SAGEConv(5, 3), sage_oracle),
                    "gat": (lambda: GATConv(5, 3, heads=2), gat_oracle)}[name]
    layer, x, A = randomize(make().double()), feats(), dense_adj(graph_weights(4))
    want = oracle(layer, x, A)
    coords = torch.cat([A.nonzero().t(), torch.tensor([[0, 6, 6], [0, 1, 6]])], 1)
    with_zeros = scorch.from_coo(coords, torch.cat([A[tuple(A.nonzero().t())], torch.zeros(3, dtype=A.dtype)]),
                                 (N, N), format="csr")
    for adj in (scorch.as_sparse(A, scorch.formats.bsr(1, N)), with_zeros, A.to_sparse_bsr((1, N))):
        assert adj.values().eq(0).any()
        torch.testing.assert_close(layer(x, adj), want)


def test_sage_row_whose_weights_sum_to_zero_averages_nothing():
    """A node whose neighbours' weights sum to 0 has no weighted mean: its aggregate is 0, as a node
    without neighbours (it was NaN); oracle: the root term alone."""
    A = torch.zeros(N, N, dtype=torch.float64)
    A[0, 1], A[0, 2], A[3, 4] = 1.0, -1.0, 2.0
    layer, x = randomize(SAGEConv(5, 3).double()), feats()
    out = layer(x, scorch.as_sparse(A, "csr"))
    torch.testing.assert_close(out[0], layer.lin_l(torch.zeros(5, dtype=x.dtype)) + layer.lin_r(x[0]))
    torch.testing.assert_close(out[3], layer.lin_l(x[4]) + layer.lin_r(x[3]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("heads,concat", [(1, True), (1, False), (3, True), (2, False)])
def test_gat_matches_dense(kind, heads, concat):
    layer = randomize(GATConv(5, 4, heads=heads, concat=concat).double())
    x = feats()
    got = layer(x, adj_input(kind))
    assert got.shape == (N, 4 * heads if concat else 4)
    torch.testing.assert_close(got, gat_oracle(layer, x, dense_adj()))


def test_gat_runs_every_head_in_one_softmax_and_one_spmm(monkeypatch):
    """Inference: the heads share one softmax kernel call and one generated SpMM over a CSR
    pattern holding a vector of one score per head at each entry, rows outermost."""
    from scorch.compiler import driver, segments
    calls = {"softmax": 0, "einsum": []}
    monkeypatch.setattr(segments, "softmax", lambda *a, f=segments.softmax: calls.__setitem__(
        "softmax", calls["softmax"] + 1) or f(*a))
    run = driver.run
    monkeypatch.setattr(driver, "run", lambda key, eq, *a, **k: calls["einsum"].append(eq) or run(key, eq, *a, **k))
    layer = randomize(GATConv(5, 4, heads=3).double())
    x = feats()
    with torch.no_grad():
        got = layer(x, adj_input("csr"))
    assert calls == {"softmax": 1, "einsum": ["ijh,jhk->ihk"]}
    torch.testing.assert_close(got, gat_oracle(layer, x, dense_adj()))


def test_gat_without_self_loops_ignores_weights():
    layer = randomize(GATConv(5, 3, heads=2, add_self_loops=False, negative_slope=0.1).double())
    x = feats()
    got = layer(x, adj_input("csr", graph_weights()))  # only the pattern counts
    torch.testing.assert_close(got, gat_oracle(layer, x, dense_adj()))


@pytest.mark.parametrize("make,oracle", [
    (lambda: GCNConv(5, 3), lambda l, x, A: gcn_oracle(l, x, A)),
    (lambda: SAGEConv(5, 3), sage_oracle),
    (lambda: GATConv(5, 3, heads=2), gat_oracle),
], ids=["gcn", "sage", "gat"])
def test_float32(make, oracle):
    layer = randomize(make())
    x = feats(dtype=torch.float32)
    got = layer(x, adj_input("csr", dtype=torch.float32))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, oracle(layer, x, dense_adj(dtype=torch.float32)))
    torch.testing.assert_close(layer(x, EDGE_INDEX), got)


@pytest.mark.parametrize("make,oracle", [
    (lambda: GCNConv(5, 8), lambda l, x, A: gcn_oracle(l, x, A)),
    (lambda: SAGEConv(12, 8), sage_oracle),        # narrower: one product for both weights
    (lambda: SAGEConv(5, 8), sage_oracle),         # wider: the root term's product
    (lambda: GATConv(5, 4, heads=2), gat_oracle),
], ids=["gcn", "sage-narrow", "sage-wide", "gat"])
def test_generated_dense_products(monkeypatch, make, oracle):
    """Linear maps of whole vectors (8 float64 lanes) forced onto the generated dense kernel
    (scorch.config.dense_kernels), forward and gradients, against the dense oracles."""
    from scorch.compiler import driver
    monkeypatch.setattr(scorch.config, "dense_kernels", "compiled")
    calls = []
    compiled = driver.compiled
    monkeypatch.setattr(driver, "compiled", lambda *a: calls.append(a[0]) or compiled(*a))
    layer = randomize(make().double())
    x = feats(cols=layer.in_channels, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, adj_input("csr")), oracle(layer, x, dense_adj()))
    assert calls == ["ij,jk->ik"]
    gradcheck_layer_with(layer, adj_input("csr"), feats(cols=layer.in_channels, seed=5))


# ---------------------------------------------------------------- gradients

def gradcheck_layer(layer, adj):
    gradcheck_layer_with(layer, adj, feats())


def gradcheck_layer_with(layer, adj, x):
    names = [n for n, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in layer.named_parameters())
    x = x.detach().clone().requires_grad_()

    def f(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x, adj))
    # fast mode: a random projection of the Jacobian (one backward, a few forwards)
    assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)


@pytest.mark.parametrize("kind", ["csr", "edge_index"])
@pytest.mark.parametrize("make", [lambda: GCNConv(5, 2), lambda: SAGEConv(5, 2),
                                  lambda: GATConv(5, 2, heads=2), lambda: GATConv(5, 2, heads=2, concat=False)],
                         ids=["gcn", "sage", "gat", "gat-mean"])
def test_gradcheck(make, kind):
    gradcheck_layer(randomize(make().double()), adj_input(kind))


def test_sparse_linear_gradcheck():
    layer = randomize(SparseLinear(5, 4, sparsity=0.5, dtype=torch.float64))
    W = layer.weight.detach()
    v = W.values().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    x = feats().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, v, b: F.linear(x, W.with_values(v), b), (x, v, b))
    # and the layer's own parameters receive the same gradient as the dense masked oracle
    layer(x.detach()).pow(2).sum().backward()
    Wd = W.to_dense().requires_grad_()
    F.linear(x.detach(), Wd, layer.bias.detach()).pow(2).sum().backward()
    torch.testing.assert_close(layer.weight.grad.to_dense(), Wd.grad * (W.to_dense() != 0))


# ---------------------------------------------------------------- SparseLinear

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_sparse_linear_matches_masked_dense(dtype, fmt):
    torch.manual_seed(0)
    dense = torch.nn.Linear(12, 6).to(dtype)
    layer = SparseLinear.from_dense(dense, sparsity=0.75, format=fmt)
    W = dense.weight.detach()
    keep = W.abs() >= W.abs().flatten().topk(18).values.min()   # the largest 25 %
    assert layer.weight.nnz == 18 and layer.weight.format == scorch.as_sparse(W, fmt).format
    torch.testing.assert_close(layer.weight.to_dense(), W * keep)
    x = torch.randn(3, 4, 12, dtype=dtype)
    torch.testing.assert_close(layer(x), F.linear(x, W * keep, dense.bias.detach()))
    assert f"format={fmt}" in repr(layer) and "sparsity=0.750" in repr(layer)


def test_sparse_linear_mask_and_random_pattern():
    torch.manual_seed(0)
    dense = torch.nn.Linear(4, 3)
    mask = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    layer = SparseLinear.from_dense(dense, mask=mask)
    torch.testing.assert_close(layer.weight.to_dense(), dense.weight.detach() * mask)
    assert layer.weight.nnz == 6
    fresh = SparseLinear(20, 10, sparsity=0.9, bias=False)
    assert fresh.weight.nnz == 20 and fresh.bias is None
    assert fresh.weight.values().abs().max() <= 20 ** -0.5 and fresh.weight.values().abs().min() > 0


@pytest.mark.parametrize("opt", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                 lambda p: torch.optim.Adam(p, lr=0.05)], ids=["SGD", "Adam"])
def test_sparse_linear_trains_and_keeps_its_pattern(opt):
    torch.manual_seed(0)
    layer = SparseLinear(10, 4, sparsity=0.6)
    mask = layer.weight.detach().to_dense() != 0
    x = torch.randn(32, 10)
    target = F.linear(x, torch.randn(4, 10) * mask, torch.randn(4))  # reachable with this pattern
    crd, o = layer.weight.crd(1).clone(), opt(layer.parameters())
    losses = []
    for _ in range(30):
        o.zero_grad()
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        o.step()
        losses.append(loss.item())
    assert isinstance(layer.weight, scorch.SparseTensor) and torch.equal(layer.weight.crd(1), crd)
    assert layer.weight.nnz == 16
    assert losses[-1] < 0.3 * losses[0], losses


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("call,match", [
    (lambda: GCNConv(5, 3)(torch.randn(N, 4), EDGE_INDEX), r"x must have shape .*\(N, 5\), got \(7, 4\)"),
    (lambda: SAGEConv(5, 3)(torch.randn(N, 5), scorch.as_sparse(torch.eye(6), "csr")),
     r"adj must have shape .* = \(7, 7\) .* got \(6, 6\)"),
    (lambda: GATConv(5, 3)(torch.randn(N, 5), EDGE_INDEX[:, :3].t()), r"edge_index must have shape \(2, E\), got"),
    (lambda: GCNConv(5, 3)(torch.randn(3, 5), EDGE_INDEX), r"GCNConv: edge_index entries must lie in \[0, num_nodes\) = \[0, 3\), got \[0, 6\]"),
    (lambda: GCNConv(0, 3), "in_channels must be a positive int, got 0"),
    (lambda: GATConv(5, 3, heads=0), "heads must be a positive int, got 0"),
    (lambda: SparseLinear(5, 3)(torch.randn(2, 4)), r"shape \(\.\.\., in_features\) = \(\.\.\., 5\), got \(2, 4\)"),
    (lambda: SparseLinear(5, 3, sparsity=1.0), r"sparsity must be a float in \[0, 1\), got 1.0"),
    (lambda: SparseLinear.from_dense(torch.nn.Linear(5, 3), mask=torch.ones(5, 3)),
     r"mask must have shape .* = \(3, 5\), got \(5, 3\)"),
])
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_type_errors():
    with pytest.raises(TypeError, match="must be an integer tensor"):
        GCNConv(5, 3)(torch.randn(N, 5), torch.randn(N, N))
    with pytest.raises(TypeError, match="must be a torch.nn.Linear"):
        SparseLinear.from_dense(GCNConv(5, 3))
    with pytest.raises(TypeError, match="x must be a dense torch.Tensor or a sparse tensor, got list"):
        GATConv(5, 3)([[1.0] * 5] * N, EDGE_INDEX)
    with pytest.raises(ValueError, match=r"x must have shape .*\(N, 5\), got \(7, 4\)"):
        GCNConv(5, 3)(scorch.as_sparse(torch.randn(N, 4), "csr"), EDGE_INDEX)


# ---------------------------------------------------------------- caching

@pytest.mark.parametrize("make", [lambda: GCNConv(5, 3, cached=True), lambda: SAGEConv(5, 3, cached=True),
                                  lambda: GATConv(5, 3, cached=True)], ids=["gcn", "sage", "gat"])
def test_cache_per_input_object(make):
    layer = randomize(make().double())
    x = feats()
    first = layer(x, EDGE_INDEX)
    (entry,) = layer._cache._store.values()
    torch.testing.assert_close(layer(x, EDGE_INDEX), first)
    assert next(iter(layer._cache._store.values()))[1] is entry[1]  # reused, not rebuilt
    other = EDGE_INDEX[:, :6].clone()                               # another graph: its own entry
    A_other = torch.zeros(N, N, dtype=torch.float64).index_put_((other[1], other[0]), torch.ones(6, dtype=torch.float64))
    oracle = {GCNConv: gcn_oracle, SAGEConv: sage_oracle, GATConv: gat_oracle}[type(layer)]
    torch.testing.assert_close(layer(x, other), oracle(layer, x, A_other))
    assert len(layer._cache._store) == 2
    buf = io.BytesIO()   # a cached layer pickles (the cache, holding weak references, is left out)
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert not loaded._cache._store
    torch.testing.assert_close(loaded(x, other), oracle(layer, x, A_other))
    layer.reset_parameters()
    assert not layer._cache._store


# ---------------------------------------------------------------- training on Cora

def cora():
    g = load_graph("cora")
    e = g.extras
    X = torch.sparse_csr_tensor(torch.from_numpy(e["x_indptr"]).long(), torch.from_numpy(e["x_indices"]).long(),
                                torch.from_numpy(e["x_data"]).float(), tuple(int(s) for s in e["x_shape"]),
                                check_invariants=True).to_dense()
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    return g, X, torch.from_numpy(np.asarray(e["y"])).long()


class TwoLayer(torch.nn.Module):
    def __init__(self, conv1, conv2):
        super().__init__()
        self.conv1, self.conv2 = conv1, conv2

    def forward(self, x, adj):
        h = F.dropout(F.elu(self.conv1(x, adj)), 0.5, self.training)
        return self.conv2(h, adj)


@pytest.mark.parametrize("make", [
    lambda d, c: TwoLayer(GCNConv(d, 16, cached=True), GCNConv(16, c, cached=True)),
    lambda d, c: TwoLayer(SAGEConv(d, 16, cached=True), SAGEConv(16, c, cached=True)),
    lambda d, c: TwoLayer(GATConv(d, 8, heads=2, cached=True), GATConv(16, c, cached=True)),
], ids=["gcn", "sage", "gat"])
def test_two_layer_model_trains_on_cora(make):
    g, X, y = cora()
    A = g.adjacency("csr")
    train = torch.randperm(g.num_nodes, generator=torch.Generator().manual_seed(0))[:700]
    torch.manual_seed(0)
    model = make(X.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.02, weight_decay=5e-4)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(X, A)[train], y[train])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"{type(model.conv1).__name__} on Cora: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.8 * losses[0], losses
    assert min(losses[-5:]) < min(losses[:5])


# ---------------------------------------------------------------- PyG, when installed

@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GATConv"])
def test_matches_pyg(name):
    pyg = pytest.importorskip("torch_geometric.nn")
    ours = randomize({"GCNConv": lambda: GCNConv(5, 3), "SAGEConv": lambda: SAGEConv(5, 3),
                      "GATConv": lambda: GATConv(5, 3, heads=2)}[name]().double())
    kw = {"heads": 2} if name == "GATConv" else {}
    theirs = getattr(pyg, name)(5, 3, **kw).double()
    theirs.load_state_dict(ours.state_dict(), strict=False)
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(theirs.state_dict()[k], v)
    x = feats()
    ei = EDGE_INDEX[:, EDGE_INDEX[0] != EDGE_INDEX[1]]  # no existing self-loop: no loop-weight conventions to differ on
    torch.testing.assert_close(ours(x, ei), theirs(x, ei))



def test_sparse_linear_output_layout_as_documented():
    """SparseLinear's result for a 2-d batch is the transposed view of ``W @ x^T`` (feature dim
    outermost, as the docstring says), for a 3-d batch contiguous (``.view`` merging dims works,
    as after nn.Linear); both equal to nn.Linear's."""
    from scorch.nn import SparseLinear
    lin = torch.nn.Linear(16, 12)
    layer = SparseLinear.from_dense(lin, mask=torch.rand(12, 16, generator=torch.Generator().manual_seed(0)) < 0.5)
    x = torch.randn(4, 3, 16)
    want = torch.nn.functional.linear(x, layer.weight.to_dense(), layer.bias)
    with torch.no_grad():
        got = layer(x)
    torch.testing.assert_close(got, want)
    assert got.is_contiguous()
    torch.testing.assert_close(got.view(4, 36), want.reshape(4, 36))
    with torch.no_grad():
        flat = layer(x[0])
    assert flat.stride() == (1, 3)  # 3 batch rows: the feature dim steps over all of them
    torch.testing.assert_close(flat, want[0])


@pytest.mark.parametrize("heads", [1, 2])
def test_gat_duplicate_edges_and_loops_are_one_entry(heads):
    """An edge_index listing edges twice (and the self-loop (2, 2) twice) gives the pattern of
    the distinct edges: the dense oracle on the deduplicated adjacency."""
    layer = randomize(GATConv(5, 3, heads=heads).double())
    x = feats()
    doubled = torch.cat([EDGE_INDEX, EDGE_INDEX[:, ::2]], 1)
    torch.testing.assert_close(layer(x, doubled), gat_oracle(layer, x, dense_adj()))


@pytest.mark.parametrize("make", [lambda: GCNConv(5, 3), lambda: SAGEConv(5, 3), lambda: SAGEConv(5, 8),
                                  lambda: GATConv(5, 4, heads=2)], ids=["GCN", "SAGE narrow", "SAGE wide", "GAT"])
def test_sparse_features_give_the_dense_features_result_and_gradients(make):
    """x as a SparseTensor (bag-of-words features: the first product runs as an SpMM) gives what
    the dense x gives, forward and parameter gradients (oracle: the same layer on dense x)."""
    x = feats() * (torch.rand(N, 5, generator=torch.Generator().manual_seed(5)) < 0.4)
    layer = randomize(make().double())
    A = adj_input("csr")
    out_d = layer(x, A)
    grads_d = torch.autograd.grad(out_d.pow(2).sum(), list(layer.parameters()))
    for xs in (scorch.as_sparse(x, "csr"), x.to_sparse_csr(), x.to_sparse()):   # scorch's, torch's CSR and COO
        out_s = layer(xs, A)
        grads_s = torch.autograd.grad(out_s.pow(2).sum(), list(layer.parameters()))
        torch.testing.assert_close(out_s, out_d)
        for gs, gd in zip(grads_s, grads_d):
            torch.testing.assert_close(gs, gd)


@pytest.mark.parametrize("make", [lambda: GCNConv(5, 3, cached=True), lambda: SAGEConv(5, 3)])
def test_a_cached_layer_never_keeps_learned_edge_weights(make):
    """Edge weights that require grad change between calls (an optimizer step): a cached layer
    rebuilds the adjacency for them under no_grad too (an eval after training read stale weights)."""
    layer = randomize(make().double())
    x = feats()
    w = torch.nn.Parameter(scorch.from_coo(torch.stack([EDGE_INDEX[1], EDGE_INDEX[0]]), graph_weights(), (N, N),
                                           format="csr"))
    with torch.no_grad():
        before = layer(x, w)
        w.mul_(3.0)
        after = layer(x, w)
    oracle = gcn_oracle if isinstance(layer, GCNConv) else sage_oracle
    torch.testing.assert_close(after, oracle(layer, x, dense_adj(3.0 * graph_weights())))
    assert isinstance(layer, SAGEConv) or not torch.allclose(before, after)


def test_sage_learned_weights_summing_to_zero_keep_finite_gradients():
    """The mean over weights summing to 0 is 0 and its gradient finite (1 / deg masked afterwards
    sent 0 * inf = NaN back into the weights); oracle: finite, and the dense formula elsewhere."""
    A = torch.zeros(N, N, dtype=torch.float64)
    A[0, 1], A[0, 2], A[3, 4] = 1.0, -1.0, 2.0
    S = scorch.as_sparse(A, "csr")
    v = S.values().clone().requires_grad_()
    layer, x = randomize(SAGEConv(5, 3).double()), feats()
    layer(x, S.with_values(v)).pow(2).sum().backward()
    assert torch.isfinite(v.grad).all()
