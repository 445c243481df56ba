"""Property tests: every way into and out of a SparseTensor preserves the dense value exactly.

The oracle is always the dense torch tensor: conversions must give back the
same values (``torch.equal``), the same dtype and the same shape, and the
stored-entry count must match what the format stores.
"""

import contextlib
import math
import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import scorch
from scorch import Format, SparseTensor, compressed, dense, padded, singleton
from scorch.format import resolve

from strategies import (
    ALL_DTYPES, FLOAT_DTYPES, all_formats, assert_dense_equal, assert_dense_equal_nan,
    blocked_matrices, dense_tensors, expected_nnz, fmt_id, level_formats, make_dense, matrices_with_block,
    preset_names, seeds, shapes, tensor_and_random_format, user_formats,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta:UserWarning",
    "ignore:Sparse invariant checks are implicitly disabled:UserWarning",
)

# ROUNDTRIP_EXAMPLES_SCALE=10 runs ten times as many examples (for a longer bug hunt).
_SCALE = float(os.environ.get("ROUNDTRIP_EXAMPLES_SCALE", "1"))


def examples(n: int) -> settings:
    return settings(max_examples=max(1, int(n * _SCALE)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


FAST = examples(40)
MEDIUM = examples(60)


def check_sparse(A, x, fmt, *, check_nnz=True):
    """``A`` is a SparseTensor holding ``x`` in ``fmt``."""
    assert isinstance(A, SparseTensor)
    assert A.format == resolve(fmt, x.dim())
    assert A.shape == x.shape
    assert A.dtype == x.dtype
    assert A.values().dtype == x.dtype and A.values().dim() == 1
    if check_nnz:
        assert A.nnz == expected_nnz(A.format, x), (A.nnz, expected_nnz(A.format, x))
    assert_dense_equal(A.to_dense(), x)


def is_named_sparse(fmt) -> bool:
    """A preset other than "dense": stores exactly the nonzeros of a dense tensor."""
    return isinstance(fmt, str) and fmt != "dense"


# ====================================================================== 1. dense -> format -> dense

@MEDIUM
@given(x=dense_tensors(1, 4), data=st.data())
def test_dense_roundtrip_every_format(x, data):
    block = None
    if x.dim() == 2:
        block = (data.draw(st.sampled_from([d for d in range(1, 4) if x.shape[0] % d == 0])),
                 data.draw(st.sampled_from([d for d in range(1, 4) if x.shape[1] % d == 0])))
    nonzeros = int((x != 0).sum())
    for fmt in all_formats(x.shape, block):
        A = scorch.as_sparse(x, fmt)
        check_sparse(A, x, fmt)
        if is_named_sparse(fmt):
            assert A.nnz == nonzeros
            assert A.density == (nonzeros / x.numel() if x.numel() else 0.0)
        if fmt == "dense":
            assert A.nnz == x.numel()


@MEDIUM
@given(case=blocked_matrices())
def test_dense_roundtrip_bsr_bsc(case):
    x, (bh, bw) = case
    nblocks = int((x.reshape(x.shape[0] // bh, bh, x.shape[1] // bw, bw) != 0).any(3).any(1).sum()) \
        if x.numel() else 0
    for make in (scorch.formats.bsr, scorch.formats.bsc):
        fmt = make(bh, bw)
        A = scorch.as_sparse(x, fmt)
        check_sparse(A, x, fmt)
        assert A.nnz == nblocks * bh * bw
        assert A.values().numel() == nblocks * bh * bw
        assert A.format.name == f"{'bsr' if make is scorch.formats.bsr else 'bsc'}{bh}x{bw}"


@MEDIUM
@given(case=tensor_and_random_format())
def test_dense_roundtrip_random_format(case):
    x, fmt = case
    A = scorch.as_sparse(x, fmt)
    check_sparse(A, x, fmt, check_nnz=False)


@MEDIUM
@given(case=tensor_and_random_format())
def test_nnz_counts_stored_entries_random_format(case):
    x, fmt = case
    A = scorch.as_sparse(x, fmt)
    assert A.nnz == expected_nnz(fmt, x), (fmt, A.nnz, expected_nnz(fmt, x))
    last = max((k for k, lv in enumerate(fmt.levels) if lv.kind != "dense"), default=-1)
    if not fmt.block and last == len(fmt.levels) - 1:
        assert A.nnz == int((x != 0).sum())


PADDED_ABOVE_SPARSE = [
    Format([dense, padded, compressed]),
    Format([dense, padded, compressed], order=(2, 0, 1)),
    Format([dense, padded, compressed(unique=False), singleton]),
    Format([dense, padded, dense, compressed]),
]


@pytest.mark.parametrize("fmt", PADDED_ABOVE_SPARSE, ids=str)
def test_nnz_padded_level_above_sparse_level_example(fmt):
    # level coordinates: parent 0 of the padded level 1 has two children, parent 1 one
    # (so it has an unused slot), parent 2 none
    x = torch.zeros((3,) * fmt.ndim, dtype=torch.float64)
    for lc, v in (((0, 0), 1.5), ((0, 1), -2.0), ((1, 2), 3.0)):
        level_coords = lc + (1,) * (fmt.ndim - 2)
        dims = [0] * fmt.ndim
        for k, o in enumerate(fmt.order):
            dims[o] = level_coords[k]
        x[tuple(dims)] = v
    A = scorch.as_sparse(x, fmt)
    assert_dense_equal(A.to_dense(), x)
    assert A.nnz == expected_nnz(fmt, x)
    if fmt.levels[-1].kind != "dense":
        assert A.nnz == int((x != 0).sum())


@MEDIUM
@given(data=st.data())
def test_nnz_padded_level_above_sparse_level(data):
    fmt = data.draw(st.sampled_from(PADDED_ABOVE_SPARSE))
    x = data.draw(dense_tensors(fmt.ndim, fmt.ndim))
    A = scorch.as_sparse(x, fmt)
    assert_dense_equal(A.to_dense(), x)
    assert A.nnz == expected_nnz(fmt, x), (A.nnz, expected_nnz(fmt, x))
    assert 0 <= A.nnz <= A.values().numel()


EDGE_SHAPES = [(1,), (0,), (1, 1), (0, 3), (3, 0), (0, 0), (4, 0, 2), (1, 1, 1), (2, 0, 3, 1), (1, 1, 1, 1)]


@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=str)
@pytest.mark.parametrize("fill", ["zeros", "full", "one"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_dense_roundtrip_edge_cases(shape, fill, dtype):
    if fill == "zeros":
        x = torch.zeros(shape, dtype=dtype)
    elif fill == "full":
        x = torch.arange(1, 1 + int(np.prod(shape)), dtype=dtype).reshape(shape)
    else:
        x = torch.zeros(shape, dtype=dtype)
        if x.numel():
            x.view(-1)[x.numel() // 2] = -2.5
    block = (1, 1) if len(shape) == 2 else None
    for fmt in all_formats(shape, block):
        A = scorch.as_sparse(x, fmt)
        check_sparse(A, x, fmt)
        if is_named_sparse(fmt):
            assert A.nnz == int((x != 0).sum())
        B = A.asformat("coo")
        assert_dense_equal(B.to_dense(), x)


@MEDIUM
@given(x=dense_tensors(1, 4, dtypes=ALL_DTYPES))
def test_dense_roundtrip_other_dtypes(x):
    for fmt in preset_names(x.dim()) + user_formats(x.dim()):
        A = scorch.as_sparse(x, fmt)
        check_sparse(A, x, fmt)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.uint8, torch.int16, torch.complex64])
def test_dense_roundtrip_more_dtypes(dtype):
    x = make_dense((5, 6), 0.4, 7, torch.int64).to(dtype)
    for fmt in all_formats(x.shape, (1, 2)):
        A = scorch.as_sparse(x, fmt)
        check_sparse(A, x, fmt)


SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, -1e308, 1.0, 0.0]


@FAST
@given(shape=shapes(1, 3), data=st.data(), dtype=st.sampled_from([torch.float64, torch.float32, torch.float16]))
def test_special_float_values(shape, data, dtype):
    n = int(np.prod(shape))
    vals = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=n, max_size=n))
    x = torch.tensor(vals, dtype=torch.float64).reshape(shape).to(dtype)
    stored = int((x != 0).sum())  # NaN counts as nonzero, -0.0 as zero
    for fmt in preset_names(x.dim()) + user_formats(x.dim()):
        A = scorch.as_sparse(x, fmt)
        assert A.dtype == dtype and A.shape == x.shape
        assert_dense_equal_nan(A.to_dense(), x)
        assert_dense_equal_nan(A.asformat("coo").to_dense(), x)
        if is_named_sparse(fmt):
            assert A.nnz == stored


@FAST
@given(x=dense_tensors(1, 4))
def test_numpy_input(x):
    for fmt in ("csr", "coo", "dense"):
        A = scorch.as_sparse(x.numpy(), fmt)
        check_sparse(A, x, fmt)


# ====================================================================== 2. format -> format

@examples(20)
@given(case=matrices_with_block())
def test_format_to_format_every_pair_2d(case):
    x, block = case
    fmts = all_formats(x.shape, block)
    sources = {fmt_id(f): scorch.as_sparse(x, f) for f in fmts}
    for f in fmts:
        A = sources[fmt_id(f)]
        assert A.asformat(f) is A
        assert scorch.as_sparse(A, f) is A
        for g in fmts:
            B = A.asformat(g)
            assert B.format == resolve(g, 2)
            assert B.dtype == x.dtype and B.shape == x.shape
            assert_dense_equal(B.to_dense(), x)


@examples(20)
@given(x=dense_tensors(1, 4))
def test_format_to_format_every_pair_nd(x):
    fmts = preset_names(x.dim()) + user_formats(x.dim())
    for f in fmts:
        A = scorch.as_sparse(x, f)
        assert A.asformat(f) is A
        for g in fmts:
            B = scorch.as_sparse(A, g)
            assert B.format == resolve(g, x.dim())
            assert_dense_equal(B.to_dense(), x)


@MEDIUM
@given(case=tensor_and_random_format(), data=st.data())
def test_random_format_to_random_format(case, data):
    x, f = case
    A = scorch.as_sparse(x, f)
    for _ in range(3):
        g = data.draw(st.sampled_from(["dense", "coo", "csr", "csf", "ell"] + (["csc"] if x.dim() > 1 else []))
                      | st.just(f))
        B = A.asformat(g)
        assert B.format == resolve(g, x.dim())
        assert_dense_equal(B.to_dense(), x)
        C = B.asformat(f)
        assert C.format == f
        assert_dense_equal(C.to_dense(), x)
        A = C


@FAST
@given(x=dense_tensors(1, 4))
def test_asformat_same_format_returns_self(x):
    for f in preset_names(x.dim()) + user_formats(x.dim()):
        A = scorch.as_sparse(x, f)
        assert A.asformat(f) is A
        assert A.asformat(A.format) is A
        assert A.asformat(f, index_dtype=A.index_dtype) is A


@FAST
@given(x=dense_tensors(1, 4), dtype=st.sampled_from(ALL_DTYPES))
def test_clone_and_dtype_moves(x, dtype):
    for f in ("csr", "coo", "ell", "dense"):
        A = scorch.as_sparse(x, f)
        C = A.clone()
        assert isinstance(C, SparseTensor) and C.format == A.format and C.nnz == A.nnz
        assert_dense_equal(C.to_dense(), x)
        if C.values().numel():
            assert C.values().data_ptr() != A.values().data_ptr()
        D = A.to(dtype)
        assert D.dtype == dtype and D.format == A.format
        assert_dense_equal(D.to_dense(), x.to(dtype))
        assert_dense_equal(A.double().to_dense(), x.double())
        assert_dense_equal(A.float().to_dense(), x.float())


# ====================================================================== 3. transposes / permutes

@MEDIUM
@given(case=tensor_and_random_format(), data=st.data())
def test_permute_matches_dense(case, data):
    x, f = case
    A = scorch.as_sparse(x, f)
    perm = tuple(data.draw(st.permutations(range(x.dim()))))
    P = A.permute(perm)
    xp = x.permute(perm)
    assert isinstance(P, SparseTensor)
    assert P.shape == xp.shape and P.dtype == x.dtype and P.nnz == A.nnz
    assert_dense_equal(P.to_dense(), xp.contiguous())
    assert_dense_equal(A.permute(*perm).to_dense(), xp.contiguous())
    assert_dense_equal(torch.permute(A, perm).to_dense(), xp.contiguous())
    # converting the permuted tensor materialises the permuted value
    for g in ("csr", "coo", "dense"):
        assert_dense_equal(P.asformat(g).to_dense(), xp.contiguous())
    # permuting back gives the original format
    inv = [0] * x.dim()
    for i, p in enumerate(perm):
        inv[p] = i
    Q = P.permute(inv)
    assert Q.format == A.format
    assert_dense_equal(Q.to_dense(), x)


@MEDIUM
@given(case=tensor_and_random_format(), data=st.data())
def test_transpose_matches_dense(case, data):
    x, f = case
    A = scorch.as_sparse(x, f)
    n = x.dim()
    a = data.draw(st.integers(-n, n - 1))
    b = data.draw(st.integers(-n, n - 1))
    T = A.transpose(a, b)
    xt = x.transpose(a, b).contiguous()
    assert T.shape == xt.shape
    assert_dense_equal(T.to_dense(), xt)
    assert_dense_equal(torch.transpose(A, a, b).to_dense(), xt)
    assert_dense_equal(T.asformat("csr").to_dense(), xt)
    assert_dense_equal(A.T.to_dense(), x.permute(*reversed(range(n))).contiguous())
    if n >= 2:
        assert_dense_equal(A.mT.to_dense(), x.transpose(-2, -1).contiguous())


@MEDIUM
@given(case=matrices_with_block())
def test_t_2d_every_format(case):
    x, block = case
    for f in all_formats(x.shape, block):
        A = scorch.as_sparse(x, f)
        T = A.t()
        assert T.shape == (x.shape[1], x.shape[0]) and T.nnz == A.nnz
        assert_dense_equal(T.to_dense(), x.t().contiguous())
        assert_dense_equal(torch.t(A).to_dense(), x.t().contiguous())
        assert_dense_equal(T.asformat("csr").to_dense(), x.t().contiguous())
        assert_dense_equal(T.asformat("csc").to_dense(), x.t().contiguous())
        assert_dense_equal(T.to_torch().to_dense(), x.t().contiguous())
        assert_dense_equal(T.t().to_dense(), x)
    # csr transposed is csc of the transpose (no copy)
    A = scorch.as_sparse(x, "csr")
    assert A.t().format == scorch.formats.csc
    assert A.t()._vals is A._vals


@FAST
@given(x=dense_tensors(1, 1))
def test_t_1d_is_identity(x):
    A = scorch.as_sparse(x, "csr")
    assert_dense_equal(A.t().to_dense(), x)


# ====================================================================== 4. torch.sparse

def _torch_layouts(x, block):
    bh, bw = block
    return {
        "coo": x.to_sparse(),
        "csr": x.to_sparse_csr(),
        "csc": x.to_sparse_csc(),
        "bsr": x.to_sparse_bsr((bh, bw)),
        "bsc": x.to_sparse_bsc((bh, bw)),
    }


@MEDIUM
@given(case=matrices_with_block(dtypes=FLOAT_DTYPES + (torch.int64,)))
def test_from_torch_sparse_2d(case):
    x, block = case
    fmts = ["csr", "csc", "coo", "dcsr", "ell", "dense",
            scorch.formats.bsr(*block), scorch.formats.bsc(*block), Format([compressed, dense])]
    for name, t in _torch_layouts(x, block).items():
        for f in fmts:
            A = scorch.as_sparse(t, f)
            assert A.format == resolve(f, 2)
            assert A.dtype == x.dtype and A.shape == x.shape
            assert_dense_equal(A.to_dense(), x)
        # the default format is csr
        assert scorch.as_sparse(t).format == scorch.formats.csr


@MEDIUM
@given(case=matrices_with_block())
def test_from_torch_compressed_same_layout_keeps_nnz(case):
    x, (bh, bw) = case
    layouts = _torch_layouts(x, (bh, bw))
    for name, f in (("csr", "csr"), ("csc", "csc"), ("coo", "coo"),
                    ("bsr", scorch.formats.bsr(bh, bw)), ("bsc", scorch.formats.bsc(bh, bw))):
        t = layouts[name]
        A = scorch.as_sparse(t, f)
        assert_dense_equal(A.to_dense(), x)
        stored = t._nnz() if name == "coo" else t.values().numel()
        assert A.values().numel() == stored


@MEDIUM
@given(case=matrices_with_block(dtypes=FLOAT_DTYPES + (torch.int64, torch.bfloat16)))
def test_to_torch_every_format_2d(case):
    x, block = case
    expected_layout = {"dense": torch.strided, "csr": torch.sparse_csr, "csc": torch.sparse_csc}
    for f in all_formats(x.shape, block):
        A = scorch.as_sparse(x, f)
        t = A.to_torch()
        assert t.dtype == x.dtype and t.shape == x.shape
        if isinstance(f, str):
            assert t.layout == expected_layout.get(f, torch.sparse_coo), (f, t.layout)
        elif f.name and f.name.startswith("bsr"):
            assert t.layout == torch.sparse_bsr
        elif f.name and f.name.startswith("bsc"):
            assert t.layout == torch.sparse_bsc
        if t.layout == torch.sparse_coo:
            assert t.is_coalesced()
        dense_t = t if t.layout == torch.strided else t.to_dense()
        assert_dense_equal(dense_t, x)
        # and back in
        assert_dense_equal(scorch.as_sparse(t, f).to_dense(), x)


@MEDIUM
@given(x=dense_tensors(3, 4), name=st.sampled_from(["csr", "csc"]))
def test_to_torch_batched_csr_csc(x, name):
    A = scorch.as_sparse(x, name)
    t = A.to_torch()
    assert t.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)
    assert t.dtype == x.dtype and t.shape == x.shape
    assert_dense_equal(t.to_dense(), x)


@MEDIUM
@given(x=dense_tensors(1, 4))
def test_to_torch_every_format_nd(x):
    for f in preset_names(x.dim()) + user_formats(x.dim()):
        A = scorch.as_sparse(x, f)
        t = A.to_torch()
        assert t.dtype == x.dtype and t.shape == x.shape
        dense_t = t if t.layout == torch.strided else t.to_dense()
        assert_dense_equal(dense_t, x)


@MEDIUM
@given(case=tensor_and_random_format())
def test_to_torch_random_format(case):
    x, f = case
    A = scorch.as_sparse(x, f)
    t = A.to_torch()
    dense_t = t if t.layout == torch.strided else t.to_dense()
    assert_dense_equal(dense_t, x)


@st.composite
def uncoalesced_coo(draw, min_dims=1, max_dims=4):
    """``(t, shape)``: an uncoalesced torch COO tensor with duplicate, unsorted indices and
    small-integer float64 values (sums are exact in any order)."""
    shape = draw(shapes(min_dims, max_dims))
    assume(all(s > 0 for s in shape))
    nnz = draw(st.integers(0, 30))
    g = torch.Generator().manual_seed(draw(seeds))
    idx = torch.stack([torch.randint(0, s, (nnz,), generator=g) for s in shape]) \
        if nnz else torch.zeros((len(shape), 0), dtype=torch.int64)
    if nnz and draw(st.booleans()):  # force duplicates
        idx = torch.cat([idx, idx[:, : max(1, nnz // 2)]], 1)
    vals = torch.randint(-4, 5, (idx.shape[1],), generator=g).to(torch.float64)
    t = torch.sparse_coo_tensor(idx, vals, shape)
    assert not t.is_coalesced() or idx.shape[1] <= 1
    return t, shape


@MEDIUM
@given(case=uncoalesced_coo())
def test_uncoalesced_torch_coo_sums_duplicates(case):
    t, shape = case
    expected = t.coalesce().to_dense()
    for f in preset_names(len(shape)) + user_formats(len(shape)):
        A = scorch.as_sparse(t, f)
        assert A.shape == torch.Size(shape) and A.dtype == torch.float64
        assert_dense_equal(A.to_dense(), expected)
    A = scorch.as_sparse(t, "coo")
    coalesced = t.coalesce()
    # same entries as torch's coalesce (duplicates summed, sorted, explicit zero sums kept or not)
    idx, vals = A.coo()
    assert idx.dtype == torch.int64 and idx.shape[0] == len(shape)
    keep = coalesced.values() != 0
    back = torch.sparse_coo_tensor(idx, vals, shape).coalesce()
    assert torch.equal(back.indices()[:, back.values() != 0], coalesced.indices()[:, keep])
    assert torch.equal(back.values()[back.values() != 0], coalesced.values()[keep])


@MEDIUM
@given(x=dense_tensors(2, 4), data=st.data())
def test_hybrid_torch_coo(x, data):
    sparse_dim = data.draw(st.integers(1, x.dim()))
    t = x.to_sparse(sparse_dim=sparse_dim)
    assert t.dense_dim() == x.dim() - sparse_dim
    for f in preset_names(x.dim()) + user_formats(x.dim())[:2]:
        A = scorch.as_sparse(t, f)
        assert A.shape == x.shape and A.dtype == x.dtype
        assert_dense_equal(A.to_dense(), x)


@MEDIUM
@given(x=dense_tensors(1, 4))
def test_nd_torch_coo(x):
    t = x.to_sparse()
    for f in preset_names(x.dim()) + user_formats(x.dim()):
        A = scorch.as_sparse(t, f)
        check_sparse(A, x, f)
    # uncoalesced copy of the same entries, listed backwards
    idx, vals = t.indices(), t.values()
    u = torch.sparse_coo_tensor(idx.flip(1), vals.flip(0), x.shape)
    assert_dense_equal(scorch.as_sparse(u, "csr").to_dense(), x)


@FAST
@given(x=dense_tensors(3, 3))
def test_batched_torch_csr(x):
    # torch's batched CSR needs the same nnz in every batch: give each batch the same pattern
    assume(x.shape[0] > 0)  # torch cannot make a batched CSR with no batches
    pattern = x[0] != 0
    x = torch.where(pattern, torch.where(x == 0, 1.0, x), 0.0)
    t = x.to_sparse_csr()
    for f in ("csr", "coo", "dense", "csf"):
        A = scorch.as_sparse(t, f)
        assert_dense_equal(A.to_dense(), x)


# ====================================================================== 5. scipy

@MEDIUM
@given(case=matrices_with_block(dtypes=FLOAT_DTYPES + (torch.int64,)))
def test_from_scipy(case):
    sp = pytest.importorskip("scipy.sparse")
    x, (bh, bw) = case
    a = x.numpy()
    inputs = [sp.csr_array(a), sp.csc_array(a), sp.coo_array(a), sp.bsr_array(a, blocksize=(bh, bw)),
              sp.csr_matrix(a), sp.csc_matrix(a), sp.coo_matrix(a), sp.dok_array(a) if a.size else sp.coo_array(a)]
    fmts = ["csr", "csc", "coo", "dense", "ell", "dcsc", scorch.formats.bsr(bh, bw), scorch.formats.bsc(bh, bw)]
    for s in inputs:
        for f in fmts:
            A = scorch.as_sparse(s, f)
            assert A.format == resolve(f, 2)
            assert A.dtype == x.dtype and A.shape == x.shape
            assert_dense_equal(A.to_dense(), x)


@MEDIUM
@given(case=uncoalesced_coo(2, 2))
def test_from_scipy_coo_with_duplicates(case):
    sp = pytest.importorskip("scipy.sparse")
    t, shape = case
    idx, vals = t._indices().numpy(), t._values().numpy()
    expected = t.coalesce().to_dense()
    for s in (sp.coo_array((vals, (idx[0], idx[1])), shape=shape),
              sp.coo_matrix((vals, (idx[0], idx[1])), shape=shape)):
        for f in ("csr", "coo", "csc", "dense"):
            assert_dense_equal(scorch.as_sparse(s, f).to_dense(), expected)


@MEDIUM
@given(case=matrices_with_block(dtypes=FLOAT_DTYPES + (torch.int64,)))
def test_to_scipy_every_format(case):
    sp = pytest.importorskip("scipy.sparse")
    x, block = case
    a = x.numpy()
    for f in all_formats(x.shape, block):
        A = scorch.as_sparse(x, f)
        s = A.to_scipy()
        assert sp.issparse(s)
        assert s.shape == a.shape and s.dtype == a.dtype
        if f == "csr":
            assert s.format == "csr"
        elif f == "csc":
            assert s.format == "csc"
        elif not isinstance(f, str) and f.name and f.name.startswith("bsr"):
            assert s.format == "bsr"
        out = s.toarray()
        assert out.dtype == a.dtype and np.array_equal(out, a)
        # transposed tensors too
        st_ = A.t().to_scipy()
        assert np.array_equal(st_.toarray(), a.T)
        # and back in
        assert_dense_equal(scorch.as_sparse(s, f).to_dense(), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "dense"])
def test_to_scipy_half_precision(dtype, fmt):
    pytest.importorskip("scipy.sparse")
    x = make_dense((4, 5), 0.5, 3, dtype)
    A = scorch.as_sparse(x, fmt)
    out = A.to_scipy().toarray()
    # numpy has no bfloat16; the values must come back exactly (upcast allowed)
    assert np.array_equal(out.astype(np.float64), x.double().numpy())


# ====================================================================== 6. sparse_coo

@st.composite
def coo_parts(draw, min_dims=1, max_dims=4):
    shape = draw(shapes(min_dims, max_dims))
    nnz = draw(st.integers(0, 40)) if all(s > 0 for s in shape) else 0
    g = torch.Generator().manual_seed(draw(seeds))
    if nnz:
        idx = torch.stack([torch.randint(0, s, (nnz,), generator=g) for s in shape])
        if draw(st.booleans()):
            extra = idx[:, torch.randint(0, nnz, (nnz,), generator=g)]
            idx = torch.cat([idx, extra], 1)[:, torch.randperm(2 * nnz, generator=g)]
    else:
        idx = torch.zeros((len(shape), 0), dtype=torch.int64)
    kind = draw(st.sampled_from(["float64", "int64", "float32-int"]))
    small = torch.randint(-5, 6, (idx.shape[1],), generator=g)
    if kind == "float64":
        vals = torch.randn(idx.shape[1], generator=g, dtype=torch.float64).round(decimals=3)
    elif kind == "int64":
        vals = small
    else:  # small integers are exact in float32 whatever the summation order
        vals = small.to(torch.float32)
    return idx, vals, shape


def coo_oracle(idx, vals, shape):
    return torch.zeros(shape, dtype=vals.dtype).index_put_(tuple(idx), vals, accumulate=True)


@examples(80)
@given(parts=coo_parts())
def test_sparse_coo_sums_duplicates(parts):
    idx, vals, shape = parts
    expected = coo_oracle(idx, vals, shape)
    for f in preset_names(len(shape)) + user_formats(len(shape)):
        A = scorch.from_coo(idx, vals, shape, format=f)
        assert A.format == resolve(f, len(shape))
        assert A.shape == torch.Size(shape) and A.dtype == vals.dtype
        assert_dense_equal(A.to_dense(), expected)


@MEDIUM
@given(parts=coo_parts(2, 2), data=st.data())
def test_sparse_coo_blocked(parts, data):
    idx, vals, shape = parts
    bh = data.draw(st.sampled_from([d for d in range(1, 4) if shape[0] % d == 0]))
    bw = data.draw(st.sampled_from([d for d in range(1, 4) if shape[1] % d == 0]))
    expected = coo_oracle(idx, vals, shape)
    for f in (scorch.formats.bsr(bh, bw), scorch.formats.bsc(bh, bw)):
        assert_dense_equal(scorch.from_coo(idx, vals, shape, format=f).to_dense(), expected)


@MEDIUM
@given(parts=coo_parts(), data=st.data())
def test_sparse_coo_random_format_and_inputs(parts, data):
    idx, vals, shape = parts
    f = data.draw(st.one_of(st.sampled_from(preset_names(len(shape))), level_formats(len(shape))))
    expected = coo_oracle(idx, vals, shape)
    # indices as int32 tensor, numpy array or nested lists; values as numpy
    lists = [idx.tolist()] if idx.shape[1] else []  # (empty lists: see test_sparse_coo_empty_lists)
    for ind in [idx, idx.to(torch.int32), idx.numpy()] + lists:
        A = scorch.from_coo(ind, vals.numpy() if isinstance(ind, np.ndarray) else vals, shape, format=f)
        assert_dense_equal(A.to_dense(), expected)
    if idx.shape[1]:
        inferred = tuple(int(m) + 1 for m in idx.max(1).values)
        B = scorch.from_coo(idx, vals, format=f)
        assert B.shape == torch.Size(inferred)
        assert_dense_equal(B.to_dense(), coo_oracle(idx, vals, inferred))


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_sparse_coo_empty_lists(ndim):
    # torch.sparse_coo_tensor([[], []], [], (2, 3)) is an empty tensor; so should this be
    shape = (2, 3, 4)[:ndim]
    A = scorch.from_coo([[] for _ in range(ndim)], [], shape, format="csr")
    assert A.shape == torch.Size(shape) and A.nnz == 0
    assert torch.equal(A.to_dense(), torch.zeros(shape, dtype=A.dtype))


@FAST
@given(parts=coo_parts())
def test_sparse_coo_scalar_value(parts):
    idx, _, shape = parts
    A = scorch.from_coo(idx, 2.0, shape, format="csr")
    expected = coo_oracle(idx, torch.full((idx.shape[1],), 2.0, dtype=torch.float64), shape)
    assert A.dtype == expected.dtype or A.dtype == torch.float32
    assert torch.equal(A.to_dense().to(expected.dtype), expected)


# ====================================================================== 7. index_dtype

def index_arrays(A):
    n = len(A.format.levels)
    return [t for k in range(n) for t in (A.pos(k), A.crd(k)) if t is not None]


@MEDIUM
@given(case=tensor_and_random_format())
def test_index_dtype_int64_on_request(case):
    x, f = case
    A = scorch.as_sparse(x, f, index_dtype=torch.int64)
    assert_dense_equal(A.to_dense(), x)
    arrays = index_arrays(A)
    assert all(t.dtype == torch.int64 for t in arrays)
    if arrays:
        assert A.index_dtype == torch.int64
    B = scorch.as_sparse(x, f)
    assert all(t.dtype == torch.int32 for t in index_arrays(B))
    assert B.index_dtype == torch.int32
    # same storage apart from the index width
    for a, b in zip(arrays, index_arrays(B)):
        assert torch.equal(a, b.to(torch.int64))
    assert torch.equal(A.values(), B.values())
    # width survives conversions, and can be changed on request
    if arrays:
        for g in preset_names(x.dim()):
            C = A.asformat(g)
            assert all(t.dtype == torch.int64 for t in index_arrays(C))
            assert_dense_equal(C.to_dense(), x)
        D = A.asformat(f, index_dtype=torch.int32)
        assert D.index_dtype == torch.int32 and all(t.dtype == torch.int32 for t in index_arrays(D))
        assert_dense_equal(D.to_dense(), x)
        E = B.asformat("coo", index_dtype=torch.int64)
        assert E.index_dtype == torch.int64
        assert_dense_equal(E.to_dense(), x)


@MEDIUM
@given(case=matrices_with_block())
def test_index_dtype_int64_from_torch_and_scipy(case):
    x, block = case
    sources = list(_torch_layouts(x, block).values())
    sp = None
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover
        pass
    if sp is not None:
        sources += [sp.csr_array(x.numpy()), sp.coo_array(x.numpy())]
    for s in sources:
        for f in ("csr", "coo", "ell", scorch.formats.bsr(*block)):
            A = scorch.as_sparse(s, f, index_dtype=torch.int64)
            assert A.index_dtype == torch.int64
            assert all(t.dtype == torch.int64 for t in index_arrays(A))
            assert_dense_equal(A.to_dense(), x)
            B = scorch.as_sparse(s, f)
            assert B.index_dtype == torch.int32
            assert_dense_equal(B.to_dense(), x)


@FAST
@given(parts=coo_parts())
def test_index_dtype_sparse_coo(parts):
    idx, vals, shape = parts
    for f in ("coo", "csr", "ell"):
        A = scorch.from_coo(idx, vals, shape, format=f, index_dtype=torch.int64)
        assert A.index_dtype == torch.int64 and all(t.dtype == torch.int64 for t in index_arrays(A))
        assert_dense_equal(A.to_dense(), coo_oracle(idx, vals, shape))


@FAST
@given(x=dense_tensors(2, 2))
def test_index_dtype_survives_to_torch_and_scipy(x):
    A = scorch.as_sparse(x, "csr", index_dtype=torch.int64)
    t = A.to_torch()
    assert t.crow_indices().dtype == torch.int64
    assert_dense_equal(t.to_dense(), x)
    B = scorch.as_sparse(x, "csr")
    assert B.to_torch().crow_indices().dtype == torch.int32
    assert_dense_equal(B.to_torch().to_dense(), x)


# ====================================================================== exotic but valid formats

def test_nonunique_padded_level_is_rejected():
    # A padded (ELL) level holds one slot per distinct coordinate: nonunique is refused up front.
    with pytest.raises(ValueError, match="padded level is always unique"):
        Format([padded(unique=False), singleton])


@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_to_csr_owns_its_arrays(ndim, index):
    """COO parts already in CSR order (sorted, no duplicates: no sort, no sum) -> CSR and batched
    CSR: the result's arrays are its own, so writing into the caller's values or into another
    tensor's leaves it as it was (oracle: dense copies taken before the writes), and its
    coordinates are not a view into a larger array."""
    g = torch.Generator().manual_seed(ndim)
    shape = (3, 5, 6)[-ndim:]
    flat = torch.randperm(math.prod(shape), generator=g)[:20].sort().values
    idx = torch.stack(torch.unravel_index(flat, shape))
    vals = torch.randn(20, generator=g, dtype=torch.float64)
    want = torch.zeros(shape, dtype=torch.float64).index_put_(tuple(idx), vals)
    csr = scorch.from_coo(idx, vals, shape, format="csr", index_dtype=index)
    vals.mul_(3)
    torch.testing.assert_close(csr.to_dense(), want)
    coo = scorch.from_coo(idx, vals, shape)
    csr2 = coo.asformat("csr")
    csr2.values().mul_(2)
    torch.testing.assert_close(coo.to_dense(), 3 * want)
    crd = csr.crd(ndim - 1)
    assert crd.dtype == index and crd.untyped_storage().nbytes() == crd.numel() * crd.element_size()


@pytest.mark.parametrize("shape, density", [((0, 5), 0.0), ((7, 0), 0.0), ((6, 9), 0.0), ((6, 9), 0.3), ((40, 3), 0.9)])
@pytest.mark.parametrize("index", [None, torch.int32, torch.int64])
def test_coo_to_csr_direct(shape, density, index):
    """COO -> CSR counts the rows' entries directly (no coordinates pass): the same tensor as the
    general path gives (via DCSR), the dense oracle's values, empty rows and shapes included."""
    g = torch.Generator().manual_seed(int(density * 10) + shape[0])
    d = torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < density)
    coo = scorch.as_sparse(d, "coo")
    got = coo.asformat("csr", index_dtype=index)
    via = coo.asformat("dcsr").asformat("csr", index_dtype=index)
    assert got.format == scorch.formats.preset("csr", 2) and got.index_dtype == via.index_dtype
    for a, b in zip(got._pos + got._crd, via._pos + via._crd):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(got.to_dense(), d) and got.nnz == int((d != 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                                   torch.bool, torch.complex64, torch.complex128, torch.uint8])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(7, 9), (1, 5), (6, 1), (0, 4), (4, 0), (50, 3)])
def test_csr_csc_recompression_every_dtype(dtype, index_dtype, shape):
    # CSR <-> CSC by the generated counting sort (values moved as 4- / 8-byte words, other widths
    # through the entry order): same matrix as dense torch, sorted, and back to the same storage
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3).to(dtype) * (torch.rand(shape, generator=g) < 0.4)
    x[0:1, 0:1] = 0  # an empty corner: empty rows and columns happen
    A = scorch.as_sparse(x, "csr", index_dtype=index_dtype)
    C = A.asformat("csc")
    assert C.format == resolve("csc", 2) and C.index_dtype == index_dtype and C.dtype == dtype
    assert torch.equal(C.to_dense(), x)
    t = x.t().contiguous() if x.numel() else x.t()
    ref = scorch.as_sparse(t, "csr", index_dtype=index_dtype)  # CSC storage is the transpose's CSR
    assert torch.equal(C.pos(1), ref.pos(1)) and torch.equal(C.crd(1), ref.crd(1))
    assert torch.equal(C.values(), ref.values())
    B = C.asformat("csr")
    assert torch.equal(B.pos(1), A.pos(1)) and torch.equal(B.crd(1), A.crd(1)) and torch.equal(B.values(), A.values())
    # COO <-> CSR / CSC take the same road (no sort): the storage the general builder gives
    O = scorch.as_sparse(x, "coo", index_dtype=index_dtype)
    for got in (A.asformat("coo"), C.asformat("coo")):
        assert got.format == O.format and got.index_dtype == index_dtype
        assert torch.equal(got.crd(0), O.crd(0)) and torch.equal(got.crd(1), O.crd(1))
        assert torch.equal(got.values(), O.values()) and torch.equal(got.pos(0), O.pos(0))
    C2 = O.asformat("csc")
    assert torch.equal(C2.pos(1), C.pos(1)) and torch.equal(C2.crd(1), C.crd(1)) and torch.equal(C2.values(), C.values())
    wide = A.asformat("csc", index_dtype=torch.int64)  # another index width: the general path
    assert wide.index_dtype == torch.int64 and torch.equal(wide.to_dense(), x)


def test_recompression_source_is_generated():
    from scorch.compiler import recompress
    src = recompress.source("int64_t", "uint64_t")
    assert "void recompress_int64_t_uint64_t" in src and "cur[k] = (d + 1)" in src


def test_recompression_remembers_the_pattern_not_the_values():
    # the entry order of a pattern's CSR <-> CSC is kept on its coordinate array: new values on
    # the same pattern follow it, and the same coordinates under other row positions do not reuse it
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64) * (torch.rand(8, 6, generator=g) < 0.5)
    A = scorch.as_sparse(x, "csr")
    assert torch.equal(A.asformat("csc").to_dense(), x)
    B = A._like(values=torch.randn(A.nnz, generator=g, dtype=torch.float64), nnz=A.nnz)
    assert torch.equal(B.asformat("csc").to_dense(), B.to_dense())
    H = A._like(values=A.values().half(), nnz=A.nnz)  # 2-byte values: through the entry order
    assert torch.equal(H.asformat("csc").to_dense(), x.half())
    crd = torch.tensor([0, 1, 2, 3], dtype=torch.int32)  # one coordinate array, two row splits
    for pos in ([0, 2, 4, 4], [0, 4, 4, 4], [0, 1, 1, 4]):
        C = scorch.SparseTensor.from_levels("csr", (3, 4), [None, torch.tensor(pos, dtype=torch.int32)],
                                            [None, crd], torch.arange(1.0, 5.0))
        assert torch.equal(C.asformat("csc").to_dense(), C.to_dense())


def test_transposing_back_and_forth_keeps_two_patterns_not_a_chain():
    """x = x.t().asformat("csr") in a loop: the way back reuses the first pattern's arrays (each
    result's remembered recompression held the next: a pattern per step stayed alive while the
    first one did); a pattern rewritten by its owner is recompressed afresh; oracle: dense."""
    import weakref
    g = torch.Generator().manual_seed(2)
    d = torch.randn(50, 40, generator=g) * (torch.rand(50, 40, generator=g) < 0.2)
    A = scorch.as_sparse(d, "csr")
    x, seen = A, []
    for i in range(6):
        x = x.t().asformat("csr").with_values(x.t().asformat("csr").values().clone())
        seen.append(weakref.ref(x._crd[1]))
        assert torch.equal(x.to_dense(), d.t() if i % 2 == 0 else d)
    assert x._crd[1] is A._crd[1]
    del x
    import gc
    gc.collect()
    assert len({id(r()) for r in seen if r() is not None}) == 2   # A's and its transpose's, nothing else
    int32 = lambda c: torch.sparse_csr_tensor(c.crow_indices().int(), c.col_indices().int(), c.values(), c.shape,  # noqa: E731
                                              check_invariants=True)
    t = int32(torch.tensor([[0., 1, 0], [2, 0, 3]]).to_sparse_csr())   # (int32: taken without a copy)
    B = scorch.as_sparse(t)
    assert torch.equal(B.asformat("csc").to_dense(), t.to_dense())
    t2 = int32(torch.tensor([[4., 0, 5], [0, 6, 0]]).to_sparse_csr())
    C = B.t().asformat("csr")   # (B's transpose remembered, and the way back to B's arrays)
    t.copy_(t2)   # (its owner rewrites the arrays B took without a copy)
    assert torch.equal(B.asformat("csc").to_dense(), t2.to_dense())
    assert torch.equal(C.t().asformat("csr").to_dense(), C.to_dense().t())   # not B's rewritten pattern


PLAIN2 = ["csr", "csc", "dcsr", "dcsc", "coo", "ell"]


@pytest.mark.parametrize("src", PLAIN2)
@pytest.mark.parametrize("dst", PLAIN2)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_plain_2d_conversions_give_the_builders_storage(src, dst, index_dtype):
    # among CSR / CSC / DCSR / DCSC / COO / ELL no conversion sorts (outer levels expanded or
    # compressed, the counting sort between orders): the storage equals what the general
    # builder makes from the dense matrix, and never aliases the source's buffers
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 7, generator=g, dtype=torch.float64) * (torch.rand(9, 7, generator=g) < 0.3)
    x[2] = 0
    x[:, 5] = 0  # empty rows and columns
    A = scorch.as_sparse(x, src, index_dtype=index_dtype)
    B = A.asformat(dst)
    want = scorch.as_sparse(x, dst, index_dtype=index_dtype)
    assert B.format == want.format and B.index_dtype == index_dtype
    for k in range(2):
        for mine, theirs in ((B._pos[k], want._pos[k]), (B._crd[k], want._crd[k])):
            assert (mine is None) == (theirs is None) and (mine is None or torch.equal(mine, theirs))
    assert torch.equal(B.values(), want.values())
    if src != dst:
        B.values().add_(1)
        assert torch.equal(A.to_dense(), x)  # the source is untouched


@pytest.mark.parametrize("block", [(2, 2), (1, 3), (3, 1), (2, 3)])
@pytest.mark.parametrize("dst", [f for f in PLAIN2 if f != "ell"])  # BSR -> ELL takes the general path
@pytest.mark.parametrize("shape", [(6, 12), (0, 6), (6, 0), (12, 6)])
def test_bsr_to_plain_formats_without_sorting(block, dst, shape):
    # BSR -> CSR places each block's values in row order (no sort), explicit zeros of the blocks
    # kept: the same storage the general path gives from the BSR's own stored entries
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < 0.15)
    for index_dtype in (torch.int32, torch.int64):
        B = scorch.as_sparse(x, scorch.formats.bsr(*block), index_dtype=index_dtype)
        got = B.asformat(dst)
        coords, vals = B.coo()
        fmt = resolve(dst, 2)
        (pos, crd), want_vals = scorch.convert.build(fmt, B.shape, coords, vals, index_dtype)
        assert got.format == fmt and got.index_dtype == index_dtype and got.nnz == B.nnz
        for k in range(2):
            for mine, theirs in ((got._pos[k], pos[k]), (got._crd[k], crd[k])):
                assert (mine is None) == (theirs is None) and (mine is None or torch.equal(mine, theirs))
        assert torch.equal(got.values(), want_vals) and torch.equal(got.to_dense(), x)


@contextlib.contextmanager
def copy_kernel_always():
    """to_dense through the generated copy kernel from the first stored entry (not 4096), from a
    signature's second call on."""
    from scorch.compiler import build
    if not build.have_compiler():
        pytest.skip("no C compiler")
    module = sys.modules["scorch.tensor"]   # (the attribute scorch.tensor is torch's)
    saved, module._KERNEL_DENSE_MIN = module._KERNEL_DENSE_MIN, 0
    try:
        yield
    finally:
        module._KERNEL_DENSE_MIN = saved


@pytest.mark.parametrize("shape", [(7, 9), (4, 6), (3, 4, 5), (4, 6, 0, 2), (12,)])
def test_to_dense_by_the_copy_kernel_every_format(shape):
    """The generated copy kernel's to_dense (every preset, the user formats, BSR / BSC, both
    float dtypes, empty and zero-size tensors) equals the dense tensor the operand came from."""
    with copy_kernel_always():
        _copies_every_format(shape)


def _copies_every_format(shape):
    for dtype in FLOAT_DTYPES:
        for density in (0.0, 0.3, 1.0):
            x = make_dense(shape, density, seed=len(shape), dtype=dtype)
            for fmt in all_formats(shape, block=(2, 3) if shape == (4, 6) else None):
                A = scorch.as_sparse(x, fmt)
                for _ in range(2):   # a signature's first call takes the coordinates' path
                    assert_dense_equal(A.to_dense(), x)


@examples(40)
@given(case=tensor_and_random_format())
def test_to_dense_by_the_copy_kernel_random_format(case):
    x, fmt = case
    A = scorch.as_sparse(x, fmt)
    with copy_kernel_always():
        for _ in range(2):   # a signature's first call takes the coordinates' path
            assert_dense_equal(A.to_dense(), x)


# ====================================================================== 6. foreign arrays, checked

def _malformed():
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 10**9]]), torch.ones(2), (4, 4), check_invariants=False)
    csr = torch.sparse_csr_tensor(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 10**9, 2, 3]), torch.ones(4),
                                  (4, 4), check_invariants=False)
    return coo, csr


@pytest.mark.parametrize("call", [
    lambda A, X, coo, csr: torch.cdist(A, coo), lambda A, X, coo, csr: torch.addmm(csr, A, X),
    lambda A, X, coo, csr: torch.nn.functional.linear(X, A, coo), lambda A, X, coo, csr: A.index_add(0, torch.tensor([0]), coo),
    lambda A, X, coo, csr: torch.polar(A, coo), lambda A, X, coo, csr: torch.addmm(input=csr, mat1=A, mat2=X),
    lambda A, X, coo, csr: torch.linalg.solve(A, coo)])
def test_a_malformed_torch_sparse_operand_beside_a_sparse_tensor_is_refused(call):
    """torch's kernels trust a torch.sparse tensor's indices (built with check_invariants=False,
    they may point anywhere: the process died); beside a SparseTensor they are checked first."""
    A, X = scorch.as_sparse(torch.eye(4), "csr"), torch.randn(4, 4)
    with pytest.raises(ValueError, match="out of range|must lie in"):
        call(A, X, *_malformed())


def test_values_sharing_memory_with_an_index_array_are_refused(tmp_path):
    """Values that are an index array (a crafted file, a view) would let a write into the values
    (an optimizer step) rewrite the pattern; refused wherever storage comes in."""
    crow, col = torch.arange(5, dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"values share memory with crd\[1\]"):
        SparseTensor.from_levels("csr", (4, 4), [None, crow], [None, col], col)
    with pytest.raises(ValueError, match="share memory"):
        scorch.as_sparse(torch.sparse_csr_tensor(crow, col, col.view(torch.float32), (4, 4)))
    A = SparseTensor.from_levels("csr", (4, 4), [None, crow], [None, col], col.clone())
    torch.testing.assert_close(A.to_dense(), torch.diag(torch.arange(4, dtype=torch.int32)))


def test_a_pattern_rewritten_by_its_owner_is_read_afresh():
    """A torch CSR taken without a copy and then rewritten in place by its owner (to another valid
    pattern): the per-entry data kept with its positions is rebuilt (a stale copy crashed SpMV)."""
    import warnings
    warnings.simplefilter("ignore")
    g = torch.Generator().manual_seed(0)
    D1 = torch.rand(300, 300, generator=g) * (torch.rand(300, 300, generator=g) < 0.05)
    D2 = D1.flip(0).t().contiguous()
    t1, t2 = (torch.sparse_csr_tensor(d.to_sparse_csr().crow_indices().int(), d.to_sparse_csr().col_indices().int(),
                                      d.to_sparse_csr().values(), d.shape) for d in (D1, D2))
    assert t1.values().numel() == t2.values().numel()   # (a copy_ needs the same count)
    A = scorch.as_sparse(t1)
    v = torch.randn(300)
    torch.testing.assert_close(A @ v, D1 @ v)
    t1.copy_(t2)
    torch.testing.assert_close(A @ v, D2 @ v)


def test_a_scipy_matrix_with_spare_capacity_keeps_only_its_entries():
    """scipy allows index / data arrays longer than indptr[-1] (capacity); the tail is no entry (it
    was read into rows taken from uninitialised memory); oracle: scipy's own toarray."""
    sp = pytest.importorskip("scipy.sparse")
    for make in (sp.csr_array, sp.csc_array):
        m = make((np.array([1., 2, 3]), np.array([0, 2, 1]), np.array([0, 1, 3, 3])), shape=(3, 3))
        m.indices, m.data = np.concatenate([m.indices, [1, 1]]), np.concatenate([m.data, [7., 7.]])
        A = scorch.as_sparse(m, "csr")
        assert A.nnz == 3
        torch.testing.assert_close(A.to_dense(), torch.from_numpy(m.toarray()))


def test_boundary_shapes_and_batches_are_checked():
    """A float size is refused (it was truncated), a 0-d numpy array is a scalar as a 0-d tensor is
    (it became shape (1,)), a batched torch CSR whose parts disagree names them (torch's reshape
    error), an ELL padding every row to one dense row is refused before its allocation (80 GB)."""
    with pytest.raises(TypeError, match="shape must be a sequence of ints"):
        scorch.from_coo([[0], [1]], [1.0], (4.5, 4))
    with pytest.raises(ValueError, match="0-d"):
        scorch.as_sparse(np.array(1.0))
    b = (torch.randn(3, 4, 5) * (torch.rand(1, 4, 5) < 0.4)).to_sparse_csr()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        short = torch.sparse_csr_tensor(b.crow_indices()[:2], b.col_indices(), b.values(), b.shape, check_invariants=False)
    with pytest.raises(ValueError, match="disagree on the batch"):
        scorch.as_sparse(short)
    n = 100_000
    idx = torch.cat([torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n)]), torch.tensor([[5], [5]])], 1)
    A = scorch.from_coo(idx, torch.ones(n + 1), (n, n), format="csr")
    for make in (lambda: A.asformat("ell"), lambda: scorch.from_coo(idx, torch.ones(n + 1), (n, n), format="ell")):
        with pytest.raises(NotImplementedError, match="pads its 100000 rows"):
            make()
    small = torch.tensor([[1.0, 2.0, 3.0], [0, 0, 4.0], [0, 0, 0]])
    assert torch.equal(scorch.as_sparse(small, "csr").asformat("ell").to_dense(), small)


def test_saving_and_copying_leave_what_scorch_derived_behind():
    """A pattern converted back and forth remembers its transpose (the two refer to each other) and
    its rows per entry: torch.save wrote them too -- the cycle made weights_only loading refuse the
    file (the demo's round trip failed) -- and deepcopy copied them; oracle: the dense tensor."""
    import copy
    import io
    g = torch.Generator().manual_seed(7)
    d = torch.randn(300, 200, generator=g) * (torch.rand(300, 200, generator=g) < 0.05)
    A = scorch.as_sparse(d, "csr")
    plain = io.BytesIO()
    torch.save(A, plain)
    A.asformat("csc").asformat("csr")
    A.t().asformat("csr").t().asformat("csr")
    A @ torch.randn(200)
    buf = io.BytesIO()
    torch.save(A, buf)
    assert len(buf.getvalue()) == len(plain.getvalue())
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=True).to_dense(), d)
    C = copy.deepcopy(A)
    assert torch.equal(C.to_dense(), d) and not any(vars(t) for t in (*C._pos, *C._crd) if t is not None)


# ---------------------------------------------------------------- the twentieth session's interop checks

def test_dlpack_export_is_refused_not_an_empty_buffer():
    # the wrapper reports a strided layout, so torch's own check passed: from_dlpack read the
    # wrapper's empty buffer (garbage from numpy, a segfault from torch)
    A = scorch.as_sparse(torch.tensor([[1., 0.], [0., 2.]]), "csr")
    for export in (torch.from_dlpack, np.from_dlpack, lambda a: a.__dlpack__()):
        with pytest.raises(BufferError, match="SparseTensor"):
            export(A)
    assert A.__dlpack_device__() == torch.ones(1).__dlpack_device__()
    assert float(torch.from_dlpack(A.to_dense()).sum()) == 3.0


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_to_another_device_is_refused(device):
    # to("meta") was taken, and conversions then handed meta pointers to C (a segfault)
    A = scorch.as_sparse(torch.tensor([[1., 0, 2], [0, 3, 0]]), "csr")
    with pytest.raises(scorch.NotSupportedError, match="lives on the CPU"):
        A.to(device)
    m = torch.nn.Linear(3, 2)
    m.weight = torch.nn.Parameter(A)
    with pytest.raises(scorch.NotSupportedError, match="lives on the CPU"):
        m.to("meta")
    assert A.to("cpu") is A and torch.equal(A.to(torch.float64, copy=True).to_dense(), A.to_dense().double())


@pytest.mark.parametrize("fmt", ["coo", "ell", "dcsr", "csc", "csr", "bsr1x1"])
def test_to_torch_keeps_the_graph_in_every_format(fmt):
    # only 2-d CSR/CSC/BSR kept requires_grad: the COO branch read the raw values array
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    A = scorch.as_sparse(x, scorch.formats.bsr(1, 1) if fmt == "bsr1x1" else fmt).requires_grad_()
    T = A.to_torch()
    assert T.requires_grad and torch.equal(T.to_dense().detach(), x)
    w = torch.arange(6.).reshape(2, 3)
    (T.to_dense() * w).sum().backward()
    torch.testing.assert_close(A.grad.to_dense(), w * (x != 0))


def test_ell_of_a_huge_outer_dim_is_refused_before_allocating():
    # a count per padded row (2^32 of them: 34 GB) was allocated before the padding check refused
    import resource
    with pytest.raises(scorch.NotSupportedError, match="padded level"):
        scorch.from_coo([[0, 1], [5, 6], [1, 0]], [1., 2.], (2, 2**31, 2), format="ell")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(scorch.NotSupportedError, match="padded level"):
        scorch.from_coo([[0, 5], [1, 2]], [1., 2.], (2**28, 3), format="ell")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024   # KiB: no 2 GB peak
    x = torch.tensor([[0., 1, 0, 2], [0, 0, 0, 0], [3, 4, 5, 0]])
    for fmt in ("ell", Format([dense, padded, padded])):
        y = x if fmt == "ell" else torch.stack([x, x.flip(0)])
        assert torch.equal(scorch.as_sparse(y, fmt).to_dense(), y)


def test_unsigned_indices_and_value_dtypes():
    idx = np.array([[0, 1], [2, 0]], dtype=np.uint64)
    A = scorch.from_coo(idx, [1., 2.], (2, 3))
    want = torch.sparse_coo_tensor(torch.from_numpy(idx.astype(np.int64)), torch.tensor([1., 2.]), (2, 3))
    assert torch.equal(A.to_dense(), want.to_dense())
    with pytest.raises(ValueError, match="past the largest int64"):
        scorch.from_coo(np.array([[2**63], [0]], dtype=np.uint64), [1.], (2, 2))
    # values torch's CPU ops only partly compute in: refused at the door, not in a later op
    for make in (lambda: scorch.as_sparse(torch.tensor([[1, 0], [0, 2]], dtype=torch.uint32)),
                 lambda: scorch.as_sparse(np.array([[1, 0], [0, 2]], dtype=np.uint32)),
                 lambda: scorch.from_coo([[0], [1]], torch.tensor([3], dtype=torch.uint16), (2, 2)),
                 lambda: scorch.as_sparse(torch.eye(2).to(torch.float8_e4m3fn)),
                 lambda: scorch.as_sparse(torch.eye(2)).to(torch.uint64)):
        with pytest.raises(TypeError, match="not supported"):
            make()
    sp = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match="not supported"):
        scorch.as_sparse(sp.csr_array(np.eye(2, dtype=np.uint32)))


def test_to_scipy_of_complex_half_is_complex64():
    x = torch.tensor([[1 + 2j, 0], [0, 3j]], dtype=torch.complex64)
    pytest.importorskip("scipy.sparse")
    S = scorch.as_sparse(x.to(torch.complex32)).to_scipy()
    assert S.dtype == np.complex64 and np.array_equal(S.toarray(), x.numpy())


def test_sparse_mask_with_a_sparse_tensor_mask():
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    m = torch.tensor([[0., 5, 1], [1, 0, 0]])
    M = scorch.as_sparse(m, "coo")
    for inp in (torch.ones(2, 3), x, scorch.as_sparse(x, "csr")):
        dense_inp = inp.to_dense() if isinstance(inp, SparseTensor) else inp
        want = dense_inp.sparse_mask(m.to_sparse()).to_dense()
        got = inp.sparse_mask(M)
        assert isinstance(got, SparseTensor) and got.nnz == 3 and torch.equal(got.to_dense(), want)
    got = scorch.as_sparse(x, "csr").sparse_mask(m.to_sparse())   # a torch.sparse mask beside a SparseTensor
    assert torch.equal(got.to_dense(), x.sparse_mask(m.to_sparse()).to_dense())
    d = torch.randn(2, 3, requires_grad=True)
    (d.sparse_mask(M).to_dense() * 2).sum().backward()
    torch.testing.assert_close(d.grad, 2 * (m != 0).float())
    with pytest.raises(ValueError, match="same shape"):
        torch.ones(3, 3).sparse_mask(M)
    with pytest.raises(TypeError, match="mask must be a sparse tensor"):
        scorch.as_sparse(x).sparse_mask(m)


def test_underscore_values_pair_with_indices_for_padded_formats():
    # ELL's values() holds its padding slots: _values() gave more values than _indices() coordinates
    D = torch.tensor([[1., 0, 2], [0, 3, 0], [4, 0, 5], [0, 0, 0]])
    for fmt in ("ell", "csr", "csc", "coo"):
        A = scorch.as_sparse(D, fmt)
        assert torch.equal(torch.sparse_coo_tensor(A._indices(), A._values(), D.shape).to_dense(), D)
    A = scorch.as_sparse(D, "ell").requires_grad_()
    A._values().sum().backward()
    assert torch.equal(A.grad.to_dense(), (D != 0).float())


def test_sparse_mask_of_a_torch_sparse_input():
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    m = torch.tensor([[0., 5, 1], [1, 0, 0]])
    for inp in (x.to_sparse(), x.to_sparse_csr()):
        got = inp.sparse_mask(scorch.as_sparse(m, "coo"))
        assert torch.equal(got.to_dense(), x.sparse_mask(m.to_sparse()).to_dense())
