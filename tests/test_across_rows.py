"""Kernels that step over a CSR level's entries across row ends (AVX-512 builds).

SpMV and row sums (``SegmentedRows``: a segmented scan over 512 entries per block) and SDDMM
(``SampledDots``: sixteen entries per step); both read each entry's row from the pattern's
entry rows.  Oracles are written out entry by entry in plain torch, in float64 (``index_add_``
of ``vals * x[col]`` into the rows: unlike ``dense @ x`` it keeps a row's inf in that row;
``vals * (Q[row] * K[col]).sum(1)``), independent of the kernels' steps."""

import pytest
import torch

import scorch
from scorch.compiler import build

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="needs a C compiler")


def csr(lengths, ncols=128, seed=0, dtype=torch.float32):
    """A CSR matrix whose row r stores lengths[r] <= ncols entries (distinct sorted columns)."""
    g = torch.Generator().manual_seed(seed)
    crow = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    crow[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0).to(torch.int32) if lengths else crow[1:]
    cols = [torch.randperm(ncols, generator=g)[:k].sort().values for k in lengths]
    col = torch.cat(cols).to(torch.int32) if cols else torch.zeros(0, dtype=torch.int32)
    vals = torch.rand(col.numel(), generator=g, dtype=dtype) * 2 - 1
    return torch.sparse_csr_tensor(crow, col, vals, (len(lengths), ncols), check_invariants=True)


def rows_of(T):
    return torch.repeat_interleave(torch.arange(T.shape[0]), torch.diff(T.crow_indices().long()))


def oracle(T, *vectors):
    """out[r] = sum over the row's entries of vals * v1[col] * v2[col] ..., in float64."""
    rows, col = rows_of(T), T.col_indices().long()
    prod = T.values().double()
    for v in vectors:
        prod = prod * v.double()[col]
    return torch.zeros(T.shape[0], dtype=torch.float64).index_add_(0, rows, prod)


TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-12)}


def spmv(T, x):
    return scorch.einsum("ij,j->i", scorch.as_sparse(T), x)


def test_spmv_plan_uses_the_segmented_scan():
    T = csr([3, 0, 40, 1])
    plan = scorch.explain("ij,j->i", scorch.as_sparse(T), torch.randn(128))
    assert "scorch_seg_block" in plan.source and "#else" in plan.source  # row-wise loop kept for other targets
    assert any("segmented scan" in n for n in plan.notes)


@pytest.mark.parametrize("lengths", [
    [],                                   # no rows
    [0, 0, 0],                            # rows, no entries
    [5],                                  # one short row
    [32], [33], [64], [100],              # one row over one, two, several steps
    [1] * 40,                             # more than 16 rows ending in one step: the step repeats
    [0] * 20 + [3] + [0] * 20,            # runs of empty rows around an entry
    [1, 0] * 30 + [31, 1, 0, 0, 2],       # mixed, ends landing on step boundaries
    [16, 16, 0, 32, 31, 1, 0, 33, 15, 17],
])
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmv_matches_the_entrywise_sum(lengths, nthreads, dtype, monkeypatch):
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    T = csr(lengths, seed=len(lengths), dtype=dtype)
    x = torch.randn(128, dtype=dtype)
    got = spmv(T, x)
    assert got.dtype == dtype and got.shape == (len(lengths),)
    torch.testing.assert_close(got.double(), oracle(T, x), **TOL[dtype])


@pytest.mark.parametrize("lengths", [
    [1500],                               # one row over three 512-entry blocks
    [3, 700, 0, 600, 1],                  # rows spanning whole chunks and block ends
    [511, 1, 0, 512, 513, 0, 31, 33],     # ends on and beside block boundaries
    [2] * 300 + [1100] + [0] * 40,        # many rows per block, then one long row, then empty rows
    [255, 1, 0, 256, 257, 0, 31, 33],     # float64's 256-entry blocks: ends on and beside their boundaries
])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmv_rows_across_blocks(lengths, nthreads, dtype, monkeypatch):
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    T = csr(lengths, ncols=2048, seed=sum(lengths), dtype=dtype)
    x = torch.randn(2048, generator=torch.Generator().manual_seed(5), dtype=dtype)
    tol = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(spmv(T, x).double(), oracle(T, x), **tol)


@given(st.lists(st.integers(0, 70), max_size=80), st.integers(1, 3), st.integers(0, 2**16),
       st.sampled_from([torch.float32, torch.float64]))
def test_spmv_any_row_lengths(lengths, nthreads, seed, dtype):
    T = csr(lengths, seed=seed, dtype=dtype)
    x = torch.randn(128, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    from unittest import mock
    with mock.patch.object(build, "threads_for", lambda work: nthreads):
        got = spmv(T, x)
    torch.testing.assert_close(got.double(), oracle(T, x), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_never_mix_inf_and_magnitudes(dtype):
    # four rows of four entries share one 32-entry step; a prefix sum over the step minus
    # the previous row's prefix would give inf - inf = nan for row 1 and lose row 3 to row 2
    crow = torch.arange(0, 17, 4, dtype=torch.int32)
    col = torch.arange(16, dtype=torch.int32)
    vals = torch.rand(16, generator=torch.Generator().manual_seed(0), dtype=dtype) + 0.5
    vals[8:12] *= 1e30                 # row 2: huge
    vals[12:16] *= 1e-3                # row 3: small
    T = torch.sparse_csr_tensor(crow, col, vals, (4, 16), check_invariants=True)
    x = torch.ones(16, dtype=dtype)
    x[0] = float("inf")                # row 0 only
    got = spmv(T, x)
    assert got[0] == float("inf") and torch.isfinite(got[1:]).all()
    torch.testing.assert_close(got[1:].double(), oracle(T, x)[1:], rtol=1e-6 if dtype == torch.float32 else 1e-14,
                               atol=0)


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lanes_past_a_threads_rows_do_not_leak(nthreads, dtype, monkeypatch):
    # 6 rows of 10: with two threads, thread 0 takes rows 0-2 (entries 0-29) and its first
    # 32-entry chunk also reads entries 30, 31 of row 3, whose columns hold inf in x: those
    # lanes must reach neither thread 0's rows nor thread 1's (they come after every row end
    # thread 0 reads, so only the unused carry sees them)
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    crow = torch.arange(0, 61, 10, dtype=torch.int32)
    col = torch.cat([torch.arange(10)] * 3 + [torch.arange(10, 20)] * 3).to(torch.int32)
    vals = torch.rand(60, generator=torch.Generator().manual_seed(1), dtype=dtype) + 0.5
    T = torch.sparse_csr_tensor(crow, col, vals, (6, 20), check_invariants=True)
    x = torch.randn(20, generator=torch.Generator().manual_seed(2), dtype=dtype)
    x[10:] = float("inf")
    got = spmv(T, x)
    assert torch.isfinite(got[:3]).all() and (got[3:] == float("inf")).all()
    torch.testing.assert_close(got[:3].double(), oracle(T, x)[:3], **TOL[dtype])


@pytest.mark.parametrize("eq, nvec", [("ij->i", 0), ("ij,j,j->i", 2)])
@pytest.mark.parametrize("dtype, block", [(torch.float32, "scorch_seg_block("), (torch.float64, "scorch_seg_block_d(")])
def test_row_sums_and_two_gathers(eq, nvec, dtype, block):
    T = csr([0, 7, 33, 1, 1, 0, 64, 2] * 5, seed=3, dtype=dtype)
    xs = [torch.randn(128, dtype=dtype) for _ in range(nvec)]
    plan = scorch.explain(eq, scorch.as_sparse(T), *xs)
    assert block in plan.source.split("void kernel")[-1]
    got = scorch.einsum(eq, scorch.as_sparse(T), *xs)
    torch.testing.assert_close(got.double(), oracle(T, *xs), **TOL[dtype])


@pytest.mark.parametrize("dtype, index", [(torch.float64, torch.int64), (torch.float32, torch.int64)])
def test_other_types_keep_the_row_wise_loop(dtype, index):
    T = csr([3, 0, 40, 1, 17], seed=2, dtype=dtype)
    A = scorch.as_sparse(T)
    if index == torch.int64:  # chosen automatically only past 2**31 entries: widen by hand
        wide = lambda ts: tuple(t.long() if t is not None else None for t in ts)  # noqa: E731
        A = scorch.SparseTensor(A._format, A._shape, wide(A._pos), wide(A._crd), A._vals, nnz=A._stored)
    assert A._crd[1].dtype == index
    x = torch.randn(128, dtype=dtype)
    assert "scorch_seg_block" not in scorch.explain("ij,j->i", A, x).source
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).double(), oracle(T, x), atol=1e-5, rtol=1e-5)


def test_strided_vector_and_bias_keep_the_row_wise_loop():
    T = csr([3, 0, 40, 1, 17], seed=4)
    A = scorch.as_sparse(T)
    x = torch.randn(256)[::2]          # not unit stride: no gather by coordinate alone
    assert "scorch_seg_block" not in scorch.explain("ij,j->i", A, x).source
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).double(), oracle(T, x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ SDDMM (SampledDots)

LENGTHS = [
    [], [0, 0, 0], [5], [16], [17], [100],
    [1] * 40,                             # more than fifteen rows end among sixteen entries
    [0] * 20 + [3] + [0] * 20,
    [1, 0] * 30 + [31, 1, 0, 0, 2],
    [16, 16, 0, 32, 31, 1, 0, 33, 15, 17],
]


def sddmm_oracle(T, Q, K, *extra):
    rows, col = rows_of(T), T.col_indices().long()
    prod = Q.double()[rows] * K.double()[col]
    for e in extra:
        prod = prod * e.double()
    return T.values().double() * prod.sum(1)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("k", [16, 64])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_sddmm_matches_the_entrywise_dots(lengths, k, nthreads, monkeypatch):
    monkeypatch.setattr(build, "threads_for", lambda work: nthreads)
    T = csr(lengths, seed=len(lengths))
    g = torch.Generator().manual_seed(k)
    Q, K = torch.randn(len(lengths), k, generator=g), torch.randn(128, k, generator=g)
    A = scorch.as_sparse(T)
    assert "scorch_hsum16(p_)" in scorch.explain("ij,ik,jk->ij", A, Q, K).source
    got = scorch.einsum("ij,ik,jk->ij", A, Q, K)
    assert scorch.is_sparse(got) and got.nnz == T.values().numel()
    torch.testing.assert_close(got.values().double(), sddmm_oracle(T, Q, K), atol=1e-4, rtol=1e-5)


@given(st.lists(st.integers(0, 40), max_size=60), st.sampled_from([16, 32, 48, 128]), st.integers(1, 3),
       st.integers(0, 2**16))
def test_sddmm_any_row_lengths(lengths, k, nthreads, seed):
    T = csr(lengths, seed=seed)
    g = torch.Generator().manual_seed(seed)
    Q, K = torch.randn(len(lengths), k, generator=g), torch.randn(128, k, generator=g)
    from unittest import mock
    with mock.patch.object(build, "threads_for", lambda work: nthreads):
        got = scorch.einsum("ij,ik,jk->ij", scorch.as_sparse(T), Q, K)
    torch.testing.assert_close(got.values().double(), sddmm_oracle(T, Q, K), atol=1e-4, rtol=1e-5)


def test_sddmm_three_factors_and_strided_rows():
    T = csr([3, 0, 40, 1, 17, 2] * 7, seed=5)
    g = torch.Generator().manual_seed(1)
    Q = torch.randn(T.shape[0], 48, generator=g)
    K = torch.randn(128, 80, generator=g)[:, 16:64]      # row stride 80, unit stride along k
    w = torch.randn(48, generator=g)
    A = scorch.as_sparse(T)
    assert "scorch_hsum16(p_)" in scorch.explain("ij,ik,jk,k->ij", A, Q, K, w).source
    got = scorch.einsum("ij,ik,jk,k->ij", A, Q, K, w)
    torch.testing.assert_close(got.values().double(), sddmm_oracle(T, Q, K, w), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("k", [8, 24])
def test_sddmm_other_widths_keep_the_row_wise_loop(k):
    T = csr([3, 0, 40, 1, 17], seed=6)
    Q, K = torch.randn(5, k), torch.randn(128, k)
    A = scorch.as_sparse(T)
    assert "scorch_hsum16(p_)" not in scorch.explain("ij,ik,jk->ij", A, Q, K).source
    got = scorch.einsum("ij,ik,jk->ij", A, Q, K)
    torch.testing.assert_close(got.values().double(), sddmm_oracle(T, Q, K), atol=1e-4, rtol=1e-5)


@pytest.fixture
def without_avx512(monkeypatch):
    """Kernels compiled with ``-mno-avx512f``: the ``#else`` (row-wise) paths."""
    from scorch.compiler import driver

    def clear():
        driver._PLANS.clear(), driver._BOUND.clear()
    clear()
    monkeypatch.setenv("SCORCH_CFLAGS", "-mno-avx512f")
    yield
    clear()


def test_row_wise_paths_without_avx512(without_avx512):
    T = csr([1] * 20 + [0, 3, 40, 0, 17, 2], seed=7)
    A = scorch.as_sparse(T)
    x = torch.randn(128)
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x).double(), oracle(T, x), atol=1e-5, rtol=1e-5)
    Q, K = torch.randn(T.shape[0], 32), torch.randn(128, 32)
    got = scorch.einsum("ij,ik,jk->ij", A, Q, K)
    torch.testing.assert_close(got.values().double(), sddmm_oracle(T, Q, K), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spmv_without_avx512vl(dtype, monkeypatch):
    """AVX-512F without VL (the float64 block reads ymm masks): float32 keeps its block scan,
    float64 compiles its row-wise loop."""
    if not build.vector_bytes() >= 64:
        pytest.skip("no AVX-512 here")
    from scorch.compiler import driver
    driver._PLANS.clear(), driver._BOUND.clear()
    monkeypatch.setenv("SCORCH_CFLAGS", "-mno-avx512vl")
    try:
        T = csr([1] * 20 + [0, 3, 40, 0, 17, 2, 300], ncols=512, seed=8, dtype=dtype)
        x = torch.randn(512, dtype=dtype)
        torch.testing.assert_close(spmv(T, x).double(), oracle(T, x), **TOL[dtype])
    finally:
        driver._PLANS.clear(), driver._BOUND.clear()


def test_entry_parents_are_the_rows_and_live_with_the_pattern():
    """SampledDots and SegmentedRows read each entry's row from convert.entry_parents, and
    SegmentedRows each row's first entry from convert.entry_heads: the row coordinates of
    the stored entries and the bits where they change (oracle: the dense tensor's nonzero
    rows), one array each per pos tensor, released with it."""
    import gc
    import weakref

    from scorch import convert
    T = csr([3, 0, 0, 5, 1, 0, 2, 0] + [1] * 9, seed=9)
    A = scorch.as_sparse(T)
    rows = convert.entry_parents(A._pos[1])
    heads = convert.entry_heads(A._pos[1])
    want = T.to_dense().nonzero()[:, 0]
    assert rows.dtype == A._pos[1].dtype and heads.dtype == torch.uint8
    assert torch.equal(rows.long(), want)
    bits = ((heads.long()[:, None] >> torch.arange(8)) & 1).flatten().bool()
    first = torch.ones(want.numel(), dtype=torch.bool)
    first[1:] = want[1:] != want[:-1]
    assert bits.numel() >= want.numel() + 8 * 128 and torch.equal(bits[:want.numel()], first)
    assert not bits[want.numel():].any()                                   # zero past the last entry
    assert convert.entry_parents(A._pos[1]) is rows                       # computed once
    assert convert.entry_heads(A._pos[1]) is heads
    assert convert.entry_parents(A.with_values(A.values() * 2)._pos[1]) is rows   # same pattern, same array
    freed = [weakref.ref(rows), weakref.ref(heads)]
    del A, rows, heads
    gc.collect()
    assert not any(r() is not None for r in freed)                        # freed with the pattern


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("lengths", [[], [0, 0], [3, 0, 0, 5, 1, 0, 2, 0], [0] * 7 + [9] * 300 + [0, 1] * 500])
def test_entry_arrays_generated_and_fallback_agree(lengths, index, monkeypatch):
    """The generated kernels (segments.parents / heads) and the torch/numpy fallback (no C
    compiler) compute the same arrays; oracle: the rows of the dense tensor's nonzeros."""
    from scorch import convert
    pos = torch.zeros(len(lengths) + 1, dtype=index)
    pos[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0) if lengths else pos[1:]
    want = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
    first = torch.ones(want.numel(), dtype=torch.bool)
    first[1:] = want[1:] != want[:-1]
    got = {}
    for compiled in (True, False):
        monkeypatch.setattr(build, "have_compiler", lambda compiled=compiled: compiled)
        par, hd = convert._parents(pos), convert._heads(pos)
        assert par.dtype == index and torch.equal(par.long(), want)
        bits = ((hd.long()[:, None] >> torch.arange(8)) & 1).flatten().bool()
        assert torch.equal(bits[:want.numel()], first) and not bits[want.numel():].any()
        got[compiled] = hd
    assert torch.equal(got[True], got[False])
