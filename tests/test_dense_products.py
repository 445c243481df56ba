"""Dense products on generated kernels: the all-dense loop order, register blocking of rows
(:mod:`scorch.compiler.jam`), and :func:`scorch.ops.dense.linear` with its choice between the
generated kernel and torch's.  Oracles: the same products in float64 with plain torch.
"""

import pytest
import torch
import torch.nn.functional as F

import scorch
from scorch.compiler import build, driver
from scorch.compiler.ir import Assign, Block, Const, Decl, For, Var, Vec, VecZero
from scorch.compiler.jam import jam_rows
from scorch.ops import dense

needs_cc = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


# ---------------------------------------------------------------- the IR pass, without a compiler

def _row_loop(bound_j=Var("n_j")):
    """``for i: w = 0; for j: v = A[i, j]; w += v * B[j]; out[i] = w``."""
    inner = Block((Decl("const float", "v0", Var("d0")[Var("i") * Var("s0") + Var("j")]),
                   Assign(Var("w0"), Var("v0") * Vec(Var("d1") + Var("j"), "float"), "+=")))
    body = Block((Decl("scorch_vec_float", "w0", VecZero()), For("j", Const(0), bound_j, inner),
                  Assign(Vec(Var("outp") + Var("i"), "float"), Var("w0"))))
    return For("i", Var("lo_t"), Var("hi_t"), body)


def test_jam_rows_shares_row_independent_loads():
    out = jam_rows(_row_loop(), 3)
    assert out is not None and len(out) == 2
    blocks, rest = out
    assert blocks.var == "i_blk" and rest.var == "i"           # the remainder runs the original body
    assert rest.body == _row_loop().body
    text = str(blocks)
    for r in range(3):
        assert f"i_r{r}" in text and f"w0_r{r}" in text and f"v0_r{r}" in text
    inner = next(s for s in blocks.body.body if isinstance(s, For))
    assert inner.var == "j" and len(inner.body.body) == 6     # 3 loads of A, 3 accumulations
    assert sum(isinstance(s, Decl) and s.name.startswith("w0_r") for s in blocks.body.body) == 3


def test_jam_rows_refuses_row_dependent_bounds():
    """A compressed level: the inner loop's range depends on the row, rows cannot share it."""
    assert jam_rows(_row_loop(bound_j=Var("pos")[Var("i")]), 4) is None
    assert jam_rows(_row_loop(), 1) is None


# ---------------------------------------------------------------- generated dense products

@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("m,k,n", [(1, 5, 16), (7, 3, 32), (37, 20, 64), (50, 9, 128), (23, 11, 768), (13, 4, 48)])
def test_compiled_matches_torch(dtype, m, k, n):
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g, dtype=dtype), torch.randn(k, n, generator=g, dtype=dtype)
    bias = torch.randn(n, generator=g, dtype=dtype)
    got = driver.compiled("ij,jk->ik", (a, b), (bias,))
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.double(), a.double() @ b.double() + bias.double(), atol=tol, rtol=tol)


@needs_cc
def test_compiled_plan_is_row_blocked():
    a, b = torch.randn(40, 24), torch.randn(24, 64)
    plan = driver.explain("ij,jk->ik", a, b)
    assert plan.loop_order == ("i", "j", "k") and plan.parallel == "rows"
    assert any("register-blocked" in note for note in plan.notes)
    assert "i_r5" in plan.source


@needs_cc
def test_compiled_strided_operands():
    """A transposed left operand and a row-sliced right one: strides are kernel arguments."""
    a = torch.randn(30, 45).t()                       # 45 x 30, not contiguous
    b = torch.randn(30, 96)[:, 16:80]                 # 30 x 64, row stride 96
    got = driver.compiled("ij,jk->ik", (a, b))
    torch.testing.assert_close(got, a @ b, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- ops.dense.linear

@pytest.fixture(params=["compiled", "torch", "auto"])
def mode(request, monkeypatch):
    if request.param != "torch" and not build.have_compiler():
        pytest.skip("no C compiler")
    monkeypatch.setattr(scorch.config, "dense_kernels", request.param)
    return request.param


@pytest.mark.parametrize("shape", [(300, 40), (2, 70, 40), (40,)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_torch(mode, shape, with_bias):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(*shape, generator=g), torch.randn(64, 40, generator=g)
    b = torch.randn(64, generator=g) if with_bias else None
    got = dense.linear(x, w, b)
    assert got.shape == F.linear(x, w, b).shape
    torch.testing.assert_close(got.double(), F.linear(x.double(), w.double(), None if b is None else b.double()),
                               atol=1e-4, rtol=1e-4)


def test_linear_gradients(mode):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(90, 24, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, 24, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(32, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w, b: dense.linear(x, w, b), (x, w, b))


@needs_cc
def test_linear_follows_weight_updates(monkeypatch):
    """In-place updates of the weight, tracked or through ``.data``, show in the next call."""
    monkeypatch.setattr(scorch.config, "dense_kernels", "compiled")
    x, w = torch.randn(20, 8), torch.nn.Parameter(torch.randn(16, 8))
    first = dense.linear(x, w)
    with torch.no_grad():
        w.mul_(2.0)
    torch.testing.assert_close(dense.linear(x, w), 2.0 * first, atol=1e-5, rtol=1e-5)
    w.data.mul_(0.5)
    torch.testing.assert_close(dense.linear(x, w), first, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dense.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)


@needs_cc
def test_linear_ineligible_shapes_use_torch(monkeypatch):
    """Widths that are not whole vectors, integer dtypes, mixed dtypes: torch's kernel, same result."""
    monkeypatch.setattr(scorch.config, "dense_kernels", "compiled")
    x = torch.randn(10, 6)
    for w in (torch.randn(5, 6), torch.randn(16, 6, dtype=torch.float64)):
        calls = driver._DENSE_BOUND.copy()
        if w.dtype == x.dtype:
            torch.testing.assert_close(dense.linear(x, w), F.linear(x, w))
        else:
            with pytest.raises(RuntimeError):   # torch's own dtype error, as without scorch
                dense.linear(x, w)
        assert driver._DENSE_BOUND.keys() == calls.keys()


def test_auto_measures_once_per_shape(monkeypatch):
    if not build.have_compiler():
        pytest.skip("no C compiler")
    monkeypatch.setattr(scorch.config, "dense_kernels", "auto")
    monkeypatch.setattr(dense, "_CHOICES", {})
    monkeypatch.setattr(dense, "_MIN_WORK", 0)
    x, w = torch.randn(64, 32), torch.randn(32, 32)
    dense.linear(x, w)
    dense.linear(x, w)
    assert len(dense._CHOICES) == 1 and next(iter(dense._CHOICES.values())) in ("compiled", "torch")


def test_bad_mode_names_the_setting(monkeypatch):
    with pytest.raises(ValueError, match="dense_kernels"):   # checked when set
        scorch.config.dense_kernels = "fast"
    with pytest.raises(TypeError, match="auto_sparsify must be True or False, got 'yes'"):
        scorch.config.auto_sparsify = "yes"
    with pytest.raises(ValueError, match="parallel_min_work must be a non-negative int, got -5"):
        scorch.config.parallel_min_work = -5
    with pytest.raises(AttributeError, match="no setting 'dens_fallback'"):
        scorch.config.dens_fallback = "raise"
    assert scorch.config.dense_kernels == "auto" and scorch.config.auto_sparsify is False


def test_jam_rows_refuses_effects_each_row_repeats():
    """A row-independent store (``out[0] += 1``) must run once per row: not jammed.  A
    prefetch and an assignment to a body-local variable may run once per block."""
    from scorch.compiler.ir import Call, Eval, Load
    loop = _row_loop()
    effect = Assign(Load(Var("outp"), Const(0)), Const(1.0), "+=")
    assert jam_rows(For("i", loop.lo, loop.hi, Block(loop.body.body + (effect,))), 2) is None
    fetch = Eval(Call("__builtin_prefetch", (Var("d1"),)))
    decl, inner, store = loop.body.body
    extra = (Decl("float", "t", Const(1.0)), fetch, Assign(Var("t"), Const(2.0)))
    inner = For(inner.var, inner.lo, inner.hi, Block(extra + inner.body.body))
    blocks, _ = jam_rows(For("i", loop.lo, loop.hi, Block((decl, inner, store))), 2)
    text = str(blocks)
    assert text.count("__builtin_prefetch") == 1 and text.count("t = 2.0") == 1
