"""Hypersparse assembled results (compiler/compact.py): the kernels run over the coordinates the
operands hold, not over dimensions of 10^7.  Oracles: dense torch.einsum where the sizes allow
(the compaction forced on small problems), torch.sparse's COO products at full size."""

import contextlib
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import scorch
from scorch.compiler import build, compact, driver

from test_einsum_property import dense, problems

pytestmark = [pytest.mark.skipif(not build.have_compiler(), reason="no C compiler"),
              # torch.sparse_coo_tensor builds the oracles; torch warns once that it skips its invariant checks
              pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")]


@contextlib.contextmanager
def forced(min_elements=0, per_entry=0, per_index=0):
    """Compact every assembled result (the thresholds off), restoring them after."""
    old = compact.MIN_ELEMENTS, compact.PER_ENTRY, compact.PER_INDEX
    compact.MIN_ELEMENTS, compact.PER_ENTRY, compact.PER_INDEX = min_elements, per_entry, per_index
    try:
        yield
    finally:
        compact.MIN_ELEMENTS, compact.PER_ENTRY, compact.PER_INDEX = old


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(problems())
def test_random_einsums_match_torch_when_compacted(problem):
    eq, ops = problem
    want = torch.einsum(eq, *[dense(x) for x in ops])
    with forced():
        plan = scorch.explain(eq, *ops)
        got = scorch.einsum(eq, *ops)
        again = scorch.einsum(eq, *ops)  # the cached call re-checks the operands it is given
    assert tuple(got.shape) == tuple(want.shape)
    torch.testing.assert_close(dense(got), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(dense(again), want, rtol=1e-9, atol=1e-9)
    assert plan.backend in ("generated C", "permute (no kernel)")


def _coo(n, nnz, seed, rows=4000, stride=1999):
    """A ``n x n`` torch COO matrix whose ``nnz`` random entries lie in ``rows`` rows and
    ``rows`` columns spread across the whole width."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (2, nnz), generator=g)
    idx[1] = idx[1] * stride % n
    return torch.sparse_coo_tensor(idx, torch.rand(nnz, generator=g, dtype=torch.float64), (n, n)).coalesce()


def _same(got, want):
    coords, values = got.coo()
    assert torch.equal(coords, want.indices())
    torch.testing.assert_close(values, want.values())


@pytest.mark.parametrize("fa,fb", [("dcsr", "dcsr"), ("coo", "coo"), ("dcsr", "csc"), ("csr", "dcsr")])
def test_spgemm_of_ten_million_square_matches_torch_sparse(fa, fb, monkeypatch):
    n = 10**7
    TA, TB = _coo(n, 3000, 0), _coo(n, 3000, 1)
    TB = torch.sparse_coo_tensor(TB.indices().flip(0), TB.values(), (n, n)).coalesce()
    want = torch.sparse.mm(TA, TB).coalesce()
    A, B = scorch.as_sparse(TA, fa), scorch.as_sparse(TB, fb)
    seen = []
    real = driver._assemble
    monkeypatch.setattr(driver, "_assemble", lambda call, nthreads, shape, width, cdtype:
                        seen.append((shape, width)) or real(call, nthreads, shape, width, cdtype))
    for _ in range(2):  # planned, then the cached call
        C = A @ B
        assert C.shape == (n, n) and C.format == scorch.formats.preset("dcsr", 2)
        _same(C, want)
    assert seen and all(max(shape) <= 6000 and width <= 6000 for shape, width in seen)  # never 10^7 wide
    plan = scorch.explain("ij,jk->ik", A, B)
    assert "hypersparse result" in str(plan) and "dcsr assembled over the coordinates present" in plan.output_format


def test_hypersparse_sum_product_and_requested_format_match_torch_sparse():
    n = 10**7
    TA, TB = _coo(n, 2000, 2), _coo(n, 2000, 3)
    A, B = scorch.as_sparse(TA, "dcsr"), scorch.as_sparse(TB, "coo")
    _same(A + B, (TA + TB).coalesce())
    _same(A * B, (TA * TB).coalesce())
    C = scorch.einsum("ij,kj->ik", A, B, format="coo")  # A @ B^T, the format asked for
    assert C.format == scorch.formats.preset("coo", 2)
    _same(C, torch.sparse.mm(TA, TB.t().coalesce()).coalesce())


def test_only_wide_columns_keep_rows_dense():
    # 300 rows (not compacted), 10^7 columns (compacted): the default CSR-like result
    n = 10**7
    g = torch.Generator().manual_seed(4)
    idx = torch.stack([torch.randint(0, 300, (1500,), generator=g), torch.randint(0, n, (1500,), generator=g)])
    TA = torch.sparse_coo_tensor(idx, torch.rand(1500, dtype=torch.float64, generator=g), (300, n)).coalesce()
    TB = torch.sparse_coo_tensor(torch.stack([idx[1].flip(0), idx[1]]), torch.rand(1500, dtype=torch.float64, generator=g),
                                 (n, n)).coalesce()
    A, B = scorch.as_sparse(TA, "csr"), scorch.as_sparse(TB, "dcsr")
    C = A @ B
    assert C.format == scorch.formats.preset("csr", 2) and C.shape == (300, n)
    _same(C, torch.sparse.mm(TA, TB).coalesce())


def test_cached_call_compacts_when_a_later_call_is_hypersparse():
    # bound on a dense-ish pair (not compacted), then called with the same shapes and few entries
    g = torch.Generator().manual_seed(5)
    big = [torch.randn(400, 400, generator=g, dtype=torch.float64) * (torch.rand(400, 400, generator=g) < 0.3)
           for _ in range(2)]
    few = [torch.zeros(400, 400, dtype=torch.float64) for _ in range(2)]
    few[0][3, 7], few[0][300, 9], few[1][7, 350], few[1][9, 2] = 1.5, -2.0, 3.0, 0.5
    calls = []
    real = compact.compact
    with forced(min_elements=0, per_entry=16, per_index=1), pytest.MonkeyPatch.context() as mp:
        mp.setattr(compact, "compact", lambda *a: calls.append(1) or real(*a))
        for pair in (big, big, few):
            A, B = (scorch.as_sparse(x, "csr") for x in pair)
            torch.testing.assert_close((A @ B).to_dense(), pair[0] @ pair[1])
    assert len(calls) == 1  # only the hypersparse call


def test_gradients_through_a_compacted_product_match_dense():
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(30, 40, generator=g, dtype=torch.float64) * (torch.rand(30, 40, generator=g) < 0.05),
          torch.randn(40, 50, generator=g, dtype=torch.float64) * (torch.rand(40, 50, generator=g) < 0.05)]
    A, B = (scorch.as_sparse(x, "dcsr").requires_grad_() for x in xs)
    with forced():
        C = A @ B
        (C * C).sum().backward()
    da, db = (x.clone().requires_grad_() for x in xs)
    (((da @ db) * (da @ db)).sum()).backward()
    torch.testing.assert_close(A.grad.to_dense(), da.grad * (xs[0] != 0))
    torch.testing.assert_close(B.grad.to_dense(), db.grad * (xs[1] != 0))


def test_wide_columns_of_a_not_hypersparse_product_are_compacted(monkeypatch):
    # 200 x 10^7 result from 40,000 entries: not hypersparse overall (16 x stored < the arrays),
    # but 10^7 columns > 40,000 entries: the columns alone are compacted, the workspace stays small
    n = 10**7
    g = torch.Generator().manual_seed(7)
    cols = torch.randint(0, n, (20_000,), generator=g)
    TA = torch.sparse_coo_tensor(torch.stack([torch.randint(0, 200, (20_000,), generator=g), cols % 5000]),
                                 torch.rand(20_000, dtype=torch.float64, generator=g), (200, 5000)).coalesce()
    TB = torch.sparse_coo_tensor(torch.stack([torch.randint(0, 5000, (20_000,), generator=g), cols]),
                                 torch.rand(20_000, dtype=torch.float64, generator=g), (5000, n)).coalesce()
    A, B = scorch.as_sparse(TA, "csr"), scorch.as_sparse(TB, "csr")
    widths = []
    real = driver._assemble
    monkeypatch.setattr(driver, "_assemble", lambda call, nthreads, shape, width, cdtype:
                        widths.append(width) or real(call, nthreads, shape, width, cdtype))
    C = A @ B
    assert C.format == scorch.formats.preset("csr", 2) and widths and max(widths) <= 20_000
    _same(C, torch.sparse.mm(TA, TB).coalesce())


def test_empty_hypersparse_operands():
    n = 10**7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        E = scorch.as_sparse(torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (n, n)), "dcsr")
    C = E @ E
    assert C.shape == (n, n) and C.nnz == 0


def test_hypersparse_outer_level_stays_compressed_under_another_loop():
    # "ij,jk->" (a scalar): B's outer level j is under A's row loop; for a DCSR B of 10^7 rows
    # holding 3,000 entries a position per row would be 80 MB for nothing: it stays compressed
    n = 10**7
    TA = _coo(n, 3000, 8)
    TB = torch.sparse_coo_tensor(TA.indices().flip(0), TA.values(), (n, n)).coalesce()
    A, B = scorch.as_sparse(TA, "dcsr"), scorch.as_sparse(TB, "dcsr")
    plan = scorch.explain("ij,jk->", A, B)
    assert not any("levels made dense" in note for note in plan.notes)
    assert plan.schedule.operands[1].fmt == scorch.formats.preset("dcsr", 2)
    want = torch.sparse.mm(TA, TB).coalesce().values().sum()
    torch.testing.assert_close(scorch.einsum("ij,jk->", A, B), want)
