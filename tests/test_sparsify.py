"""scorch.sparsify: sparsifiers against masks computed independently on dense tensors, and
SparsityBuilder on models against the same dense models with masked weights."""

import pytest
import torch
from torch import nn

import scorch
from scorch.compiler import build
from scorch.sparsify import (BlockFractionSparsifier, KeepAll, PerBlockNMSparsifier, RandomFractionSparsifier,
                             ScalarFractionSparsifier, ScalarThresholdSparsifier, SparsityBuilder)


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_each_sparsifier_keeps_what_its_rule_says():
    w = rnd(8, 12)
    w[0, :3] = 0
    mags = w.abs().reshape(-1)
    # magnitude: the kept entries are the 24 largest |w|
    keep = ScalarFractionSparsifier(0.75).mask(w)
    assert int(keep.sum()) == 24 and mags[keep.reshape(-1)].min() >= mags[~keep.reshape(-1)].max()
    keep = ScalarThresholdSparsifier(0.5).mask(w)
    assert torch.equal(keep, w.abs() >= 0.5)
    assert torch.equal(KeepAll().mask(w), w != 0)
    keep = RandomFractionSparsifier(0.25, generator=torch.Generator().manual_seed(1)).mask(w)
    assert int(keep.sum()) == 72
    # 2:4 along the last dim: two per group of four, the two largest
    keep = PerBlockNMSparsifier(2, 4).mask(w)
    groups, kept = w.abs().reshape(-1, 4), keep.reshape(-1, 4)
    assert (kept.sum(1) == 2).all()
    assert (groups.masked_fill(~kept, float("inf")).amin(1) >= groups.masked_fill(kept, -1).amax(1)).all()
    # blocks of 2 x 3: the 4 blocks of largest |w| sums survive whole
    keep = BlockFractionSparsifier(0.75, (2, 3)).mask(w)
    sums = torch.stack([w[r:r + 2, c:c + 3].abs().sum() for r in range(0, 8, 2) for c in range(0, 12, 3)])
    want = torch.zeros(16, dtype=torch.bool)
    want[sums.topk(4).indices] = True
    assert torch.equal(keep, want.view(4, 4).repeat_interleave(2, 0).repeat_interleave(3, 1))


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell", scorch.formats.bsr(2, 3)])
def test_a_sparsifier_stores_exactly_its_mask(fmt):
    w = rnd(8, 12, seed=1)
    A = ScalarFractionSparsifier(0.5)(w, fmt)
    mask = ScalarFractionSparsifier(0.5).mask(w)
    assert isinstance(A, scorch.SparseTensor) and A.format == scorch.format.resolve(fmt, 2)
    torch.testing.assert_close(A.to_dense(), w * mask)


def test_sparsifier_arguments_are_checked():
    with pytest.raises(ValueError, match=r"fraction must be a number in \[0, 1\], got 1.5"):
        ScalarFractionSparsifier(1.5)
    with pytest.raises(ValueError, match="needs ints 0 <= n <= m"):
        PerBlockNMSparsifier(3, 2)
    with pytest.raises(ValueError, match="the last dim of shape .8, 10. must be a multiple of m=4"):
        PerBlockNMSparsifier(2, 4).mask(rnd(8, 10))
    with pytest.raises(ValueError, match="block_shape .2, 3. must have one size per dim"):
        BlockFractionSparsifier(0.5, (2, 3)).mask(rnd(8, 10))
    with pytest.raises(TypeError, match="expects a dense torch.Tensor"):
        KeepAll().mask([1.0, 2.0])


def test_a_user_sparsifier_mask_is_checked_and_numeric_masks_keep_nonzeros():
    class Above(scorch.sparsify.Sparsifier):
        def __init__(self, kind):
            self.kind = kind

        def mask(self, t):
            keep = t.abs() > 0.5
            return {"int": keep.int(), "float": keep.float(), "bool": keep, "short": keep[:-1],
                    "list": keep.tolist()}[self.kind]
    for w in (rnd(6), rnd(4, 6)):
        want = w * (w.abs() > 0.5)
        for kind in ("int", "float", "bool"):   # torch.ao.pruning's masks are 0/1 floats
            assert torch.equal(Above(kind)(w).to_dense(), want)
        with pytest.raises(ValueError, match=r"Above.mask\(\) must return a mask of the tensor's shape"):
            Above("short")(w)
        with pytest.raises(TypeError, match=r"Above.mask\(\) must return a tensor, got list"):
            Above("list")(w)


def test_formats_are_checked_where_they_are_given():
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    sb = SparsityBuilder(model)
    with pytest.raises(ValueError, match=r"SparsityBuilder.set_interm: out_format: unknown format name 'xyz'"):
        sb.set_interm("1", KeepAll(), out_format="xyz")
    with pytest.raises(ValueError, match=r"SparsityBuilder.set_weight: out_format: unknown format name 'xyz'"):
        sb.set_weight("0.weight", KeepAll(), out_format="xyz")
    with pytest.raises(ValueError, match=r"set_weight: out_format for '0.bias': .* stores 2-d tensors"):
        sb.set_weight("0.bias", KeepAll(), out_format=scorch.formats.csr)
    with pytest.raises(TypeError, match="set_interm: out_format must be a format name"):
        sb.set_interm("1", KeepAll(), out_format=3)
    with pytest.raises(ValueError, match=r"\.set_format: unknown format name 'xyz'"):
        scorch.schedule.create_schedule(model)["1"].set_format("xyz")
    sb.set_interm("1", KeepAll(), out_format="COO")   # names are case-insensitive, as everywhere
    x = rnd(3, 6).float()
    assert torch.allclose(sb.get_sparse_model()(x), model(x))


class Attention(nn.Module):   # named like BERT's attention.self.query, the seed program's target
    def __init__(self):
        super().__init__()
        self.self = nn.Module()
        self.self.query, self.self.key = nn.Linear(16, 16), nn.Linear(16, 16)
        self.conv = nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x):
        q, k = self.self.query(x), self.self.key(x)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ x + self.conv(x.transpose(1, 2)).transpose(1, 2)


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
def test_sparsity_builder_on_the_seed_program_trains_like_the_masked_dense_model():
    """The STen seed program: sparsify attention.self.query.weight (90% by magnitude, CSR) and
    others; the sparse model's forward and five SGD steps agree with the dense model whose
    weights are masked the same way (and its gradients masked); the original model is untouched."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.attention = Attention()
    model.double()
    sb = SparsityBuilder(model)
    sb.set_weight("attention.self.query.weight", initial_sparsifier=ScalarFractionSparsifier(0.9), out_format="csr")
    sb.set_weight("attention.self.key.weight", initial_sparsifier=PerBlockNMSparsifier(2, 4))
    sb.set_weight("attention.conv.weight", initial_sparsifier=RandomFractionSparsifier(0.8), out_format="csf")
    sparse = sb.get_sparse_model()
    assert not isinstance(model.attention.self.query.weight, scorch.SparseTensor)
    q = sparse.attention.self.query.weight
    assert isinstance(q, scorch.SparseTensor) and q.nnz == round(0.1 * 256) and q.format.name == "csr"
    masks = {n: p.to_dense() != 0 for n, p in sparse.named_parameters() if isinstance(p, scorch.SparseTensor)}
    ref = __import__("copy").deepcopy(model)
    with torch.no_grad():
        for n, mask in masks.items():
            ref.get_parameter(n).mul_(mask)
    x, target = rnd(3, 5, 16, seed=2), rnd(3, 5, 16, seed=3)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (sparse, ref)]
    for _ in range(5):
        for m, opt in zip((sparse, ref), opts):
            opt.zero_grad()
            loss = nn.functional.mse_loss(m(x), target)
            loss.backward()
            if m is ref:
                for n, mask in masks.items():
                    m.get_parameter(n).grad.mul_(mask)
            opt.step()
        torch.testing.assert_close(sparse(x), ref(x))
    for n, mask in masks.items():
        p = sparse.get_parameter(n)
        assert isinstance(p, scorch.SparseTensor) and p.nnz == int(mask.sum())


def test_sparsity_builder_keeps_tied_weights_tied_and_checks_names():
    emb = nn.Embedding(10, 4)
    out = nn.Linear(4, 10, bias=False)
    out.weight = emb.weight                                  # tied input and output embeddings
    model = nn.Sequential(emb, out)
    sb = SparsityBuilder(model)
    sb.set_weight("1.weight", ScalarThresholdSparsifier(0.5), out_format="coo")
    sparse = sb.get_sparse_model()
    assert sparse[0].weight is sparse[1].weight and isinstance(sparse[0].weight, scorch.SparseTensor)
    torch.testing.assert_close(sparse[0].weight.to_dense(), emb.weight.detach() * (emb.weight.abs() >= 0.5))
    with pytest.raises(ValueError, match=r"no parameter '1.wieght'; did you mean '1.weight'"):
        sb.set_weight("1.wieght")
    with pytest.raises(TypeError, match="the sparsifier must be a scorch.sparsify Sparsifier"):
        sb.set_weight("0.weight", initial_sparsifier=0.9)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        SparsityBuilder(emb.weight)


def test_a_shared_parameter_or_module_takes_one_spec_under_any_of_its_names():
    """A tied parameter set under two names with different specs is refused naming both (the
    second was silently ignored); a module registered twice is addressable by either name and
    sparsified once at every use; a sparsifier's error names the parameter."""
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.weight = a.weight
    model = nn.Sequential(a, nn.ReLU(), b)
    sb = SparsityBuilder(model)
    sb.set_weight("0.weight", ScalarFractionSparsifier(0.5), "csr")
    sb.set_weight("2.weight", ScalarFractionSparsifier(0.5), "csr")      # the same spec: fine
    with pytest.raises(ValueError, match="'2.weight' is the same parameter as '0.weight'"):
        sb.set_weight("2.weight", ScalarFractionSparsifier(0.9), "csc")
    s = scorch.schedule.create_schedule(model)
    s["0.weight"].sparsify(ScalarFractionSparsifier(0.5)).set_format("csr")
    s["2.weight"].sparsify(ScalarFractionSparsifier(0.9)).set_format("csc")
    with pytest.raises(ValueError, match="same parameter"):
        s.build()
    lin = nn.Linear(4, 4)
    twice = nn.Sequential(lin, nn.ReLU(), lin)
    s = scorch.schedule.create_schedule(twice)
    s["2"].sparsify(ScalarThresholdSparsifier(0.3))
    x = torch.randn(3, 4)
    h = lin(x)
    h = h * (h.abs() >= 0.3)
    h = lin(torch.relu(h))
    torch.testing.assert_close(s.build()(x).to_dense(), h * (h.abs() >= 0.3))
    sb = SparsityBuilder(twice)
    sb.set_interm("0", ScalarThresholdSparsifier(0.3))
    with pytest.raises(ValueError, match="'2' is the same submodule as '0'"):
        sb.set_interm("2", ScalarThresholdSparsifier(0.5))
    sb = SparsityBuilder(nn.Sequential(nn.Linear(8, 8), nn.Linear(6, 8)))
    sb.set_weight("1.weight", PerBlockNMSparsifier(2, 4))
    with pytest.raises(ValueError, match="parameter '1.weight': PerBlockNMSparsifier"):
        sb.get_sparse_model()


def test_a_block_size_that_does_not_divide_is_refused_naming_the_tensor():
    """A blocked out_format is checked against the parameter's shape when set_weight is called (a
    schedule's build names the parameter too), and against a submodule's output on the call."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 7))
    sb = SparsityBuilder(model)
    with pytest.raises(ValueError, match="for '0.weight': its block size \\(2, 2\\) does not divide .* \\(7, 5\\)"):
        sb.set_weight("0.weight", ScalarFractionSparsifier(0.5), out_format=scorch.formats.bsr(2, 2))
    s = scorch.schedule.create_schedule(model)
    s["0.weight"].block(2, 2)
    with pytest.raises(ValueError, match="'0.weight'"):
        s.build()
    sb = SparsityBuilder(model)
    sb.set_interm("0", ScalarFractionSparsifier(0.5), out_format=scorch.formats.bsr(2, 2))
    with pytest.raises(ValueError, match="submodule '0''s output of shape \\(3, 7\\)"):
        sb.get_sparse_model()(torch.randn(3, 5))
    sb = SparsityBuilder(model)   # a block that divides: the model runs, as the masked dense one
    sb.set_interm("0", ScalarFractionSparsifier(0.5), out_format=scorch.formats.bsr(2, 7))
    x = torch.randn(4, 5)
    out = sb.get_sparse_model()(x)
    want = model(x)
    torch.testing.assert_close(out.to_dense(), want * (out.to_dense() != 0))


def test_a_tied_spec_compares_sparsifiers_holding_tensors():
    """Two names of a tied parameter set with sparsifiers holding tensors (a user's mask): compared by
    value (== of tensors raised 'Boolean value of Tensor ... is ambiguous')."""
    class Masked(KeepAll):
        def __init__(self, mask):
            self.keep = mask

        def mask(self, tensor):
            return self.keep
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight = a.weight
    sb = SparsityBuilder(nn.Sequential(a, b))
    keep = torch.rand(4, 4, generator=torch.Generator().manual_seed(0)) < 0.5
    sb.set_weight("0.weight", Masked(keep))
    sb.set_weight("1.weight", Masked(keep.clone()))   # the same spec
    with pytest.raises(ValueError, match="same parameter"):
        sb.set_weight("1.weight", Masked(~keep))
    model = sb.get_sparse_model()
    torch.testing.assert_close(model[0].weight.to_dense(), a.weight.detach() * keep)
