"""Assembled sparse results (SpGEMM): each row's columns come out ascending, read off a bitset
for rows dense enough, sorted otherwise (introsort: quicksort, insertion sort, heap sort).

Oracles: dense torch products in float64; Python's sorted() for the sort routines.
"""

import ctypes

import pytest
import torch

import scorch
from scorch.compiler import build, codegen


def random_csr(n, m, per_row, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = torch.zeros(n, m, dtype=dtype)
    for r in range(n):
        k = int(per_row[r % len(per_row)])
        cols = torch.randperm(m, generator=g)[:k]
        D[r, cols] = torch.rand(k, generator=g, dtype=dtype) + 0.5
    return D


def check_product(DA, DB):
    C = scorch.einsum("ij,jk->ik", scorch.as_sparse(DA, "csr"), scorch.as_sparse(DB, "csr"))
    assert isinstance(C, scorch.SparseTensor)
    want = DA.double() @ DB.double()
    tol = 1e-4 if DA.dtype == torch.float32 else 1e-12
    torch.testing.assert_close(C.to_dense().double(), want, atol=tol, rtol=tol)
    pos, crd = C.pos(1).long(), C.crd(1).long()
    for r in range(C.shape[0]):
        row = crd[pos[r]:pos[r + 1]]
        assert bool((row[1:] > row[:-1]).all()), f"row {r} not strictly ascending: {row.tolist()}"
        assert row.numel() == int((want[r] != 0).sum()), f"row {r}: {row.numel()} stored entries"
    return C


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_read_off_the_bitset(dtype):
    """Few columns: every row has at most 16 bitset words per entry."""
    DA = random_csr(40, 60, [0, 1, 3, 8, 20], seed=1, dtype=dtype)
    DB = random_csr(60, 300, [1, 2, 5, 30], seed=2, dtype=dtype)
    check_product(DA, DB)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_rows_sorted(dtype):
    """Many columns, short rows: sorted (rows of 1..16 entries by insertion sort, longer ones by
    quicksort: 4 rows of B with 10 entries each give rows of ~40 over 60000 columns)."""
    DA = random_csr(30, 50, [0, 1, 2, 4], seed=3, dtype=dtype)
    DB = random_csr(50, 60000, [1, 3, 10], seed=4, dtype=dtype)
    check_product(DA, DB)


def test_sorted_rows_then_bitset_rows():
    """Short rows (sorted) and long rows (read off the bitset) alternate on each thread: the
    sorted rows must clear their bits too."""
    DA = random_csr(24, 100, [2, 1, 3], seed=6)
    DA[1::3] = 0
    DA[1::3, :40] = 1.0   # every third row gathers 40 rows of B: ~400 entries of 60000 columns
    DB = random_csr(100, 60000, [10, 1, 2], seed=7)
    check_product(DA, DB)


def test_discovery_in_reverse_and_in_order():
    """Columns met in descending order (B's rows walk down the columns) and in ascending order."""
    m = 70000
    DB = torch.zeros(40, m, dtype=torch.float64)
    for r in range(40):
        DB[r, m - 1 - 50 * r - torch.arange(30) * 7] = 1.0 + r
    DA = torch.zeros(3, 40, dtype=torch.float64)
    DA[0, :] = 1.0
    DA[1, torch.arange(39, -1, -1)] = torch.arange(40, dtype=torch.float64)
    DA[2, 5] = 2.0
    check_product(DA, DB)


def _sorter(name):
    src = codegen.BASE_PRELUDE + f"\nvoid run(int64_t *a, int64_t n) {{ {name}(a, n); }}\n"
    fn = build.compile_library(src, tag="sorttest").run
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_int64]
    return fn


@pytest.mark.parametrize("name", ["scorch_sort", "scorch_heapsort"])
def test_sort_routines(name):
    if not build.have_compiler():
        pytest.skip("no C compiler")
    run = _sorter(name)
    g = torch.Generator().manual_seed(5)
    n = 3000
    cases = [torch.randperm(n, generator=g), torch.arange(n), torch.arange(n, 0, -1),
             torch.cat([torch.arange(0, n, 2), torch.arange(n - 1, 0, -2)]),       # organ pipe
             torch.randint(0, 7, (n,), generator=g),                              # many equal keys
             torch.randint(0, 2**40, (n,), generator=g), torch.tensor([5]), torch.tensor([], dtype=torch.int64)]
    # a median-of-three killer: drives the quicksort to its depth limit (heap sort takes over)
    k = n // 2
    killer = [0] * n
    for i in range(1, k + 1):
        if i % 2:
            killer[i - 1], killer[i] = i, k + i
        killer[k + i - 1] = 2 * i
    cases.append(torch.tensor(killer))
    for x in cases:
        a = x.to(torch.int64).contiguous().clone()
        run(a.data_ptr(), a.numel())
        assert a.tolist() == sorted(x.tolist())


@pytest.mark.parametrize("limit,want", [(None, torch.int32), (50, torch.int64)], ids=["int32", "int64"])
def test_fill_writes_the_results_index_type(monkeypatch, limit, want):
    """The fill pass writes coordinates in the result's index type: int32 normally, int64 when
    the entries or a dimension outgrow int32 (forced here through a lowered limit)."""
    from scorch import convert
    if limit is not None:
        monkeypatch.setattr(convert, "_INT32_MAX", limit)
    DA = random_csr(40, 30, [0, 3, 7, 30], seed=5)
    DB = random_csr(30, 60, [1, 4, 60], seed=6)
    C = check_product(DA, DB)
    assert C.pos(1).dtype == want and C.crd(1).dtype == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spgemm_rows_read_off_the_bitset_and_the_sorted_list_alternately(dtype):
    """Rows of many products (their columns read off the bitset, set without a branch) next to
    rows of one or two (listed and sorted), in one product: the workspace each leaves behind
    must be clean for the next (oracle: the dense product)."""
    g = torch.Generator().manual_seed(3)
    n, m = 64, 9000                       # 141 bitset words: a row needs >= 9 entries to be read off them
    A = torch.zeros(n, 40, dtype=dtype)
    B = torch.zeros(40, m, dtype=dtype)
    for r in range(n):
        k = 30 if r % 3 else 1            # long rows and single-product rows interleaved
        A[r, torch.randperm(40, generator=g)[:k]] = torch.rand(k, generator=g, dtype=dtype) + 0.5
    for r in range(40):
        cols = torch.randint(0, m, (8,), generator=g)
        B[r, cols] = torch.rand(8, generator=g, dtype=dtype) - 0.5
    got = scorch.einsum("ij,jk->ik", scorch.as_sparse(A, "csr"), scorch.as_sparse(B, "csr"))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.to_dense(), A @ B, atol=tol, rtol=tol)
    assert got.nnz == int((A @ B != 0).sum())


@pytest.mark.parametrize("eq,shapes,fmts,fmt", [
    ("ij,jk->ik", ((20, 30), (30, 40)), ("csr", "csr"), None),          # Gustavson's workspace
    ("ij,jk->ik", ((20, 30), (30, 40)), ("csr", "csr"), "coo"),         # converted as asked
    ("ij,jk->ik", ((20, 30), (30, 40)), ("csr", "csr"), "dense"),       # a dense output, the plain bound path
    ("ij,ij->ij", ((20, 30), (20, 30)), ("csr", "dcsr"), None),         # intersection, rows in order
    ("bij,bjk->bik", ((3, 8, 9), (3, 9, 7)), ("csr", "csr"), None),     # batched
])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_cached_assembled_calls(eq, shapes, fmts, fmt, index):
    """The calls after the first of a signature take the bound path (driver._Assembled), each on
    new operands (other patterns, other nnz) against the dense einsum in float64."""
    from scorch.compiler import driver
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        dense = [torch.randn(s, generator=g) * (torch.rand(s, generator=g) < 0.1 + 0.1 * seed) for s in shapes]
        ops = [scorch.as_sparse(d, f, index_dtype=index) for d, f in zip(dense, fmts)]
        got = scorch.einsum(eq, *ops, format=fmt)
        want = torch.einsum(eq, *[d.double() for d in dense])
        assert isinstance(got, scorch.SparseTensor) == (fmt != "dense")
        if fmt is not None and fmt != "dense":
            assert got.format == scorch.formats.preset(fmt, len(shapes[0]))
        torch.testing.assert_close((got.to_dense() if fmt != "dense" else got).double(), want, atol=1e-5, rtol=1e-5)
    bound = driver._BOUND[driver._signature(eq, fmt, tuple(ops), ())]
    assert isinstance(bound, driver._Bound if fmt == "dense" else driver._Assembled), bound  # dense: no assembly


@pytest.mark.parametrize("fa,fb", [("csr", "dcsr"), ("dcsr", "dcsr"), ("coo", "coo"), ("csr", "coo")])
def test_a_compressed_outer_level_under_another_loop_is_located(fa, fb):
    # B's outer level (rows j) sits under the loop over A's rows: merging it with each row of A
    # walked all of B's stored rows per row of A (30x CSR's time on PubMed); it is made dense
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 50, generator=g, dtype=torch.float64) * (torch.rand(40, 50, generator=g) < 0.1)
    y = torch.randn(50, 30, generator=g, dtype=torch.float64) * (torch.rand(50, 30, generator=g) < 0.1)
    y[7:20] = 0  # empty rows: B's DCSR / COO stores fewer rows than it has
    A, B = scorch.as_sparse(x, fa), scorch.as_sparse(y, fb)
    plan = scorch.explain("ij,jk->ik", A, B)
    assert any("levels made dense" in n and "operand 1" in n for n in plan.notes)
    assert plan.schedule.operands[1].fmt.levels[0].kind == "dense"
    torch.testing.assert_close((A @ B).to_dense(), x @ y)
    # the outermost loop walks its operand's outer level once: a DCSR left operand stays DCSR
    plan = scorch.explain("ij,jk->ik", scorch.as_sparse(x, "dcsr"), scorch.as_sparse(y, "csr"))
    assert not any("levels made dense" in n for n in plan.notes)
    assert plan.schedule.operands[0].fmt == scorch.formats.preset("dcsr", 2)


@pytest.mark.parametrize("fb", ["csf", "coo"])
def test_an_inner_compressed_level_under_another_loop_is_located(fb):
    # bij,bjk->bik with a CSF / COO B: B's rows j (under its batch level b) are merged again for
    # every row i of A; they become a dense level under b (compressed, dense, compressed)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 20, 30, generator=g, dtype=torch.float64) * (torch.rand(3, 20, 30, generator=g) < 0.15)
    y = torch.randn(3, 30, 25, generator=g, dtype=torch.float64) * (torch.rand(3, 30, 25, generator=g) < 0.15)
    y[1] = 0  # an empty batch: CSF stores fewer batches than it has
    A, B = scorch.as_sparse(x, "csr"), scorch.as_sparse(y, fb)
    plan = scorch.explain("bij,bjk->bik", A, B)
    assert [lv.kind for lv in plan.schedule.operands[1].fmt.levels] == ["compressed", "dense", "compressed"]
    torch.testing.assert_close((A @ B).to_dense(), x @ y)


@pytest.mark.parametrize("fa,fb,eq", [("csr", "csr", "ij,kj->ik"), ("csc", "csc", "ij,jk->ik"), ("csr", "csc", "ij,jk->ik"),
                                      ("dcsr", "coo", "ij,kj->ik"), ("csf", "csf", "bij,bkj->bik")])
def test_products_with_a_transposed_operand_take_gustavsons_order(fa, fb, eq):
    # A @ B^T over CSR operands was an inner product per output entry (i -> k -> j: 0.2 s on Cora);
    # B is re-formatted so that the rows are merged row by row (i -> j -> k)
    g = torch.Generator().manual_seed(2)
    shape = (3, 30, 40) if eq.startswith("b") else (30, 40)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < 0.1)
    y = x.flip(-2) if "kj" in eq else x.transpose(-1, -2).flip(-1)
    A, B = scorch.as_sparse(x, fa), scorch.as_sparse(y.contiguous(), fb)
    plan = scorch.explain(eq, A, B)
    assert plan.loop_order[-2:] == ("j", "k") and any("Gustavson" in n for n in plan.notes)
    torch.testing.assert_close(scorch.einsum(eq, A, B).to_dense(), torch.einsum(eq, x, y))
