"""SparseTensor: the API of the core issue, bad input, persistence, nn.Module integration."""

import copy
import math
import io
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch import SparseTensor


@pytest.fixture
def x():
    g = torch.Generator().manual_seed(0)
    d = torch.randn(6, 8, generator=g)
    return d * (torch.rand(6, 8, generator=g) < 0.4)


def test_is_a_tensor_with_torch_metadata(x):
    A = scorch.as_sparse(x, "csr")
    assert isinstance(A, torch.Tensor) and isinstance(A, SparseTensor)
    assert A.shape == x.shape and A.size() == x.size() and A.dim() == 2 and A.numel() == x.numel()
    assert A.dtype == x.dtype and A.device == x.device and len(A) == len(x)
    assert A.nnz == int((x != 0).sum())
    assert A.density == pytest.approx(A.nnz / x.numel())
    assert scorch.is_sparse(A) and scorch.is_sparse(x.to_sparse_csr()) and not scorch.is_sparse(x)


def test_storage_is_int32_by_default_and_int64_on_request(x):
    A = scorch.as_sparse(x, "csr")
    assert A.index_dtype == torch.int32 and A.pos(1).dtype == torch.int32 and A.crd(1).dtype == torch.int32
    assert A.pos(0) is None and A.crd(0) is None
    B = scorch.as_sparse(x, "csr", index_dtype=torch.int64)
    assert B.index_dtype == torch.int64 and torch.equal(B.to_dense(), x)
    assert A.asformat("coo").index_dtype == torch.int32
    assert B.asformat("coo").index_dtype == torch.int64
    assert B.asformat("csr", index_dtype=torch.int32).index_dtype == torch.int32


def test_csr_storage_matches_torch(x):
    A = scorch.as_sparse(x, "csr")
    t = x.to_sparse_csr()
    assert torch.equal(A.pos(1).long(), t.crow_indices())
    assert torch.equal(A.crd(1).long(), t.col_indices())
    assert torch.equal(A.values(), t.values())


def test_repr_is_readable(x):
    r = repr(scorch.as_sparse(x, "csc"))
    assert r.startswith("SparseTensor(shape=(6, 8), format=csc, nnz=")
    assert "dtype=torch.float32" in r and "values=tensor(" in r


def test_dtype_moves(x):
    A = scorch.as_sparse(x, "coo")
    for B, dt in [(A.double(), torch.float64), (A.to(torch.float64), torch.float64), (A.float(), torch.float32),
                  (A.half(), torch.float16), (A.bfloat16(), torch.bfloat16), (A.to(dtype=torch.float64), torch.float64)]:
        assert isinstance(B, SparseTensor) and B.dtype == dt and B.values().dtype == dt
        assert torch.equal(B.to_dense(), x.to(dt))
    assert A.to(torch.float32) is A


def test_clone_is_independent(x):
    A = scorch.as_sparse(x, "csr")
    B = A.clone()
    B.values().mul_(2)
    assert torch.equal(A.to_dense(), x) and torch.equal(B.to_dense(), 2 * x)
    C = torch.clone(A)
    assert isinstance(C, SparseTensor) and torch.equal(C.to_dense(), x)


def test_transpose_shares_storage(x):
    A = scorch.as_sparse(x, "csr")
    T = A.t()
    assert T.format == scorch.formats.csc and T.shape == (8, 6)
    assert T.values().data_ptr() == A.values().data_ptr()
    assert torch.equal(T.to_dense(), x.t())
    assert torch.equal(torch.transpose(A, 0, 1).to_dense(), x.t())
    assert torch.equal(A.T.to_dense(), x.T) and torch.equal(A.mT.to_dense(), x.mT)
    x3 = torch.arange(24.).reshape(2, 3, 4) * (torch.arange(24).reshape(2, 3, 4) % 3 == 0)
    B = scorch.as_sparse(x3, "csf")
    assert torch.equal(B.permute(2, 0, 1).to_dense(), x3.permute(2, 0, 1))
    assert torch.equal(torch.permute(B, (1, 2, 0)).to_dense(), x3.permute(1, 2, 0))
    with pytest.raises(ValueError, match="t\\(\\) expects"):
        B.t()
    with pytest.raises(ValueError, match="permutation"):
        B.permute(0, 0, 1)
    with pytest.raises(ValueError, match="out of range"):
        A.transpose(0, 2)


def test_ell_pads_and_counts_real_entries():
    x = torch.tensor([[1., 0, 2, 0], [0, 0, 0, 0], [3, 4, 5, 0]])
    A = scorch.as_sparse(x, "ell")
    assert A.crd(1).numel() == 3 * 3  # 3 rows x max 3 entries per row
    assert A.nnz == 5 and (A.crd(1) < 0).sum() == 4
    assert torch.equal(A.to_dense(), x)


def test_bsr_stores_whole_blocks():
    x = torch.zeros(4, 6)
    x[0, 1] = 1.
    x[3, 5] = 2.
    A = scorch.as_sparse(x, scorch.formats.bsr(2, 3))
    assert A.nnz == 12 and A.values().numel() == 12  # two 2x3 blocks
    assert torch.equal(A.to_dense(), x)
    t = A.to_torch()
    assert t.layout == torch.sparse_bsr and torch.equal(t.to_dense(), x)


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("call,exc,match", [
    (lambda: scorch.from_coo([[0, 3]], [1., 2.], (3,)), ValueError, "dim 0 has index 3, out of range for size 3"),
    (lambda: scorch.from_coo([[0, -1]], [1., 2.], (3,)), ValueError, "negative index -1"),
    (lambda: scorch.from_coo([[0, 1]], [1., 2.], (3, 3)), ValueError, "indices has 1 rows, expected one per dim"),
    (lambda: scorch.from_coo([[0, 1], [0, 1]], [1.], (3, 3)), ValueError, "2 columns .* values has 1 entries"),
    (lambda: scorch.from_coo([[0., 1.]], [1., 2.], (3,)), TypeError, "integer tensor, got dtype torch.float"),
    (lambda: scorch.from_coo([[0., float("nan")]], [1., 2.], (3,)), ValueError, "NaN"),
    (lambda: scorch.from_coo([0, 1], [1., 2.], (3,)), ValueError, "must be 2-d"),
    (lambda: scorch.from_coo([[0, 1]], [[1., 2.]], (3,)), ValueError, "values must be 1-d"),
    (lambda: scorch.from_coo(torch.zeros(1, 0, dtype=torch.long), [], None), ValueError, "shape is required"),
    (lambda: scorch.from_coo([[0]], [1.], (-1,)), ValueError, "negative sizes"),
    (lambda: scorch.from_coo([[0]], [1.], ()), ValueError, "0-d"),
    (lambda: scorch.as_sparse(torch.tensor(1.)), ValueError, "0-d"),
    (lambda: scorch.as_sparse(torch.ones(2, 2), "blah"), ValueError, "unknown format name 'blah'"),
    (lambda: scorch.as_sparse(torch.ones(3, 4), scorch.formats.bsr(2, 2)), ValueError, "does not divide shape"),
    (lambda: scorch.as_sparse([1, 2]), TypeError, "got list"),
    (lambda: scorch.as_sparse(torch.ones(2), index_dtype=torch.float32), TypeError, "index_dtype"),
    (lambda: scorch.as_sparse(torch.ones(2, 2), 7), TypeError, "format must be"),
    (lambda: scorch.as_sparse(torch.ones(2), "csc"), ValueError, "at least 2 dims"),
])
def test_bad_input_is_rejected_clearly(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_malformed_torch_csr_is_rejected():
    bad = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 5]), torch.tensor([1., 2.]),
                                  (2, 3), check_invariants=False)
    with pytest.raises(ValueError, match=r"coordinates must lie in \[0, 3\)"):
        scorch.as_sparse(bad)
    bad_pos = torch.sparse_csr_tensor(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.tensor([1., 2.]),
                                      (2, 3), check_invariants=False)
    with pytest.raises(ValueError, match="pos must start at 0, never decrease"):
        scorch.as_sparse(bad_pos)


def test_unsorted_torch_csr_is_sorted_and_summed():
    t = torch.sparse_csr_tensor(torch.tensor([0, 3, 3]), torch.tensor([2, 0, 2]), torch.tensor([1., 2., 4.]),
                                (2, 3), check_invariants=False)
    A = scorch.as_sparse(t, "csr")
    assert torch.equal(A.to_dense(), torch.tensor([[2., 0, 5.], [0, 0, 0]]))
    assert A.crd(1).tolist() == [0, 2]


def test_int32_cannot_hold_huge_tensor():
    with pytest.raises(ValueError, match="int32 cannot hold"):
        scorch.from_coo([[0], [0]], [1.], (2**31, 2), index_dtype=torch.int32)
    A = scorch.from_coo([[2**31 + 5], [1]], [1.], (2**32, 2), format="csc")
    assert A.index_dtype == torch.int64 and A.coo()[0].tolist() == [[2**31 + 5], [1]]


def test_empty_and_degenerate_shapes():
    for shape in [(0,), (0, 3), (3, 0), (1, 1), (2, 0, 4)]:
        for fmt in ["dense", "coo", "csr", "csf", "ell"]:
            A = scorch.as_sparse(torch.zeros(shape), fmt)
            assert A.nnz == (A.numel() if fmt == "dense" else 0) and A.shape == shape
            assert torch.equal(A.to_dense(), torch.zeros(shape))
    one = scorch.as_sparse(torch.tensor([[5.]]), "dcsr")
    assert one.nnz == 1 and one.to_dense().item() == 5.


def test_sparse_coo_sums_duplicates_and_accepts_numpy():
    A = scorch.from_coo(np.array([[1, 0, 1], [2, 2, 2]]), np.array([1., 2., 3.]), format="csr")
    assert A.shape == (2, 3)
    assert torch.equal(A.to_dense(), torch.tensor([[0., 0, 2], [0, 0, 4]]))
    assert A.nnz == 2


# ------------------------------------------------------------------ persistence and nn.Module

@pytest.mark.parametrize("fmt", ["csr", "coo", "ell", scorch.formats.bsr(2, 2), "dense"])
def test_torch_save_load_round_trip(x, fmt):
    A = scorch.as_sparse(x, fmt)
    buf = io.BytesIO()
    torch.save({"A": A, "n": 3}, buf)
    buf.seek(0)
    B = torch.load(buf)  # weights_only=True, the default
    assert isinstance(B["A"], SparseTensor) and B["A"].format == A.format
    assert torch.equal(B["A"].to_dense(), x) and B["A"].index_dtype == A.index_dtype


def test_load_rejects_corrupted_storage(x):
    A = scorch.as_sparse(x, "csr")
    A._crd[1][0] = 99  # corrupt after construction (crd() is a copy)
    buf = io.BytesIO()
    torch.save(A, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match="coordinates must lie"):
        torch.load(buf)


def test_parameter_state_dict_round_trip(x):
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(scorch.as_sparse(x, "csr"))
    assert isinstance(m.w, torch.nn.Parameter) and isinstance(m.w, SparseTensor) and m.w.requires_grad
    sd = m.state_dict()
    assert isinstance(sd["w"], SparseTensor) and not sd["w"].requires_grad
    m2 = torch.nn.Module()
    m2.w = torch.nn.Parameter(scorch.as_sparse(torch.zeros(6, 8), "csr"))
    m2.load_state_dict(sd)
    assert torch.equal(m2.w.to_dense(), x) and m2.w.format == scorch.formats.csr
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    m2.load_state_dict(torch.load(buf))
    assert torch.equal(m2.w.to_dense(), x)


def test_deepcopy(x):
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(scorch.as_sparse(x, "coo"))
    m3 = copy.deepcopy(m)
    assert isinstance(m3.w, SparseTensor) and m3.w.requires_grad
    m3.w.values().detach().zero_()
    assert torch.equal(m.w.to_dense(), x)


def test_deepcopy_of_a_non_leaf_is_refused_as_torch_refuses_it(x):
    A = scorch.as_sparse(x, "csr").requires_grad_()
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(A * 2)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x.clone().requires_grad_() * 2)   # (torch's own, the rule followed)
    B = copy.deepcopy((A * 2).detach())
    assert torch.equal(B.to_dense(), 2 * x) and B.grad_fn is None


def test_level_arguments_are_ints(x):
    A = scorch.as_sparse(x, "csr")
    assert torch.equal(A.pos(np.int64(1)), A.pos(-1))
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="level must be an int"):
            A.pos(bad)
        with pytest.raises(TypeError, match="level must be an int"):
            A.crd(bad)
    with pytest.raises(ValueError, match="level must be an int in \\[-2, 2\\)"):
        A.crd(2)


def test_copies_and_pickles_of_a_sparse_parameter_stay_parameters(x, tmp_path):
    """nn.Parameter marks a tensor subclass (``_is_param``); deepcopy, pickle and torch.save /
    torch.load of a module keep the mark -- as torch's for a dense Parameter -- so a copied model's
    sparse weight is still trained, parametrized and assignable."""
    import pickle
    lin = torch.nn.Linear(8, 6)
    lin.weight = torch.nn.Parameter(scorch.as_sparse(x.float(), "csr"))
    lin.weight.grad = scorch.as_sparse(x.float() * 2, "csr")
    torch.save(lin, tmp_path / "lin.pt")
    for copied in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin)), torch.load(tmp_path / "lin.pt", weights_only=False)):
        w = copied.weight
        assert isinstance(w, torch.nn.Parameter) and isinstance(w, SparseTensor) and w.requires_grad
        assert torch.equal(w.to_dense(), x.float()) and w is not lin.weight
    dense = torch.nn.Linear(8, 6)
    dense.weight.grad = torch.ones(6, 8)
    assert copy.deepcopy(lin).weight.grad is None and copy.deepcopy(dense).weight.grad is None   # Parameter's rule
    B = scorch.as_sparse(x, "csr").requires_grad_()
    B.grad = scorch.as_sparse(x * 2, "csr")
    assert torch.equal(copy.deepcopy(B).grad.to_dense(), x * 2)   # a plain tensor's deepcopy copies its grad
    sd = {"w": torch.nn.Parameter(scorch.as_sparse(x, "coo"))}
    torch.save(sd, tmp_path / "sd.pt")
    assert isinstance(torch.load(tmp_path / "sd.pt", weights_only=True)["w"], torch.nn.Parameter)
    c = copy.deepcopy(lin)
    torch.nn.utils.parametrizations.weight_norm(c)
    assert sorted(n for n, _ in c.named_parameters()) == [
        "bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    c = copy.deepcopy(lin)
    c.load_state_dict(lin.state_dict(), assign=True)
    assert torch.equal(c.weight.to_dense(), x.float())
    assert not isinstance(copy.deepcopy(scorch.as_sparse(x, "csr")), torch.nn.Parameter)


def test_copy_into_sparse_takes_the_new_pattern(x):
    A = scorch.as_sparse(torch.zeros(6, 8), "csr")
    A.copy_(x)
    assert torch.equal(A.to_dense(), x) and A.nnz == int((x != 0).sum())
    with pytest.raises(ValueError, match="does not broadcast"):
        A.copy_(torch.zeros(2, 2))
    A.copy_(x[0])   # broadcast, as torch's copy_
    assert torch.equal(A.to_dense(), x[0].expand(6, 8))


def test_tensor_flatten_round_trip(x):
    A = scorch.as_sparse(x, "coo")
    names, ctx = A.__tensor_flatten__()
    B = SparseTensor.__tensor_unflatten__({n: getattr(A, n) for n in names}, ctx, A.shape, None)
    assert torch.equal(B.to_dense(), x) and B.format == A.format


# ------------------------------------------------------------------ dense fallback

def test_dense_fallback_warns_once_and_is_right(x, monkeypatch):
    from scorch import _dispatch
    monkeypatch.setattr(_dispatch, "_warned", set())
    A = scorch.as_sparse(x, "csr")
    with pytest.warns(UserWarning, match="fft_r2c has no sparse implementation"):
        out = torch.fft.rfft(A)
    assert torch.equal(out, torch.fft.rfft(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.fft.rfft(A)  # second time: silent
        assert torch.equal(torch.exp(A), torch.exp(x))  # exp(0) != 0: dense by definition, no warning


def test_dense_fallback_can_raise(x, monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")
    with pytest.raises(NotImplementedError, match="dense_fallback = 'raise'"):
        torch.fft.rfft(scorch.as_sparse(x, "csr"))
    with pytest.raises(ValueError, match="dense_fallback must be one of"):   # checked when set
        scorch.config.dense_fallback = "bogus"
    assert scorch.config.dense_fallback == "raise"


def test_dense_fallback_refuses_a_copy_over_the_limit(x, monkeypatch):
    """Beyond scorch.config.dense_fallback_max_bytes the fallback raises (naming the op and the
    size) instead of allocating; at the limit it runs; None lifts it.  Oracle: dense rfft."""
    A = scorch.as_sparse(x, "csr")
    size = x.numel() * x.element_size()
    monkeypatch.setattr(scorch.config, "dense_fallback", "silent")
    monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", size - 1)
    with pytest.raises(NotImplementedError, match="fft_r2c has no sparse implementation, and its dense copy"):
        torch.fft.rfft(A)
    for limit in (size, None):
        monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", limit)
        assert torch.equal(torch.fft.rfft(A), torch.fft.rfft(x))


def test_in_place_ops_update_stored_values_grow_or_refuse(x):
    A = scorch.as_sparse(x, "csr")
    A.mul_(2)  # same pattern: the stored values change in place
    assert torch.equal(A.to_dense(), 2 * x)
    C = A.clone()
    assert C.add_(torch.ones_like(x)) is C   # a dense operand makes every entry nonzero: the pattern grows
    assert torch.equal(C.to_dense(), 2 * x + 1) and C.nnz == x.numel()
    with pytest.raises(NotImplementedError, match="in place"):
        torch.cumsum(A, 0, out=A)  # a non-pointwise write into a SparseTensor
    assert torch.equal(A.to_dense(), 2 * x)
    B = scorch.as_sparse(x * (x > 0), "coo")   # a SparseTensor of another pattern: read as a dense operand
    A.mul_(B)
    assert torch.equal(A.to_dense(), 2 * x * x * (x > 0))
    A.add_(scorch.as_sparse(torch.ones_like(x), "csr"))   # another pattern with more entries: they join
    assert torch.equal(A.to_dense(), 2 * x * x * (x > 0) + 1)


def test_empty_like_is_unset_so_a_fill_reaches_every_entry(x):
    """``empty_like(A)`` has no values yet: a fill gives the value everywhere (torch's C++ computes
    ``s - A`` in composites as ``empty_like(A).fill_(s).sub_(A)``: hinge_embedding_loss was wrong
    where A stores nothing), while a fill of a pattern (``nn.init.ones_`` on a sparse weight) keeps
    it.  Oracle: dense torch."""
    A = scorch.as_sparse(x, "csr")
    E = torch.empty_like(A).fill_(2.5)
    assert torch.equal(E.to_dense(), torch.full_like(x, 2.5))
    assert torch.equal(A.new_empty((3, 2)).fill_(-1).to_dense(), torch.full((3, 2), -1.0))
    assert torch.equal(torch.empty_like(A).fill_(0).to_dense(), torch.zeros_like(x))
    W = A.clone()
    torch.nn.init.ones_(W)
    assert W.nnz == A.nnz and torch.equal(W.to_dense(), (x != 0).to(x.dtype))
    target = torch.where(torch.arange(x.numel()).reshape(x.shape) % 3 == 0, -1.0, 1.0)
    target[0] = 0   # neither label: both terms
    for reduction in ("none", "mean", "sum"):
        torch.testing.assert_close(F.hinge_embedding_loss(A, target, margin=0.5, reduction=reduction),
                                   F.hinge_embedding_loss(x, target, margin=0.5, reduction=reduction))


def test_torch_sparse_vocabulary(x):
    A = scorch.as_sparse(x, "csr")
    assert A.coalesce() is A and A.is_coalesced()
    assert torch.equal(A.indices(), x.to_sparse().indices())
    s = torch.sparse.sum(A, 1)
    assert scorch.is_sparse(s)
    torch.testing.assert_close(s.to_dense(), x.sum(1))  # summation order may differ: not bit-equal
    assert torch.sparse.sum(A).item() == pytest.approx(x.sum().item(), rel=1e-6)
    with pytest.raises(TypeError, match="to_dense\\(\\).numpy\\(\\)"):
        A.numpy()


def test_torch_sparse_accessors_and_conversions(x):
    """torch.sparse code runs on a SparseTensor: ``_nnz()``, ``sparse_dim()``, CSR / CSC / BSR
    index accessors (as torch's, up to the index dtype) and ``to_sparse_*`` conversions (to the
    matching preset, staying a SparseTensor); oracle: the same calls on torch's own layouts."""
    A = scorch.as_sparse(x, "coo")
    T = x.to_sparse()
    assert A._nnz() == T._nnz() and torch.Tensor._nnz(A) == T._nnz()
    assert (A.sparse_dim(), A.dense_dim()) == (T.sparse_dim(), T.dense_dim())
    C = A.to_sparse_csr()
    assert isinstance(C, SparseTensor) and C.format.name == "csr" and torch.equal(C.to_dense(), x)
    assert torch.equal(C.crow_indices().long(), x.to_sparse_csr().crow_indices())
    assert torch.equal(C.col_indices().long(), x.to_sparse_csr().col_indices())
    S = A.to_sparse(layout=torch.sparse_csc)
    assert torch.equal(S.ccol_indices().long(), x.to_sparse_csc().ccol_indices())
    assert torch.equal(S.row_indices().long(), x.to_sparse_csc().row_indices())
    B = torch.Tensor.to_sparse_bsr(A, (2, 2))
    assert B.format.block == (2, 2) and torch.equal(B.to_dense(), x)
    assert torch.equal(B.crow_indices().long(), x.to_sparse_bsr((2, 2)).crow_indices())
    assert torch.equal(A.to_sparse_bsc((3, 4)).to_dense(), x)
    assert C.to_sparse_coo().format.name == "coo" and A.to_sparse(2).format.name == "coo"
    with pytest.raises(TypeError, match="crow_indices\\(\\): expects a 2-d SparseTensor in csr or bsr"):
        A.crow_indices()
    with pytest.raises(ValueError, match="sparse_dim=1"):
        A.to_sparse(1)
    with pytest.raises(ValueError, match="blocksize"):
        A.to_sparse(layout=torch.sparse_bsr)


def test_from_levels_validates():
    A = SparseTensor.from_levels("csr", (2, 3), [None, torch.tensor([0, 1, 2])], [None, torch.tensor([2, 0])],
                                 torch.tensor([1., 2.]))
    assert torch.equal(A.to_dense(), torch.tensor([[0., 0, 1], [2, 0, 0]]))
    with pytest.raises(ValueError, match="coordinates must lie in"):
        SparseTensor.from_levels("csr", (2, 3), [None, torch.tensor([0, 1, 2])], [None, torch.tensor([5, 0])],
                                 torch.tensor([1., 2.]))
    with pytest.raises(ValueError, match="values must be 1-d with 2 entries"):
        SparseTensor.from_levels("csr", (2, 3), [None, torch.tensor([0, 1, 2])], [None, torch.tensor([2, 0])],
                                 torch.tensor([1.]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_results_on_a_pattern_match_the_constructor(dtype):
    """A kernel's pattern-shaped result (SparseTensor._on_pattern, no storage checks) is the
    SparseTensor the constructor builds from the same parts: fields, cache-key part, values."""
    A = scorch.as_sparse(torch.tensor([[0., 1., 0.], [2., 0., 3.]]), "csr")
    v = torch.arange(3, dtype=dtype) + 1
    got, want = A._on_pattern(v), scorch.SparseTensor(A._format, A._shape, A._pos, A._crd, v, nnz=A._stored)
    assert (got.format, got.shape, got.dtype, got.nnz, got._sig) == (want.format, want.shape, want.dtype, want.nnz,
                                                                     want._sig)
    torch.testing.assert_close(got.to_dense(), want.to_dense())
    assert got._vals is v and not got.requires_grad


@pytest.mark.parametrize("fmt, shape", [("csr", (3, 4)), ("coo", (2, 3, 4)), ("csf", (2, 2, 3)), ("dense", (5,)),
                                        ("csr", (0, 4))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool])
def test_metadata_fast_paths_agree_with_torch(fmt, shape, dtype):
    """shape / dtype / device / ndim / dim() / numel() read the SparseTensor's own fields (no
    __torch_function__ round trip): the same answers as torch's own accessors on the wrapper
    (the oracle), after conversions that change dtype, format and shape as well."""
    d = (torch.arange(math.prod(shape)).reshape(shape) % 3).to(dtype)
    A = scorch.as_sparse(d, fmt)
    for X in (A, A.double(), A.asformat("coo"), A.to(torch.float32), A.unsqueeze(0)):
        with torch._C.DisableTorchFunctionSubclass():
            want = (torch.Tensor.shape.__get__(X), torch.Tensor.dtype.__get__(X),
                    torch.Tensor.device.__get__(X), torch.Tensor.ndim.__get__(X), torch.Tensor.dim(X),
                    torch.Tensor.numel(X))
        assert (X.shape, X.dtype, X.device, X.ndim, X.dim(), X.numel()) == want
        assert type(X.shape) is torch.Size and X.size() == X.shape


def test_like_constructors(x):
    """ones_like / full_like / rand_like / randn_like give dense tensors of the shape (the value is
    everywhere), without the fallback warning; zeros_like keeps the pattern.  Oracle: dense torch."""
    A = scorch.as_sparse(x, "csr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for got, want in [(torch.ones_like(A), torch.ones_like(x)), (torch.full_like(A, 2.5), torch.full_like(x, 2.5)),
                          (torch.ones_like(A, dtype=torch.float64), torch.ones_like(x, dtype=torch.float64))]:
            assert type(got) is torch.Tensor and got.dtype == want.dtype and torch.equal(got, want)
        r = torch.randn_like(A)
        assert type(r) is torch.Tensor and r.shape == x.shape and r.dtype == x.dtype and r.std() > 0
        z = torch.zeros_like(A)
        assert isinstance(z, scorch.SparseTensor) and z.nnz == A.nnz and not z.to_dense().any()


def test_like_constructors_keep_the_dense_size_limit(monkeypatch):
    """ones_like / full_like / rand_like / randn_like of a hypersparse tensor make its dense shape:
    refused over dense_fallback_max_bytes, as ``A + 1`` is (they allocated it unchecked: 3.6 GB for
    a 30000 x 30000 DCSR of 2 entries); under the limit they run.  Oracle: dense torch."""
    x = torch.zeros(40, 50)
    x[3, 7], x[39, 0] = 1.5, -2.0
    A = scorch.as_sparse(x, "dcsr")
    makers = {"ones_like": torch.ones_like, "full_like": lambda t: torch.full_like(t, 3.0),
              "rand_like": torch.rand_like, "randn_like": torch.randn_like}
    monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", x.numel() * x.element_size() - 1)
    for name, make in makers.items():
        with pytest.raises(scorch.errors.NotSupportedError, match=f"{name}.*dense_fallback_max_bytes"):
            make(A)
    monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", x.numel() * x.element_size())
    assert torch.equal(torch.full_like(A, 3.0), torch.full_like(x, 3.0))
    assert torch.randn_like(A).shape == x.shape


@pytest.mark.parametrize("name", ["empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"])
def test_like_constructors_refuse_another_device(x, name):
    """``device=`` was dropped (a CPU result for device="meta"): SparseTensors live on the CPU, so
    another device raises naming it; "cpu" / torch.device("cpu") work.  Oracle: dense torch."""
    A = scorch.as_sparse(x, "csr")
    make = (lambda t, **kw: torch.full_like(t, 2.0, **kw)) if name == "full_like" else getattr(torch, name)
    with pytest.raises(scorch.errors.NotSupportedError, match=f"{name}: device=meta"):
        make(A, device="meta")
    with pytest.raises(scorch.errors.NotSupportedError, match=f"{name}: device=meta"):
        make(A, device=torch.device("meta"))
    for dev in ("cpu", torch.device("cpu")):
        got, want = make(A, device=dev), make(x, device=dev)
        assert got.device == want.device and got.shape == want.shape and got.dtype == want.dtype
        if name in ("zeros_like", "ones_like", "full_like"):
            assert torch.equal(got.to_dense() if isinstance(got, SparseTensor) else got, want)
    for method, args in (("new_zeros", ((2, 3),)), ("new_empty", ((2, 3),)), ("new_ones", ((2, 3),)),
                         ("new_full", ((2, 3), 1.0))):
        with pytest.raises(scorch.errors.NotSupportedError, match=f"{method}: device=meta"):
            getattr(A, method)(*args, device="meta")


ADDC_GROWING = {   # in-place ops whose dense operand makes absent entries nonzero, another operand of A's pattern
    "addcdiv_(B, zeros)": lambda a, b, d: a.addcdiv_(b, d * 0),
    "addcmul_(B, inf)": lambda a, b, d: a.addcmul_(b, d * float("inf")),
    "addcdiv_(ones, B)": lambda a, b, d: a.addcdiv_(d, b),
    "addcmul_(ones, B) + add_(ones)": lambda a, b, d: a.addcmul_(d, b).add_(d),
    "lerp_(ones, B)": lambda a, b, d: a.lerp_(d, b),
}


@pytest.mark.parametrize("name", ADDC_GROWING)
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_in_place_growth_reads_operands_of_the_old_pattern(x, name, fmt):
    """``A.addcdiv_(B, zeros)`` with ``B`` of ``A``'s pattern: the entries the op makes nonzero
    join ``A``, and ``B`` -- still of the old pattern -- is read at them as 0 (it was passed as
    its old values array: a size-mismatch RuntimeError).  Oracle: dense torch (inf / NaN too)."""
    A = scorch.as_sparse(x, fmt)
    B = A.clone()
    d = torch.ones_like(x)
    dense = x + 0.0   # (the fixture's absent entries include -0.0, whose 1 / 0 is -inf: absent is +0)
    got, want = ADDC_GROWING[name](A, B, d), ADDC_GROWING[name](dense.clone(), dense.clone(), d.clone())
    assert got is A and torch.allclose(A.to_dense(), want, equal_nan=True)


@pytest.mark.parametrize("optim", ["RMSprop", "NAdam"])
@pytest.mark.parametrize("foreach", [False, True])
def test_optimizers_with_a_dense_gradient_of_a_sparse_parameter(x, optim, foreach):
    """A sparse parameter whose gradient arrives dense (a hook's ``g.to_dense()``): RMSprop's and
    NAdam's ``param.addcdiv_(grad, denom)`` raised (the denominator, of the parameter's pattern,
    read with its old length); the absent 0 / 0 leaves the entry absent, as ``A.div_(B)`` does --
    the masked dense model (the oracle) keeps 0 there."""
    X = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))
    mask = x != 0
    p = torch.nn.Parameter(scorch.as_sparse(x.clone(), "csr"))
    p.register_hook(lambda g: g.to_dense())
    q = torch.nn.Parameter(x.clone())
    q.register_hook(lambda g: g * mask)
    opts = [getattr(torch.optim, optim)([t], lr=0.1, foreach=foreach) for t in (p, q)]
    for _ in range(3):
        for t, opt in zip((p, q), opts):
            opt.zero_grad()
            (t @ X).square().sum().backward()
            opt.step()
    assert torch.allclose(p.detach().to_dense(), q.detach(), atol=1e-6)


@pytest.mark.parametrize("cast", ["bool", "int", "long", "short", "byte", "char", "half", "double"])
def test_dtype_casts_and_integer_sums(x, cast):
    """A.int() and friends went through to(copy=True), which torch's argument parser refused;
    sums of bool / integer values are exact int64, as torch's.  Oracle: the dense tensor."""
    A = scorch.as_sparse(x, "csr")
    got, want = getattr(A, cast)(), getattr(x, cast)()
    assert isinstance(got, scorch.SparseTensor) and got.dtype == want.dtype
    assert torch.equal(got.to_dense(), want)
    if not want.dtype.is_floating_point:
        for s, w in [(got.sum(), want.sum()), (got.sum(dim=1), want.sum(dim=1)),
                     (torch.sum(got, 0, keepdim=True), torch.sum(want, 0, keepdim=True))]:
            assert s.dtype == w.dtype and torch.equal(s, w)


def test_to_with_copy_never_shares_the_values(x):
    """to(copy=True) returns a tensor whose values are not the caller's (it shared them when
    neither dtype nor device changed): an in-place update of the copy leaves the source alone."""
    A = scorch.as_sparse(x, "csr")
    for B in (A.to(copy=True), A.to(A.dtype, copy=True), A.to(torch.float64, copy=True)):
        assert B._vals.data_ptr() != A._vals.data_ptr()
        B.mul_(0)
        assert torch.equal(A.to_dense(), x)


def test_new_constructors_allclose_and_tolist(x, monkeypatch):
    """``new_zeros`` / ``new_empty`` give an empty SparseTensor (nothing densified), ``new_ones`` /
    ``new_full`` dense tensors, ``allclose`` of two SparseTensors compares stored positions only,
    ``tolist`` the dense value's; oracle: the same calls on the dense tensor."""
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")
    A = scorch.as_sparse(x, "csr")
    z = A.new_zeros(2, 5)
    assert isinstance(z, SparseTensor) and z.nnz == 0 and torch.equal(z.to_dense(), x.new_zeros(2, 5))
    assert A.new_zeros((4,), dtype=torch.float64).to_dense().dtype == torch.float64
    assert A.new_empty(3, 3).shape == (3, 3)
    assert torch.equal(A.new_ones(2, 3), x.new_ones(2, 3)) and torch.equal(A.new_full((2,), 7.0), x.new_full((2,), 7.0))
    near = scorch.as_sparse(x * (1 + 1e-7), "coo")
    far = scorch.as_sparse(x * (x.abs() > 0.5), "csr")
    for other, dense_other in ((near, x * (1 + 1e-7)), (far, x * (x.abs() > 0.5)), (A, x)):
        assert torch.allclose(A, other) == torch.allclose(x, dense_other)
        assert torch.allclose(A, dense_other) == torch.allclose(x, dense_other)
    assert A.tolist() == x.tolist()


@pytest.mark.parametrize("convert", ["double", "float", "half", "cpu", "to", "share_memory"])
def test_modules_holding_sparse_parameters_convert(x, convert):
    """``model.double()`` / ``.to()`` / ``.cpu()`` / ``.share_memory()`` with a SparseTensor
    parameter (they raised: the leaf's gradient hook held a weak reference, and torch swaps a
    Parameter's contents only without one); afterwards a dense gradient still lands in the
    pattern.  Oracle: the dense parameter through the same steps."""
    m = torch.nn.Module()
    m.w = torch.nn.Parameter(scorch.as_sparse(x, "csr"))
    ref = torch.nn.Module()
    ref.w = torch.nn.Parameter(x.clone())
    for mod in (m, ref):
        if convert == "to":
            mod.to("cpu", torch.float64)
        else:
            getattr(mod, convert)()
    assert isinstance(m.w, SparseTensor) and m.w.dtype == ref.w.dtype and m.w.requires_grad
    if convert == "share_memory":
        assert m.w.is_shared() and m.w.values().is_shared()
    if m.w.dtype != torch.float16:   # (exp's backward in half is not what this checks)
        torch.exp(m.w).sum().backward()
        torch.exp(ref.w).sum().backward()
        assert isinstance(m.w.grad, SparseTensor) and m.w.grad.nnz == m.w.nnz
        torch.testing.assert_close(m.w.grad.to_dense(), ref.w.grad * (x != 0))


def test_storage_methods_refuse_or_act_on_the_buffers(x):
    """The wrapper has no storage: torch's storage methods on it crashed the process (a storage's
    copy_, share_memory_); they raise or act on the values and index arrays."""
    A = scorch.as_sparse(x, "csr")
    with pytest.raises(TypeError, match="no storage of its own"):
        A.untyped_storage()
    with pytest.raises(TypeError, match="no storage of its own"):
        A.storage()
    assert A.share_memory_() is A and A.is_shared() and A._crd[1].is_shared()
    assert A.is_pinned() == A.values().is_pinned()  # the fallback raised (no dense copy needed)
    assert torch.equal(A.clone().apply_(lambda v: 2 * v).to_dense(), 2 * x)


def test_torch_compile_over_a_sparse_tensor_says_what_to_do():
    # dynamo asks a tensor input for its storage; a SparseTensor has none: the error says why and
    # what to compile instead -- and that way works
    A = scorch.as_sparse(torch.eye(4) * 2, "csr")
    x = torch.randn(4, 3)
    with pytest.raises(Exception, match="compile the dense parts only"):
        torch.compile(lambda a, y: (a @ y).sum(), backend="eager")(A, x)
    head = torch.compile(lambda h: h.relu().sum(), backend="eager")
    torch.testing.assert_close(head(A @ x), (2 * x).relu().sum())


def test_set_data_takes_another_sparse_tensor(x):
    """``param.data = new`` (pruning code) replaces the storage by a SparseTensor of the same shape
    and dtype (pattern and format included); anything else raises (it was silently ignored)."""
    A = scorch.as_sparse(x, "csr")
    B = scorch.as_sparse(x * 2, "coo")
    A.data = B
    assert A.format == B.format and torch.equal(A.to_dense(), x * 2)
    P = torch.nn.Parameter(scorch.as_sparse(x, "csr"))
    P.data = scorch.as_sparse(x * 3, "csr")
    (P * 1).sum().backward()
    assert torch.equal(P.to_dense().detach(), x * 3) and torch.equal(P.grad.to_dense(), (x != 0).to(x.dtype))
    with pytest.raises(NotImplementedError, match="data"):
        A.data = x
    with pytest.raises(NotImplementedError, match="data"):
        A.data = scorch.as_sparse(x.double(), "csr")


def test_data_ptr_raises_as_torch_sparse_does(x):
    """The wrapper's pointer was 0: every SparseTensor seemed to alias every other."""
    A = scorch.as_sparse(x, "csr")
    for name in ("data_ptr", "const_data_ptr"):
        with pytest.raises(TypeError, match="no dense buffer"):
            getattr(A, name)()
    assert A.values().data_ptr() != 0 and x.data_ptr() != 0   # the arrays, and dense tensors, as before


def test_copy_from_another_pattern_copies_the_values():
    """copy_ (and so load_state_dict) of a source with another pattern took the source's own values
    array: training the copy changed the source."""
    A = scorch.from_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), format="csr")
    B = scorch.from_coo([[0, 1], [0, 1]], [5.0, 6.0], (2, 2), format="csr")
    A.copy_(B)
    A.mul_(0)
    assert torch.equal(B.values(), torch.tensor([5.0, 6.0]))
    T = torch.tensor([[5.0, 0.0], [0.0, 6.0]]).to_sparse_csr()
    A.copy_(T)
    A.mul_(0)
    assert torch.equal(T.values(), torch.tensor([5.0, 6.0]))
    src, dst = scorch.nn.SparseLinear(4, 3, sparsity=0.5), scorch.nn.SparseLinear(4, 3, sparsity=0.5)
    before = src.weight.detach().to_dense().clone()
    dst.load_state_dict(src.state_dict())
    with torch.no_grad():
        dst.weight.mul_(2)
    assert torch.equal(src.weight.detach().to_dense(), before)
    assert torch.equal(dst.weight.detach().to_dense(), 2 * before)


def test_underscore_values_is_torch_coo_method():
    # torch COO code (PyG, SparseAdam) calls x._values(); scorch's own array attribute shadowed it
    dense = torch.tensor([[1., 0.], [0., 2.]])
    A = scorch.as_sparse(dense, format="coo")
    assert torch.equal(A._values(), dense.to_sparse()._values())
    assert torch.equal(A._indices(), dense.to_sparse()._indices())


def test_new_empty_strided_is_unset_as_empty_like():
    # autograd's layout contract made new_empty_strided keep the pattern: a fill then wrote only
    # the stored positions (torch: everywhere)
    D = torch.tensor([[1., 0, 2], [0, 3, 0], [4, 0, 5]])
    A = scorch.as_sparse(D, "csr")
    e = A.new_empty_strided((3, 3), (3, 1)).fill_(7.)
    assert torch.equal(e.to_dense(), D.new_empty_strided((3, 3), (3, 1)).fill_(7.))


def test_filling_every_position_of_a_huge_empty_like_is_refused(monkeypatch):
    H = scorch.from_coo([[0, 59999], [1, 2]], [1., 2.], (60000, 60000), format="dcsr")
    with pytest.raises(scorch.NotSupportedError, match="dense_fallback_max_bytes"):
        torch.empty_like(H).fill_(1.)


def test_numpy_conversion_error_says_what_converted(x):
    # A + ndarray: torch's __add__ declined the array, numpy then converted A and the error named
    # numpy(), which the user never called
    A = scorch.as_sparse(x, "csr")
    for convert in (lambda: np.asarray(A), lambda: A + np.ones(tuple(x.shape))):
        with pytest.raises(TypeError, match="numpy cannot convert a SparseTensor"):
            convert()
    assert torch.equal(A + torch.as_tensor(np.ones(tuple(x.shape)), dtype=x.dtype), x + 1)
