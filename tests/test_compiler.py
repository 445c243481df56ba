"""The compiler: generated kernels against torch.einsum on dense operands (the oracle)."""

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.compiler.notation import parse

needs_cc = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    return x * (torch.rand(*shape, generator=g) < density)


def dense_of(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


def check(eq, *ops, sparse_out=None, **kw):
    want = torch.einsum(eq, *[dense_of(o) for o in ops])
    plan = scorch.explain(eq, *ops, **kw)
    got = scorch.einsum(eq, *ops, **kw)
    assert plan.backend == "generated C" and "void kernel" in plan.source and plan.kernels
    if sparse_out is not None:
        assert isinstance(got, scorch.SparseTensor) == sparse_out
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(dense_of(got), want, rtol=1e-10 if want.dtype == torch.float64 else 1e-4,
                               atol=1e-10 if want.dtype == torch.float64 else 1e-4)
    return plan


# ------------------------------------------------------------------ notation

def test_parse_explicit_implicit_and_ellipsis():
    e = parse("ij,jk->ik", [(2, 3), (3, 4)])
    assert e.inputs == ("ij", "jk") and e.output == "ik" and e.size == {"i": 2, "j": 3, "k": 4}
    assert e.reduced == "j"
    assert parse("ij,jk", [(2, 3), (3, 4)]).output == "ik"
    assert parse("ba,ab", [(2, 3), (3, 2)]).output == ""
    e = parse("...ij,...jk->...ik", [(5, 2, 3), (5, 3, 4)])
    assert e.inputs == ("Zij", "Zjk") and e.output == "Zik"


@pytest.mark.parametrize("eq,shapes,match", [
    ("ij,jk->ik", [(2, 3)], "2 operand terms but 1 operands"),
    ("ij,jk->ik", [(2, 3), (4, 4)], "index 'j' has size 3"),
    ("ij->iz", [(2, 3)], "output index 'z' appears in no operand"),
    ("ij->ii", [(2, 2)], "output index repeats"),
    ("i1->i", [(2, 3)], "invalid index character '1'"),
    ("ijk->i", [(2, 3)], "operand 0 has 2 dims but its term"),
    ("ij->i->j", [(2, 3)], "more than one '->'"),
])
def test_parse_errors_name_the_problem(eq, shapes, match):
    with pytest.raises(ValueError, match=match):
        parse(eq, shapes)


# ------------------------------------------------------------------ kernels

FORMATS_2D = ["csr", "csc", "coo", "dcsr", "dcsc", "ell", scorch.formats.bsr(2, 3), scorch.formats.bsc(2, 1), "dense"]


@needs_cc
@pytest.mark.parametrize("fmt", FORMATS_2D, ids=str)
def test_spmv_spmm_sddmm_every_2d_format(fmt):
    A = scorch.as_sparse(rnd(6, 9), fmt)
    check("ij,j->i", A, rnd(9, density=1, seed=1))
    check("ij,jk->ik", A, rnd(9, 5, density=1, seed=2))
    check("ij,i->j", A, rnd(6, density=1, seed=3))
    check("ij,ik,jk->ij", A, rnd(6, 4, density=1, seed=4), rnd(9, 4, density=1, seed=5),
          sparse_out=True)  # blocked formats too: the result in the operand's blocks
    check("ij,ij->ij", A, rnd(6, 9, density=1, seed=6), sparse_out=True)
    check("ij->", A)
    check("ij->j", A)


@needs_cc
def test_spmm_plan_is_row_parallel_with_k_innermost():
    plan = check("ij,jk->ik", scorch.as_sparse(rnd(30, 20), "csr"), rnd(20, 16, density=1))
    assert plan.loop_order == ("i", "j", "k") and plan.parallel == "rows" and plan.output_format == "dense"
    assert "scorch_vec_double w0" in plan.source and "scorch_lower_bound" in plan.source  # row in registers
    assert "__builtin_prefetch" in plan.source  # gathered rows of X are prefetched


@needs_cc
def test_vector_per_entry_loops_its_dense_level_outside_the_walk():
    """A (dense, compressed, dense) operand -- one vector per stored entry, e.g. a score per
    attention head -- times a dense one: i -> h -> j -> k, locating h under j, so each
    output row (i, h, :) accumulates in registers; rows stay outermost and parallel."""
    from scorch.format import Format, compressed, dense
    fmt = Format((dense, compressed, dense))
    mask = (rnd(30, 20, density=0.25) != 0).unsqueeze(-1).double()
    T = scorch.as_sparse(rnd(30, 20, 3, density=1) * mask, fmt)
    plan = check("ijh,jhk->ihk", T, rnd(20, 3, 16, density=1))
    assert plan.loop_order == ("i", "h", "j", "k") and plan.parallel == "rows"
    assert "scorch_vec_double w0" in plan.source
    check("ijh,jhk->hik", T, rnd(20, 3, 16, density=1))
    check("ijh,jhk->ik", T, rnd(20, 3, 16, density=1))
    check("ijh,jh->ih", T, rnd(20, 3, density=1))
    check("ijh->ih", T)
    check("ijh,ihk,jhk->ih", T, rnd(30, 3, 8, density=1), rnd(20, 3, 8, density=1))
    check("ijh,ih->ijh", T, rnd(30, 3, density=1), sparse_out=True)
    check("ijh,ihk,jhk->ijh", T, rnd(30, 3, 8, density=1), rnd(20, 3, 8, density=1), sparse_out=True)
    T32 = scorch.as_sparse(rnd(30, 20, 8, density=1, dtype=torch.float32) * mask.float(), fmt)
    check("ijh,jhk->ihk", T32, rnd(20, 8, 64, density=1, dtype=torch.float32))
    B = scorch.as_sparse(rnd(2, 30, 20, 3, density=1) * mask, Format((dense, dense, compressed, dense)))
    check("bijh,bjhk->bihk", B, rnd(2, 20, 3, 16, density=1))


@needs_cc
@pytest.mark.parametrize("k", [1, 8, 16, 24, 48, 64, 256, 1100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell", scorch.formats.bsr(2, 3)], ids=str)
def test_spmm_row_workspace_widths(k, dtype, fmt):
    """Vector-register rows (k a multiple of the vector width), array rows, and no workspace."""
    A = scorch.as_sparse(rnd(12, 9, dtype=dtype), fmt)
    X = rnd(9, k, density=1, seed=2, dtype=dtype)
    check("ij,jk->ik", A, X)
    check("ij,jk->ik", A, X[:, :k])                       # same shape through the fast path
    check("bij,bjk->bik", scorch.as_sparse(rnd(2, 6, 9, dtype=dtype), "csr"), rnd(2, 9, k, density=1, dtype=dtype))
    check("ij,kj->ik", A, rnd(k, 9, density=1, dtype=dtype))  # X read transposed: strided rows


@needs_cc
@pytest.mark.parametrize("eq,shapes", [("ij,jk->ik", [(40, 30), (30, 16)]), ("ij,j->i", [(40, 30), (30,)]),
                                       ("ij,ik,jk->ij", [(40, 30), (40, 8), (30, 8)]), ("ij,i->j", [(40, 30), (40,)])])
def test_small_problems_run_on_one_thread(monkeypatch, eq, shapes):
    """Below config.parallel_min_work a kernel gets one thread (no OpenMP wake-up); same results."""
    A = scorch.as_sparse(rnd(*shapes[0]), "csr")
    ops = [A] + [rnd(*s, density=1, seed=k) for k, s in enumerate(shapes[1:])]
    seen = {}  # min_work -> the thread counts chosen (kernels; the pattern's entry arrays on first use)
    threads_for = build.threads_for
    for min_work in (10**9, 0):
        monkeypatch.setattr(scorch.config, "parallel_min_work", min_work)
        monkeypatch.setattr(build, "threads_for",
                            lambda work, m=min_work: seen.setdefault(m, []).append(threads_for(work)) or seen[m][-1])
        check(eq, *ops)  # the general path, then the cached-call path
        check(eq, *ops)
    assert set(seen[10**9]) == {1} and set(seen[0]) == {build.num_threads()}


@needs_cc
@pytest.mark.parametrize("k", [16, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sddmm_reduces_four_nonzeros_at_once(k, dtype):
    """Rows of 0..9 stored entries: whole steps of four nonzeros and the one-at-a-time rest."""
    dense = torch.zeros(10, 12, dtype=dtype)
    for i in range(10):
        dense[i, :i] = torch.randn(i, dtype=dtype)
    A = scorch.as_sparse(dense, "csr")
    plan = check("ij,ik,jk->ij", A, rnd(10, k, density=1, dtype=dtype), rnd(12, k, density=1, seed=1, dtype=dtype))
    assert "scorch_hsum4_" in plan.source
    # index letters are C variable names: none may collide with the step's own temporaries
    check("su,sc,uc->su", A, rnd(10, k, density=1, dtype=dtype), rnd(12, k, density=1, seed=1, dtype=dtype))


@needs_cc
def test_sddmm_keeps_the_pattern():
    A = scorch.as_sparse(rnd(7, 8), "csr")
    out = scorch.einsum("ij,ik,jk->ij", A, rnd(7, 3, density=1), rnd(8, 3, density=1))
    assert isinstance(out, scorch.SparseTensor) and out.format == A.format and out.nnz == A.nnz
    assert out._crd[1] is A._crd[1]  # index arrays are shared, only values are new


@needs_cc
@pytest.mark.parametrize("eq,shapes,sparse_arg,fmt", [
    ("ijk,jr,kr->ir", [(4, 5, 6), (5, 3), (6, 3)], 0, "csf"),     # MTTKRP
    ("ijk,k->ij", [(4, 5, 6), (6,)], 0, "csf"),                    # TTV
    ("ijk,kl->ijl", [(4, 5, 6), (6, 2)], 0, "coo"),                # TTM
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)], 0, "csr"),           # batched SpMM
    ("bnd,bn->bd", [(6, 4, 3), (6, 4)], 1, "csr"),                # MoE gating
    ("ij,jk->ik", [(5, 6), (6, 4)], 1, "csr"),                    # dense x sparse
    ("ijk->", [(3, 4, 5)], 0, "csf"),
    ("ijkl,l->ijk", [(2, 3, 4, 5), (5,)], 0, "csf"),              # 4-d
    ("ijkl,jl->ik", [(2, 3, 4, 5), (3, 5)], 0, "coo"),
])
def test_tensor_kernels(eq, shapes, sparse_arg, fmt):
    ops = [rnd(*s, density=0.4 if k == sparse_arg else 1, seed=k) for k, s in enumerate(shapes)]
    ops[sparse_arg] = scorch.as_sparse(ops[sparse_arg], fmt)
    check(eq, *ops)


@needs_cc
def test_torch_einsum_and_torch_sparse_operands_route_to_scorch():
    A = rnd(5, 6)
    X = rnd(6, 3, density=1)
    for t in [A.to_sparse_csr(), A.to_sparse(), A.to_sparse_csc()]:
        got = scorch.einsum("ij,jk->ik", t, X)
        torch.testing.assert_close(got, A @ X)
    S = scorch.as_sparse(A, "csr")
    torch.testing.assert_close(torch.einsum("ij,jk->ik", S, X), A @ X)   # plain torch.einsum
    torch.testing.assert_close(torch.einsum("ij,jk->ik", [S, X]), A @ X)  # list form


@needs_cc
def test_dtypes_and_broadcasting():
    A = scorch.as_sparse(rnd(5, 6, dtype=torch.float32), "csr")
    check("ij,jk->ik", A, rnd(6, 3, density=1, dtype=torch.float32))
    out = scorch.einsum("ij,jk->ik", A.to(torch.bfloat16), rnd(6, 3, density=1).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    check("ij,jk->ik", A.double(), rnd(1, 3, density=1))               # size-1 dim broadcast
    check("ij,jk->ik", A.double(), rnd(3, 6, density=1).t())           # non-contiguous dense operand
    check("ij,jk->ik", A.double(), rnd(6, 3, density=1), format="csr")  # format= asks for sparse out


@needs_cc
def test_empty_and_zero_size():
    check("ij,jk->ik", scorch.as_sparse(torch.zeros(4, 5, dtype=torch.float64), "csr"), rnd(5, 3, density=1))
    check("ij,jk->ik", scorch.as_sparse(torch.zeros(0, 5, dtype=torch.float64), "csr"), rnd(5, 3, density=1))
    check("ij,jk->ik", scorch.as_sparse(torch.zeros(4, 0, dtype=torch.float64), "csr"), rnd(0, 3, density=1))
    check("ij,jk->ik", scorch.as_sparse(rnd(4, 5), "coo"), rnd(5, 0, density=1))


@needs_cc
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("csr", "coo"), ("dcsr", "csc"), ("ell", "csr")])
def test_spgemm_assembles_a_sparse_result(fa, fb):
    A, B = scorch.as_sparse(rnd(7, 6), fa), scorch.as_sparse(rnd(6, 9, seed=1), fb)
    plan = check("ij,jk->ik", A, B, sparse_out=True)
    assert "assembled" in plan.output_format and plan.parallel == "rows"
    C = scorch.einsum("ij,jk->ik", A, B)
    assert C.format == scorch.formats.csr
    want = (A.to_dense() @ B.to_dense())
    # the pattern is the structural product: every stored entry comes from some A[i,j] * B[j,k]
    struct = (A.to_dense() != 0).double() @ (B.to_dense() != 0).double()
    assert C.nnz == int((struct != 0).sum())
    torch.testing.assert_close(C.to_dense(), want)
    # index letters are C variable names: the assembly's temporaries must not take them
    check("mw,wk->mk", A, B, sparse_out=True)
    check("em,mw->ew", A, B, sparse_out=True)


@needs_cc
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("coo", "dcsr"), ("csc", "csc"), ("ell", "coo")])
def test_sparse_times_sparse_elementwise_is_the_intersection(fa, fb):
    a, b = rnd(8, 9), rnd(8, 9, seed=1)
    A, B = scorch.as_sparse(a, fa), scorch.as_sparse(b, fb)
    plan = check("ij,ij->ij", A, B, sparse_out=True)
    C = scorch.einsum("ij,ij->ij", A, B)
    assert C.nnz == int(((a != 0) & (b != 0)).sum())
    assert "{T0,T1}" in str(plan) or plan.loop_order == ("i", "j") or plan.loop_order == ("j", "i")


def test_bad_einsum_input():
    A = scorch.as_sparse(rnd(3, 3), "csr")
    with pytest.raises(TypeError, match="operand 1 must be a tensor"):
        scorch.einsum("ij,j->i", A, [1, 2, 3])
    with pytest.raises(ValueError, match="index 'j' has size 3"):
        scorch.einsum("ij,j->i", A, torch.ones(4))
    # complex computes as real einsums of the parts (test_reduce), integers in float64 (test_integer_values)
    torch.testing.assert_close(scorch.einsum("ij,j->i", A.to(torch.complex64), torch.ones(3, dtype=torch.complex64)),
                               A.to_dense().to(torch.complex64) @ torch.ones(3, dtype=torch.complex64))


@needs_cc
def test_torch_csr_operand_is_wrapped_without_copying():
    t = rnd(6, 5, dtype=torch.float32).to_sparse_csr()
    from scorch.compiler.driver import _operands
    (A,) = _operands((t,))
    assert A._crd[1].data_ptr() == t.col_indices().data_ptr() and A.values().data_ptr() == t.values().data_ptr()


def test_no_compiler_falls_back_to_torch_with_one_warning(monkeypatch):
    import warnings

    from scorch.compiler import driver
    monkeypatch.setenv("SCORCH_CC", "/nonexistent/cc")
    monkeypatch.setattr(driver, "_warned_no_cc", False)
    A, X = scorch.as_sparse(rnd(5, 11), "csr"), rnd(11, 3, density=1)  # shapes no other test uses
    assert scorch.explain("ij,jk->ik", A, X).backend == "torch (no C compiler)"
    with pytest.warns(UserWarning, match="no C compiler found"):
        out = scorch.einsum("ij,jk->ik", A, X)
    torch.testing.assert_close(out, A.to_dense() @ X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(scorch.einsum("ij,ik,jk->ij", A, rnd(5, 2, density=1), rnd(11, 2, density=1),
                                                 format="dense"),
                                   A.to_dense() * (rnd(5, 2, density=1) @ rnd(11, 2, density=1).t()))
        # the layers' kernel paths fall back too: fused bias, row softmax, MoE inference
        from scorch.nn import MoE
        from scorch.ops.einsum import einsum_add
        b = rnd(3, density=1, seed=4)
        torch.testing.assert_close(einsum_add("ij,jk->ik", (A, X), (b,)), A.to_dense() @ X + b)
        S = scorch.as_sparse(rnd(5, 11, seed=5), "csr")
        masked = S.to_dense().masked_fill(S.to_dense() == 0, float("-inf"))
        torch.testing.assert_close(torch.softmax(S, 1).to_dense(), torch.softmax(masked, 1).nan_to_num(0.0))
        m = MoE(6, 4, 3, k=1).double()
        x = rnd(7, 6, density=1, seed=6)
        with torch.no_grad():
            torch.testing.assert_close(m(x), m.dense_reference(x))
        # elementwise expressions (the union of patterns, a dense operand, max / min) evaluate densely
        B = scorch.as_sparse(rnd(5, 11, seed=7), "csr")
        a, bd = A.to_dense(), B.to_dense()
        for got, want in [(A + B, a + bd), (A - B, a - bd), (A + X[:, 0].unsqueeze(0).expand(5, 11).contiguous(),
                                                              a + X[:, 0].unsqueeze(0)),
                          (torch.maximum(A, B), torch.maximum(a, bd)), (torch.minimum(A, B), torch.minimum(a, bd)),
                          (-A + B * 2, -a + bd * 2)]:
            torch.testing.assert_close(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
        C = A + B   # the kind of result the kernels give: the union, its computed zeros kept
        assert isinstance(C, scorch.SparseTensor) and C.nnz == int(((a != 0) | (bd != 0)).sum())
        assert (A - A).nnz == A.nnz and isinstance(A * X[:, 0], scorch.SparseTensor)


# ------------------------------------------------------------------ init operands (fused additions)

@needs_cc
@pytest.mark.parametrize("eq,shapes,init_shapes,fused", [
    ("ij,jk->ik", [(12, 9), (9, 16)], [(16,)], True),                 # SpMM + bias: vector row workspace
    ("ij,jk->ik", [(12, 9), (9, 16)], [(16,), (12, 16)], True),       # + GraphSAGE's root term
    ("ij,jk->ik", [(12, 9), (9, 16)], [(16,), (12, 16), (1, 16)], True),  # more init terms than operands
    ("ij,jk->ik", [(12, 9), (9, 5)], [(1, 5)], True),                 # array row workspace
    ("ij,jk->ik", [(12, 9), (9, 256)], [(256,)], True),               # tiled long rows
    ("ij,j->i", [(12, 9), (9,)], [(12,)], True),                      # SpMV: scalar accumulator
    ("ij,i->j", [(12, 9), (12,)], [(9,)], False),                     # scatter: added afterwards
    ("ij,ik,jk->ij", [(12, 9), (12, 4), (9, 4)], [(12, 9)], False),   # sparse result: added afterwards
    ("ij,jk->ik", [(12, 9), (9, 16)], [(12, 1)], False),              # not unit-stride along k
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_init_operands_start_the_accumulators(eq, shapes, init_shapes, fused, dtype):
    from scorch.compiler import driver
    from scorch.ops.einsum import einsum_add
    A = scorch.as_sparse(rnd(*shapes[0], dtype=dtype), "csr")
    ops = [A] + [rnd(*s, density=1, seed=k + 1, dtype=dtype) for k, s in enumerate(shapes[1:])]
    init = [rnd(*s, density=1, seed=10 + k, dtype=dtype) for k, s in enumerate(init_shapes)]
    want = torch.einsum(eq, *[dense_of(o) for o in ops]) + sum(init)
    for _ in range(2):  # general path, then the cached-call path
        got = einsum_add(eq, ops, init)
        torch.testing.assert_close(dense_of(got), want, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                                   atol=1e-4 if dtype == torch.float32 else 1e-10)
    plan = driver._plan(eq, ops, None, n_init=len(init))[0]
    readable = driver._fusable_init(init, tuple(want.shape), dtype) is not None
    assert (plan.kernels[0].fused_init and readable) == fused
    if fused:
        assert "init0" in plan.source


@needs_cc
def test_init_operands_gradients_and_errors():
    from scorch.ops.einsum import einsum_add
    A = scorch.as_sparse(rnd(6, 5, density=0.5), "csr")
    H, b, R = (rnd(*s, density=1, seed=k).requires_grad_() for k, s in enumerate([(5, 8), (8,), (6, 8)]))
    assert torch.autograd.gradcheck(lambda H, b, R: einsum_add("ij,jk->ik", (A, H), (b, R)), (H, b, R))
    with pytest.raises(ValueError, match="does not broadcast"):
        einsum_add("ij,jk->ik", (A, H.detach()), (torch.zeros(3),))


def test_argument_filler_reads_each_operand():
    """The generated filler of a bound call sets each argument from its operand (oracle: the
    operands' own pointers and sizes); an argument kind it does not know is an InternalError."""
    from scorch.compiler import driver
    from scorch.errors import InternalError
    A, x = scorch.as_sparse(torch.eye(3), "csr"), torch.ones(3)
    fill = driver._filler(((0, "nthreads", None, None, None), (1, "pos", 0, 1, None), (2, "crd", 0, 1, None),
                           (3, "vals", 0, None, None), (4, "data", 1, None, None), (5, "ncrd", 0, 1, None)))
    args = [None] * 6
    fill((A, x), (), 2, args)
    assert args == [2, A._pos[1].data_ptr(), A._crd[1].data_ptr(), A.values().data_ptr(), x.data_ptr(), 3]
    with pytest.raises(InternalError, match="bogus"):
        driver._filler(((0, "bogus", 0, 0, None),))


@needs_cc
@pytest.mark.parametrize("eq,shapes,init_shapes", [
    ("ij,j->i", [(40, 30), (30,)], []),                         # dense result, rows in parallel
    ("ij,jk->ik", [(40, 30), (30, 5)], []),                     # SpMM
    ("ij,i->j", [(40, 30), (40,)], []),                         # scatter: one output copy per thread
    ("ij,ij->", [(40, 30), (40, 30)], []),                      # a 0-d result
    ("ij,ik,jk->ij", [(40, 30), (40, 4), (30, 4)], []),         # a result in the sparse operand's pattern
    ("ij,j->i", [(40, 30), (30,)], [(40,)]),                    # the kernel starts from an init operand
])
@pytest.mark.parametrize("min_work", [0, 10**9])
def test_generated_bound_call_matches_dense(monkeypatch, eq, shapes, init_shapes, min_work):
    """A cached call runs one generated function (sizes, strides and shape written into it);
    called again on new operands of the same signature -- new values, a new pattern -- it gives
    what dense torch gives, on one thread and on several."""
    from scorch.compiler import driver
    from scorch.ops.einsum import einsum_add
    monkeypatch.setattr(scorch.config, "parallel_min_work", min_work)
    monkeypatch.setattr(scorch.config, "dispatch", "sparse")

    def operands(seed):
        A = scorch.as_sparse(rnd(*shapes[0], seed=seed), "csr")
        return [A] + [rnd(*s, density=1, seed=seed + k + 1) for k, s in enumerate(shapes[1:])], \
            [rnd(*s, density=1, seed=seed + 9) for s in init_shapes]

    ops, init = operands(0)
    einsum_add(eq, ops, init)
    bound = driver._BOUND[driver._signature(eq, None, tuple(ops), tuple(init))]
    assert bound.call.__code__.co_filename == "<scorch bound call>"
    for seed in (1, 2):
        ops, init = operands(seed)
        want = torch.einsum(eq, *[dense_of(o) for o in ops]) + sum(init)
        got = bound.call(tuple(ops), tuple(init))
        assert isinstance(got, scorch.SparseTensor) == (eq == "ij,ik,jk->ij")
        torch.testing.assert_close(dense_of(got), want, rtol=1e-10, atol=1e-10)


@needs_cc
def test_bound_call_converting_the_result_takes_the_method():
    """A result to convert (a dense SpMM result asked for as CSR) is not the generated call's:
    the bound method serves it; a dense result asked for as dense is (row sums)."""
    from scorch.compiler import driver
    A, X = scorch.as_sparse(rnd(9, 8), "csr"), rnd(8, 3, density=1)
    for _ in range(2):
        got = scorch.einsum("ij,jk->ik", A, X, format="csr")
        assert isinstance(got, scorch.SparseTensor) and got.format == scorch.formats.csr
        torch.testing.assert_close(got.to_dense(), A.to_dense() @ X)
        sums = scorch.einsum("ij->i", A, format="dense")
        assert type(sums) is torch.Tensor
        torch.testing.assert_close(sums, A.to_dense().sum(1))
    bound = driver._BOUND[driver._signature("ij,jk->ik", "csr", (A, X))]
    assert bound.call == bound.__call__
    bound = driver._BOUND[driver._signature("ij->i", "dense", (A,))]
    assert bound.call.__code__.co_filename == "<scorch bound call>"


DIAGONALS = [  # (equation, operand shapes, which operands are sparse)
    ("ii->i", [(4, 4)], [0]), ("ii", [(4, 4)], [0]), ("ii->", [(4, 4)], [0]), ("ii,i->i", [(4, 4), (4,)], [0]),
    ("ij,jj->i", [(3, 4), (4, 4)], [0, 1]), ("ij,jj->i", [(3, 4), (4, 4)], [1]), ("iji->ij", [(3, 2, 3)], [0]),
    ("iji,j->i", [(3, 2, 3), (2,)], [0]), ("iji", [(3, 2, 3)], [0]), ("bii->b", [(2, 3, 3)], [0]),
    ("ii,ij->j", [(3, 3), (3, 5)], [1]),
]


@pytest.mark.parametrize("eq,shapes,sparse", DIAGONALS, ids=[d[0] + str(d[2]) for d in DIAGONALS])
@pytest.mark.parametrize("fmt", ["coo", "csr"])
def test_an_index_repeated_within_a_sparse_operand_takes_its_diagonal(eq, shapes, sparse, fmt):
    """``torch.einsum("ii->i", A)`` and kin (diagonals, traces) with sparse operands: the diagonal
    is taken on coordinates (they raised); oracle: torch.einsum on the dense operands, and
    gradcheck through the diagonal (w.r.t. the stored values and a dense operand)."""
    dense = [rnd(*s, density=0.6, seed=k) for k, s in enumerate(shapes)]
    ops = [scorch.as_sparse(x, fmt) if k in sparse else x for k, x in enumerate(dense)]
    torch.testing.assert_close(dense_of(torch.einsum(eq, *ops)), torch.einsum(eq, *dense))
    k = sparse[0]
    v = ops[k].values().clone().requires_grad_()
    others = [x.clone().requires_grad_() if j not in sparse else x for j, x in enumerate(ops)]

    def f(v, *rest):
        args = list(rest)
        args[k] = ops[k].with_values(v)
        return dense_of(torch.einsum(eq, *args))
    assert torch.autograd.gradcheck(f, (v, *others))


def test_a_repeated_index_over_unequal_sizes_is_a_clear_error():
    with pytest.raises(ValueError, match="index 'i' repeats in operand 0 over dims of sizes 2 and 3"):
        torch.einsum("ii->i", scorch.as_sparse(torch.ones(2, 3), "csr"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(256, 1024), (1024, 256), (17, 33), (1, 5), (0, 3), (3, 0), (16, 16), (100, 7), (7, 100)])
def test_generated_transpose_matches_torch(shape, dtype):
    """``permute.transposed`` (tiles transposed in registers, edges element by element) equals
    ``x.t().contiguous()``, tile-aligned or not; other inputs take torch's copy, and an input
    that requires grad keeps its gradient."""
    from scorch.compiler import permute
    x = torch.randn(shape, dtype=dtype)
    out = permute.transposed(x)
    assert out.is_contiguous() and torch.equal(out, x.t().contiguous())
    assert torch.equal(permute.transposed(x.t()), x)          # a non-contiguous input: torch's copy
    w = x.clone().requires_grad_()
    permute.transposed(w).sum().backward()
    assert torch.equal(w.grad, torch.ones_like(x))
    assert "scorch_tile_t_" + ("float" if dtype == torch.float32 else "double") in permute.source(
        "float" if dtype == torch.float32 else "double")


def test_an_init_the_kernel_cannot_start_from_is_added_after_the_cached_call():
    """``einsum_add`` whose loop order keeps no accumulator per output element (SpMM over a
    transposed batch, bias per output row) runs the plain kernel's cached call and adds the
    init after it (it re-planned every call); oracle: dense torch."""
    from scorch.compiler import driver
    from scorch.ops.einsum import einsum_add
    W = scorch.as_sparse(rnd(6, 5, density=0.4), "csr")
    x, b = rnd(5, 7, density=1.0, seed=1), rnd(6, 1, density=1.0, seed=2)
    for _ in range(2):
        out = einsum_add("oi,ib->ob", (W, x), (b,))
        torch.testing.assert_close(out, W.to_dense() @ x + b)
    bound = driver._BOUND[driver._signature("oi,ib->ob", None, (W, x), (b,))]
    assert type(bound).__name__ == "_InitAfter"
    f32 = rnd(6, 7, density=1.0, seed=3).float()   # a wider result type: added out of place
    torch.testing.assert_close(einsum_add("oi,ib->ob", (W, x), (f32,)), W.to_dense() @ x + f32)


@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (5,)), ((0, 1), (1, 3)), ((2, 1), (2, 3), (1, 1, 3))])
def test_broadcast_shapes_matches_torch(shapes):
    from scorch._dispatch import broadcast_shapes
    assert broadcast_shapes(*shapes) == tuple(torch.broadcast_shapes(*shapes))


def test_broadcast_shapes_refuses_what_torch_refuses():
    from scorch._dispatch import broadcast_shapes
    with pytest.raises(ValueError, match="do not broadcast"):
        broadcast_shapes((2, 3), (4,))


@needs_cc
@pytest.mark.parametrize("fmt,eq", [("csr", "ji,jk->ik"), ("csc", "ij,jk->ik"), ("coo", "ij,jk->ik"),
                                    ("dcsr", "ji,jk->ik"), ("ell", "ji,jk->ik")])
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_scattering_products_write_each_threads_own_rows(fmt, eq, rows):
    # A^T X over CSR, SpMM over CSC / COO: the result's rows come from every outer iteration.
    # Every thread walks all entries and writes only its share of the rows (no per-thread copies
    # of the result); values as dense torch's (the tests run kernels on every thread torch has)
    n = 30
    x = rnd(n, rows) if eq.startswith("ji") else rnd(rows, n)
    y = rnd(n, 16, density=1, seed=3)
    plan = check(eq, scorch.as_sparse(x, fmt), y)
    assert plan.parallel == "owner" and "own_lo" in plan.source


@needs_cc
def test_scattering_products_keep_per_thread_copies_when_rows_are_long():
    # each stored entry writes K = 2 values while the result's 4 rows hold 30 entries each: walking
    # every entry on every thread would cost more than per-thread copies of a 4 x 2 result
    x = rnd(30, 4, density=1)
    plan = check("ji,jk->ik", scorch.as_sparse(x, "csr"), rnd(30, 2, density=1, seed=3))
    assert plan.parallel == "buffers"


@pytest.mark.parametrize("levels", [("compressed", "padded"), ("compressed", "compressed", "padded"),
                                    ("dense", "compressed", "padded"), ("dense", "padded")])
def test_padded_level_under_stored_levels_reads_its_slots_per_call(levels):
    """A cached call over a padded level under stored ones: the slots per position come from
    each operand's own arrays, not from the first call's (an empty operand of the same shape
    first baked 0 slots in, and later calls silently summed nothing)."""
    from scorch import Format, Level
    fmt = Format(tuple(Level(kind) for kind in levels))
    shape = (5, 6, 7)[:len(levels)]
    v = rnd(shape[-1], density=1, seed=9)
    eq = "ab,b->a" if len(levels) == 2 else "abc,c->ab"
    for density, seed in [(0.0, 1), (0.3, 2), (1.0, 3), (0.1, 4), (0.3, 5)]:
        x = rnd(*shape, density=density, seed=seed)
        A = scorch.as_sparse(x, fmt)
        torch.testing.assert_close(scorch.einsum(eq, A, v), torch.einsum(eq, x, v))
        torch.testing.assert_close(A.to_dense(), x)


def test_explain_of_complex_operands_says_what_einsum_runs():
    # explain refused complex operands ("not supported by scorch's kernels") that einsum computes
    x = torch.tensor([[1 + 2j, 0], [0, 3 - 1j]], dtype=torch.complex64)
    A, X = scorch.as_sparse(x, "csr"), torch.ones(2, 2, dtype=torch.complex64)
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, X), x @ X)
    plan = scorch.explain("ij,jk->ik", A, X)
    real = scorch.explain("ij,jk->ik", scorch.as_sparse(x.real, "csr"), X.real)
    assert "the sum of 4 such real einsums" in plan.dispatch and plan.loop_order == real.loop_order
    assert plan.source == real.source and plan.output_format == real.output_format
    assert "the sum of 2" in scorch.explain("ij->i", A).dispatch
