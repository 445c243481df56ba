"""scorch.sparsify: sparsifiers against masks computed independently on dense tensors, and
SparsityBuilder on models against the same dense models with masked weights."""

import numpy as np
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


def _py_masks(values, shape, t, fraction, n, m, block, frac_blocks):
    """Independent oracle in Python ints: the masks each magnitude sparsifier should give for
    ``values`` (a flat list of Python numbers, ``|x|`` exact), ties broken by position."""
    mags = [abs(int(x)) for x in values]
    thr = [mg >= t and x != 0 for mg, x in zip(mags, values)]
    drop = set(sorted(range(len(mags)), key=lambda i: (mags[i], i))[:round(fraction * len(mags))])
    frac = [i not in drop for i in range(len(mags))]
    rows, cols = shape
    sums = [sum(mags[r * cols + c] for r in range(br, br + block[0]) for c in range(bc, bc + block[1]))
            for br in range(0, rows, block[0]) for bc in range(0, cols, block[1])]
    dropped = set(sorted(range(len(sums)), key=lambda i: (sums[i], i))[:round(frac_blocks * len(sums))])
    per_row = cols // block[1]
    blk = [(r // block[0]) * per_row + c // block[1] not in dropped for r in range(rows) for c in range(cols)]
    return thr, frac, blk


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_magnitude_sparsifiers_on_integer_and_bool_weights_compare_true_magnitudes(dtype):
    """Integer weights holding the dtype's minimum (int8 -128: quantized weights) are the largest
    magnitude: ``abs`` wrapped to -128 and they were dropped first; bool weights crashed
    ('abs_cpu not implemented for Bool') and now count |True| = 1.  Oracle: Python ints."""
    g = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        w = torch.rand(4, 8, generator=g) < 0.5
    else:
        info = torch.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        w = torch.randint(lo, hi + 1, (4, 8), generator=g, dtype=torch.int64).to(dtype)
        w[0, 0], w[2, 5] = info.min, info.max   # one of each: sums stay unambiguous
    values = w.reshape(-1).tolist()
    thr, frac, blk = _py_masks(values, (4, 8), 1 if dtype == torch.bool else 500, 0.5, 2, 4, (2, 2), 0.5)
    t = 0.5 if dtype == torch.bool else 499.5   # |x| >= 499.5  <=>  |x| >= 500 for ints
    assert ScalarThresholdSparsifier(t).mask(w).reshape(-1).tolist() == thr
    assert ScalarFractionSparsifier(0.5).mask(w).reshape(-1).tolist() == frac
    assert BlockFractionSparsifier(0.5, (2, 2)).mask(w).reshape(-1).tolist() == blk
    keep, mags = PerBlockNMSparsifier(2, 4).mask(w).reshape(-1).tolist(), [abs(int(x)) for x in values]
    for g in range(0, len(mags), 4):   # the 2 largest |x| of every 4 (ties: either)
        kept = [mg for mg, k in zip(mags[g:g + 4], keep[g:g + 4]) if k]
        dropped = [mg for mg, k in zip(mags[g:g + 4], keep[g:g + 4]) if not k]
        assert len(kept) == 2 and min(kept) >= max(dropped)
    stored = ScalarFractionSparsifier(0.5)(w)
    assert stored.dtype == dtype and torch.equal(stored.to_dense(), w * torch.tensor(frac).view(4, 8))


def test_int64_minimum_is_the_largest_magnitude():
    """int64's |min| = 2**63 fits no int64: compared exactly, not through a wrapping abs (nor float64,
    which cannot tell 2**63 - 1 from 2**63)."""
    big = torch.iinfo(torch.int64)
    w = torch.tensor([big.min, big.max, 1, -3])
    assert ScalarFractionSparsifier(0.75).mask(w).tolist() == [True, False, False, False]
    assert ScalarThresholdSparsifier(2.0 ** 63).mask(w).tolist() == [True, False, False, False]
    assert PerBlockNMSparsifier(1, 4).mask(w).tolist() == [True, False, False, False]
    pairs = torch.tensor([1, 2, big.min, 0])
    assert BlockFractionSparsifier(0.5, (2,)).mask(pairs).tolist() == [False, False, True, True]
    model = nn.Linear(4, 1, bias=False)
    model.weight = nn.Parameter(torch.tensor([[-128, 1, 2, 100]], dtype=torch.int8), requires_grad=False)
    sb = SparsityBuilder(model)
    sb.set_weight("weight", ScalarThresholdSparsifier(10))
    assert sb.get_sparse_model().weight.to_dense().tolist() == [[-128, 0, 0, 100]]


def test_float16_block_sums_do_not_overflow():
    """Block sums of float16 weights were taken in float16: 65000 + 65000 = inf tied with
    60000 + 60000 = inf and the smaller block could survive.  Oracle: float64 sums in Python."""
    w = torch.tensor([[65000., 65000.], [1., 1.], [60000., 60000.]], dtype=torch.float16)
    sums = [sum(abs(float(x)) for x in row) for row in w.tolist()]
    want = [[s == max(sums)] * 2 for s in sums]
    assert BlockFractionSparsifier(2 / 3, (1, 2)).mask(w).tolist() == want
    assert BlockFractionSparsifier(2 / 3, (1, 2)).mask(w.to(torch.bfloat16)).tolist() == want


def test_tied_specs_compare_arrays_lists_and_nan_by_value():
    """A custom sparsifier holding a numpy mask or a list of tensors (SparTA's fixed masks) under two
    names of a tied weight crashed ('truth value ... ambiguous'); two equal sparsifiers holding NaN
    were refused as a conflict.  Equal state is one spec, different state is refused."""

    class Fixed(scorch.sparsify.Sparsifier):
        def __init__(self, keep, extra=None):
            self.keep, self.extra = keep, extra

        def mask(self, tensor):
            keep = self.keep[0] if isinstance(self.keep, list) else self.keep
            return torch.as_tensor(keep)
    M = np.random.default_rng(0).random((4, 4)) > 0.5
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight = a.weight
    for same, other in [(lambda: Fixed(M.copy()), Fixed(~M)),
                        (lambda: Fixed([torch.from_numpy(M.copy())]), Fixed([torch.from_numpy(~M)])),
                        (lambda: Fixed(M.copy(), {"t": float("nan"), "v": (1, np.float32("nan"))}),
                         Fixed(M.copy(), {"t": 0.0, "v": (1, np.float32("nan"))}))]:
        sb = SparsityBuilder(nn.Sequential(a, b))
        sb.set_weight("0.weight", same())
        sb.set_weight("1.weight", same())   # the same spec under the other name
        with pytest.raises(ValueError, match="'1.weight' is the same parameter as '0.weight'"):
            sb.set_weight("1.weight", other)
        model = sb.get_sparse_model()
        assert model[0].weight is model[1].weight
        torch.testing.assert_close(model[0].weight.to_dense(), a.weight.detach() * torch.from_numpy(M))
    s = scorch.schedule.create_schedule(nn.Sequential(a, b))
    s["0.weight"].sparsify(Fixed(M))
    s["1.weight"].sparsify(Fixed(M.copy()))
    torch.testing.assert_close(s.build()[1].weight.to_dense(), a.weight.detach() * torch.from_numpy(M))


def test_custom_masks_as_torch_sparse_or_numpy_and_errors_naming_the_parameter():
    """mask() may return a torch.sparse tensor (raised aten's NotImplementedError) or a numpy array
    (refused inside get_sparse_model without the parameter's name); an error a sparsifier raises
    names the parameter or submodule whatever its type."""

    class Above(scorch.sparsify.Sparsifier):
        def __init__(self, kind):
            self.kind = kind

        def mask(self, t):
            keep = t.abs() > 0.5
            return {"coo": keep.float().to_sparse(), "csr": keep.float().to_sparse_csr(), "numpy": keep.numpy(),
                    "list": keep.tolist()}[self.kind]
    w = rnd(4, 6)
    for kind in ("coo", "csr", "numpy"):
        torch.testing.assert_close(Above(kind)(w).to_dense(), w * (w.abs() > 0.5))
    model = nn.Sequential(nn.Linear(6, 4).double(), nn.ReLU())
    sb = SparsityBuilder(model)
    sb.set_weight("0.weight", Above("numpy"))
    torch.testing.assert_close(sb.get_sparse_model()[0].weight.to_dense(),
                               model[0].weight.detach() * (model[0].weight.detach().abs() > 0.5))
    sb.set_weight("0.weight", Above("list"))
    with pytest.raises(TypeError, match=r"parameter '0.weight': Above.mask\(\) must return a tensor, got list"):
        sb.get_sparse_model()
    sb = SparsityBuilder(model)
    sb.set_interm("1", Above("list"))
    with pytest.raises(TypeError, match=r"submodule '1''s output .*Above.mask\(\) must return a tensor"):
        sb.get_sparse_model()(rnd(3, 6))


def test_a_parameter_gone_from_the_model_is_named():
    """The model lost a parameter after set_weight: get_sparse_model raised a bare KeyError."""
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    sb = SparsityBuilder(m)
    sb.set_weight("1.weight", ScalarFractionSparsifier(0.5))
    del m[1]
    with pytest.raises(ValueError, match="parameter '1.weight', given to set_weight, is no longer in the model"):
        sb.get_sparse_model()
    sb.set_weight("0.weight", ScalarFractionSparsifier(0.5))   # the stale name is no tied partner
    with pytest.raises(ValueError, match="'1.weight'"):
        sb.get_sparse_model()


def test_number_arguments_accept_numpy_scalars_and_0d_tensors():
    """np.float32, 0-d tensors and np.int64 sizes are numbers (they were refused as 'must be a number');
    a bool is not; a generator that is no torch.Generator is refused when given (it failed in mask())."""
    w = rnd(4, 8)
    want = ScalarFractionSparsifier(0.5).mask(w)
    for f in (np.float32(0.5), np.float64(0.5), torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float16)):
        assert torch.equal(ScalarFractionSparsifier(f).mask(w), want)
    assert torch.equal(ScalarThresholdSparsifier(np.float32(0.5)).mask(w), w.abs() >= 0.5)
    assert torch.equal(PerBlockNMSparsifier(np.int64(2), torch.tensor(4)).mask(w), PerBlockNMSparsifier(2, 4).mask(w))
    assert BlockFractionSparsifier(0.5, (np.int64(2), 2)).block_shape == (2, 2)
    for bad in (True, np.bool_(True), torch.tensor(True), torch.tensor([0.5]), "0.5"):
        with pytest.raises(ValueError, match="fraction must be a number"):
            ScalarFractionSparsifier(bad)
    with pytest.raises(ValueError, match="needs ints"):
        PerBlockNMSparsifier(np.float32(2), 4)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        RandomFractionSparsifier(0.5, generator=3)


def test_a_parametrized_weight_points_at_its_original():
    """set_weight('0.weight') on a parametrized module suggested an unrelated name ('2.weight')."""
    import torch.nn.utils.parametrize as P

    class Sym(nn.Module):
        def forward(self, X):
            return X.triu() + X.triu(1).T
    m = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    P.register_parametrization(m[0], "weight", Sym())
    with pytest.raises(ValueError, match=r"'0.weight' is parametrized, held by the parameter "
                                         r"'0.parametrizations.weight.original'"):
        SparsityBuilder(m).set_weight("0.weight")
