"""scorch.datasets: SNAP / Matrix Market readers and the synthetic generators."""

import gzip

import pytest
import torch

import scorch
from scorch import datasets
from scorch.datasets import (
    attention_mask,
    graph_like,
    load_graph,
    load_matrix_market,
    load_snap,
    multi_hot,
    power_law_graph,
    pruned_weight,
    save_matrix_market,
)
from scorch.errors import ScorchValueError


def edges(g):
    return sorted(map(tuple, g.edge_index.T.tolist()))


def assert_symmetric_simple(g):
    """Both directions stored, no self-loops, no duplicates (checked on edge keys, no dense n x n)."""
    r, c = g.edge_index
    n = g.num_nodes
    key = torch.sort(r * n + c).values
    assert torch.equal(key, torch.sort(c * n + r).values)
    assert torch.unique(key).numel() == key.numel() and bool((r != c).all())


def write(path, text, gz=False):
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


# ------------------------------------------------------------------ SNAP
SNAP = """# Directed graph (each unordered pair of nodes is saved once): toy.txt
# FromNodeId\tToNodeId
10\t30
30\t10
10\t10
7 30
7\t30
# a comment in the middle
100\t7
"""
# ids 7, 10, 30, 100 -> 0, 1, 2, 3; edges 1->2, 2->1, (self-loop dropped), 0->2 (dup), 3->0


@pytest.mark.parametrize("gz", [False, True])
def test_snap_undirected(tmp_path, gz):
    p = write(tmp_path / ("toy.txt.gz" if gz else "toy.txt"), SNAP, gz)
    g = load_snap(p)
    assert g.num_nodes == 4 and g.name == "toy"
    assert g.extras["node_ids"].tolist() == [7, 10, 30, 100]
    assert edges(g) == [(0, 2), (0, 3), (1, 2), (2, 0), (2, 1), (3, 0)]
    assert g.edge_index.dtype == torch.int64
    A = g.adjacency().to_dense()
    assert torch.equal(A, A.T) and A.diagonal().sum() == 0


def test_snap_directed_num_nodes(tmp_path):
    p = write(tmp_path / "toy.txt", SNAP)
    g = load_snap(p, directed=True, num_nodes=6)
    assert g.num_nodes == 6
    assert edges(g) == [(0, 2), (1, 2), (2, 1), (3, 0)]
    assert g.adjacency().shape == (6, 6)
    with pytest.raises(ScorchValueError, match="num_nodes.*4 distinct"):
        load_snap(p, num_nodes=3)


def test_snap_extra_columns_and_errors(tmp_path):
    g = load_snap(write(tmp_path / "w.txt", "# w\n1 2 0.5\n2 3 0.25\n"), directed=True)
    assert edges(g) == [(0, 1), (1, 2)]
    with pytest.raises(ScorchValueError, match="bad.txt.*not a SNAP edge list"):
        load_snap(write(tmp_path / "bad.txt", "1 x\n"))
    with pytest.raises(ScorchValueError, match="no file"):
        load_snap(tmp_path / "missing.txt")
    g = load_snap(write(tmp_path / "empty.txt", "# nothing\n"))
    assert g.num_nodes == 0 and g.edge_index.shape == (2, 0)


# ------------------------------------------------------------------ Matrix Market
MM_CASES = {
    "general_real": ("%%MatrixMarket matrix coordinate real general\n% comment\n3 4 3\n1 1 1.5\n3 4 -2\n2 1 0.25\n",
                     [[1.5, 0, 0, 0], [0.25, 0, 0, 0], [0, 0, 0, -2]], torch.float64),
    "symmetric_real": ("%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n1 1 2.0\n3 1 5.0\n2 2 -1\n",
                       [[2, 0, 5], [0, -1, 0], [5, 0, 0]], torch.float64),
    "pattern_symmetric": ("%%MatrixMarket matrix coordinate pattern symmetric\n3 3 2\n2 1\n3 3\n",
                          [[0, 1, 0], [1, 0, 0], [0, 0, 1]], torch.float64),
    "integer_general": ("%%MatrixMarket matrix coordinate integer general\n2 3 2\n1 3 7\n2 2 -4\n",
                        [[0, 0, 7], [0, -4, 0]], torch.int64),
    "skew": ("%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 3\n",
             [[0, -3], [3, 0]], torch.float64),
}


@pytest.fixture(params=["scipy", "own"])
def mm_backend(request, monkeypatch):
    if request.param == "own":
        monkeypatch.setattr(datasets, "_scipy_mmread", lambda: None)
    else:
        pytest.importorskip("scipy")
    return request.param


@pytest.mark.parametrize("case", sorted(MM_CASES))
def test_matrix_market_read(tmp_path, mm_backend, case):
    text, dense, dtype = MM_CASES[case]
    A = load_matrix_market(write(tmp_path / f"{case}.mtx", text))
    assert isinstance(A, scorch.SparseTensor) and str(A.format) == "csr"
    assert A.dtype == dtype
    assert torch.equal(A.to_dense(), torch.tensor(dense, dtype=dtype))
    B = load_matrix_market(write(tmp_path / f"{case}.mtx.gz", text, gz=True), format="coo", dtype=torch.float32)
    assert str(B.format) == "coo" and B.dtype == torch.float32
    assert torch.equal(B.to_dense(), torch.tensor(dense, dtype=torch.float32))


def test_matrix_market_symmetric_diagonal_not_doubled(tmp_path, mm_backend):
    A = load_matrix_market(write(tmp_path / "s.mtx", MM_CASES["symmetric_real"][0]))
    assert A.nnz == 4  # 2 diagonal + 1 off-diagonal pair


def test_matrix_market_errors(tmp_path, mm_backend):
    with pytest.raises(ScorchValueError, match="arr.mtx.*'coordinate'.*'array'"):
        load_matrix_market(write(tmp_path / "arr.mtx", "%%MatrixMarket matrix array real general\n1 1\n1\n"))
    with pytest.raises(ScorchValueError, match="field must be one of.*'complex'"):
        load_matrix_market(write(tmp_path / "c.mtx", "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n"))
    with pytest.raises(ScorchValueError, match="banner"):
        load_matrix_market(write(tmp_path / "x.mtx", "1 1 1\n1 1 1\n"))
    with pytest.raises(ScorchValueError, match="no file"):
        load_matrix_market(tmp_path / "nope.mtx")
    with pytest.raises(ScorchValueError, match="o.mtx"):
        load_matrix_market(write(tmp_path / "o.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1\n"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("gz", [False, True])
def test_matrix_market_round_trip(tmp_path, mm_backend, dtype, gz):
    g = torch.Generator().manual_seed(3)
    D = torch.randn(7, 5, generator=g, dtype=torch.float64) * (torch.rand(7, 5, generator=g) < 0.4)
    D = D.to(dtype) if dtype != torch.int64 else (D * 10).round().to(dtype)
    path = tmp_path / ("a.mtx.gz" if gz else "a.mtx")
    save_matrix_market(scorch.as_sparse(D, "csr"), path, comment="test\nmatrix")
    back = load_matrix_market(path, dtype=dtype)
    assert back.shape == (7, 5)
    assert torch.equal(back.to_dense(), D)  # exact: 17 significant digits
    save_matrix_market(D, tmp_path / "dense.mtx")  # a dense tensor: its nonzeros
    assert torch.equal(load_matrix_market(tmp_path / "dense.mtx", dtype=dtype).to_dense(), D)


def test_save_matrix_market_errors(tmp_path):
    with pytest.raises(ScorchValueError, match="2-d"):
        save_matrix_market(scorch.as_sparse(torch.ones(2, 2, 2), "csf"), tmp_path / "x.mtx")
    with pytest.raises(ScorchValueError, match="tensor"):
        save_matrix_market([[1, 2]], tmp_path / "x.mtx")


# ------------------------------------------------------------------ graphs
def test_power_law_graph_exact_counts_and_determinism():
    g = power_law_graph(1000, 5000, seed=1)
    ei = g.edge_index
    assert g.num_nodes == 1000 and ei.shape == (2, 5000)
    assert int(ei.max()) < 1000 and int(ei.min()) >= 0
    assert bool((ei[0] != ei[1]).all())
    assert torch.unique(ei[0] * 1000 + ei[1]).numel() == 5000
    assert torch.equal(ei, power_law_graph(1000, 5000, seed=1).edge_index)
    assert not torch.equal(ei, power_law_graph(1000, 5000, seed=2).edge_index)
    deg = torch.bincount(ei[0], minlength=1000).float()
    assert deg.max() > 5 * deg.mean()  # skewed, unlike a uniform graph


def test_power_law_graph_symmetric_and_errors():
    g = power_law_graph(300, 2000, seed=0, symmetric=True)
    A = g.adjacency().to_dense()
    assert g.edge_index.shape == (2, 2000) and torch.equal(A, A.T) and A.sum() == 2000
    assert A.diagonal().sum() == 0
    with pytest.raises(ScorchValueError, match="even"):
        power_law_graph(10, 7, symmetric=True)
    with pytest.raises(ScorchValueError, match="at most 90"):
        power_law_graph(10, 91)
    with pytest.raises(ScorchValueError, match="num_nodes"):
        power_law_graph(0, 1)
    assert power_law_graph(5, 0).edge_index.shape == (2, 0)


@pytest.mark.parametrize("name, n, m", [("cora", 2708, 10556), ("pubmed", 19717, 88648)])
def test_graph_like(name, n, m):
    g = graph_like(name)
    assert g.num_nodes == n and g.edge_index.shape == (2, m)
    assert_symmetric_simple(g)
    assert g.adjacency().nnz == m
    assert torch.equal(g.edge_index, graph_like(name).edge_index)


def test_graph_like_ogbn_arxiv_directed():
    g = graph_like("ogbn-arxiv")  # ~2 s
    ei = g.edge_index
    assert g.num_nodes == 169_343 and ei.shape == (2, 1_166_243)
    assert int(ei.max()) < 169_343 and bool((ei[0] != ei[1]).all())
    assert torch.unique(ei[0] * g.num_nodes + ei[1]).numel() == ei.shape[1]


def test_graph_like_sizes_table_and_errors():
    assert datasets.GRAPH_SIZES["ogbn-arxiv"] == (169_343, 1_166_243, False)
    assert datasets.GRAPH_SIZES["reddit-like"][:2] == (232_965, 2_000_000)
    with pytest.raises(ScorchValueError, match="graph_like: name must be one of.*'nope'"):
        graph_like("nope")


def test_pubmed_real_sizes(data_dir):
    if not (data_dir / "pubmed.npz").exists():
        pytest.skip("pubmed.npz absent")
    g = load_graph("pubmed", data_dir)
    assert g.num_nodes == 19_717 and g.edge_index.shape == (2, 88_648)
    assert_symmetric_simple(g)


# ------------------------------------------------------------------ attention masks
@pytest.mark.parametrize("L, w", [(1, 3), (10, 1), (17, 4), (17, 5), (40, 100)])
def test_window_mask_matches_dense_oracle(L, w):
    M = attention_mask(L, "window", window=w)
    i = torch.arange(L)
    oracle = (i[:, None] - i[None, :]).abs() <= w // 2
    assert M.shape == (L, L) and str(M.format) == "csr" and M.dtype == torch.float32
    assert torch.equal(M.to_dense(), oracle.float())
    assert M.nnz == int(oracle.sum())
    assert torch.equal(attention_mask(L, window=w, dtype=torch.bool).to_dense(), oracle)


def test_bigbird_mask():
    L, b, w = 100, 8, 5
    M = attention_mask(L, "bigbird", window=w, global_tokens=3, random_blocks=2, block=b, seed=4).to_dense() > 0
    i = torch.arange(L)
    win = (i[:, None] - i[None, :]).abs() <= w // 2
    assert bool(M[win].all())                         # contains the window
    assert bool(M[:3].all()) and bool(M[:, :3].all())  # global rows and columns
    rest = M & ~win
    rest[:3] = False
    rest[:, :3] = False
    nb = -(-L // b)
    blocks = torch.zeros(nb * b, nb * b, dtype=torch.bool)
    blocks[:L, :L] = rest
    per_block = blocks.reshape(nb, b, nb, b).any(3).any(1)  # block pairs touched outside window/global
    assert int(per_block.sum(1).max()) <= 2
    M2 = attention_mask(L, "bigbird", window=w, global_tokens=3, random_blocks=2, block=b, seed=4)
    assert torch.equal(M2.to_dense(), M.float())
    assert not torch.equal(attention_mask(L, "bigbird", window=w, random_blocks=2, block=b, seed=5).to_dense(),
                           attention_mask(L, "bigbird", window=w, random_blocks=2, block=b, seed=4).to_dense())
    full = attention_mask(L, "bigbird", window=0, global_tokens=0, random_blocks=nb, block=b).to_dense()
    assert bool((full == 1).all())  # every block chosen: dense


def test_attention_mask_errors():
    with pytest.raises(ScorchValueError, match="kind must be"):
        attention_mask(8, "longformer")
    with pytest.raises(ScorchValueError, match="window must be an int >= 0, got -1"):
        attention_mask(8, window=-1)
    with pytest.raises(ScorchValueError, match="seq_len"):
        attention_mask(0)


# ------------------------------------------------------------------ multi-hot, pruned weights
@pytest.mark.parametrize("power_law", [True, False])
def test_multi_hot(power_law):
    X = multi_hot(500, 200, 7, seed=3, power_law=power_law)
    D = X.to_dense()
    assert X.shape == (500, 200) and str(X.format) == "csr" and X.nnz == 3500
    assert bool((D.sum(1) == 7).all()) and set(D.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(D, multi_hot(500, 200, 7, seed=3, power_law=power_law).to_dense())
    assert not torch.equal(D, multi_hot(500, 200, 7, seed=4, power_law=power_law).to_dense())
    counts = D.sum(0)
    if power_law:
        assert counts[:10].sum() > 3 * counts[-10:].sum()  # head features much more popular
    else:
        assert counts.max() < 4 * counts.mean()


def test_multi_hot_edge_cases():
    assert multi_hot(4, 5, 5).to_dense().eq(1).all()
    assert multi_hot(3, 5, 0).nnz == 0
    with pytest.raises(ScorchValueError, match="nnz_per_row must be <= num_features \\(5\\), got 6"):
        multi_hot(3, 5, 6)


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 0.97, 1.0])
def test_pruned_weight_keeps_largest(sparsity):
    o, i = 33, 20
    W = pruned_weight(o, i, sparsity, seed=2)
    keep = round((1 - sparsity) * o * i)
    assert W.shape == (o, i) and str(W.format) == "csr" and W.nnz == keep
    # dense oracle: the same seeded weight, top-k by magnitude
    g = torch.Generator().manual_seed(2)
    dense = (torch.randn(o, i, generator=g, dtype=torch.float64) / i ** 0.5).float()
    top = torch.topk(dense.abs().reshape(-1), keep).indices
    oracle = torch.zeros(o * i)
    oracle[top] = dense.reshape(-1)[top]
    assert torch.equal(W.to_dense(), oracle.reshape(o, i))
    Wd = W.to_dense()
    if 0 < keep < o * i:
        assert Wd[Wd != 0].abs().min() >= dense[Wd == 0].abs().max()
    assert torch.equal(Wd, pruned_weight(o, i, sparsity, seed=2).to_dense())


def test_pruned_weight_errors():
    with pytest.raises(ScorchValueError, match="sparsity must be a number in \\[0, 1\\], got 1.5"):
        pruned_weight(4, 4, 1.5)
    with pytest.raises(ScorchValueError, match="in_features"):
        pruned_weight(4, 0, 0.5)


def test_graph_features_and_labels():
    """Cora's stored bag-of-words as CSR, against a dense matrix filled from the raw arrays."""
    import numpy as np
    g = load_graph("cora")
    X = g.features()
    indptr, indices, data, shape = (np.asarray(g.extras[k]) for k in ("x_indptr", "x_indices", "x_data", "x_shape"))
    want = torch.zeros(tuple(int(v) for v in shape))
    for r in range(0, int(shape[0]), 97):   # every 97th row
        want[r, torch.from_numpy(indices[indptr[r]:indptr[r + 1]].astype(np.int64))] = \
            torch.from_numpy(data[indptr[r]:indptr[r + 1]]).float()
    assert isinstance(X, scorch.SparseTensor) and X.format == scorch.formats.csr
    assert X.shape == (2708, 1433) and X.dtype == torch.float32 and X.nnz == len(data)
    torch.testing.assert_close(X.to_dense()[::97], want[::97])
    assert g.features(torch.float64).dtype == torch.float64
    y = g.labels()
    assert y.dtype == torch.int64 and y.shape == (2708,) and torch.equal(y, torch.from_numpy(g.extras["y"]).long())
    bare = power_law_graph(50, 200)
    assert bare.features() is None and bare.labels() is None
