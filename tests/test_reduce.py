"""Reductions and softmax on SparseTensors against dense torch / torch.sparse, and gradients."""

import math
import warnings

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density) + 0.0


FORMATS = ["csr", "coo", "csf", "ell", "dense"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dim,keepdim", [(None, False)] + [(d, k) for d in (0, 1, -1, (0, 2), (1, 2), (0, 1, 2))
                                                             for k in (False, True)])
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "any", "all"])
def test_reductions_match_dense(fmt, dim, keepdim, op):
    x = rnd(4, 5, 3)
    x[1] = 0  # an empty slice
    x[2, :, 1] = torch.arange(1.0, 6.0, dtype=torch.float64)  # a full fibre (no implicit zero)
    A = scorch.as_sparse(x, fmt)
    if dim is None:
        got, want = getattr(A, op)(), getattr(x, op)()
    else:
        got, want = getattr(torch, op)(A, dim, keepdim=keepdim), getattr(torch, op)(x, dim, keepdim=keepdim)
    assert not isinstance(got, scorch.SparseTensor)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_reduction_errors():
    A = scorch.as_sparse(rnd(3, 4), "csr")
    with pytest.raises(ValueError, match="dim 2 out of range"):
        A.sum(2)
    with pytest.raises(ValueError, match="repeats"):
        A.sum((0, 0))
    with pytest.raises(TypeError, match="mean: needs a floating point or complex dtype"):
        scorch.as_sparse(torch.ones(2, 2, dtype=torch.int64), "csr").mean()


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "dcsr", "ell", "csf"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_torch_sparse(fmt, dim, log):
    x = rnd(6, 7)
    x[3] = 0  # an empty row: stays empty
    A = scorch.as_sparse(x, fmt if fmt != "csf" else "csr")
    fn = torch.log_softmax if log else torch.softmax
    got = fn(A, dim)
    want = (torch.sparse.log_softmax if log else torch.sparse.softmax)(x.to_sparse(), dim).to_dense()
    assert isinstance(got, scorch.SparseTensor) and got.nnz == A.nnz
    torch.testing.assert_close(got.to_dense(), want)
    torch.testing.assert_close(torch.nn.functional.softmax(A, dim=dim).to_dense(),
                               torch.sparse.softmax(x.to_sparse(), dim).to_dense())


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_softmin_and_glu_keep_sparsity(fmt):
    """F.softmin is softmax(-x) with torch.sparse's semantics (oracle: torch.sparse.softmax of the
    negated COO tensor); F.glu's result is sparse in the first half's pattern (oracle: dense
    F.glu); neither takes the dense fallback, both differentiable."""
    x = rnd(6, 8)
    A = scorch.as_sparse(x, fmt)
    saved, scorch.config.dense_fallback = scorch.config.dense_fallback, "raise"
    try:
        got = torch.nn.functional.softmin(A, dim=1)
        g1, g0 = torch.nn.functional.glu(A, 1), torch.nn.functional.glu(A, dim=0)
        with pytest.raises(ValueError, match="glu: the size 7 of dim 1 of input .6, 7. must exist and be even"):
            torch.nn.functional.glu(scorch.as_sparse(x[:, :7], fmt), 1)
    finally:
        scorch.config.dense_fallback = saved
    torch.testing.assert_close(got.to_dense(), torch.sparse.softmax(-x.to_sparse(), 1).to_dense())
    assert isinstance(g1, scorch.SparseTensor) and g1.nnz == int((x[:, :4] != 0).sum())
    torch.testing.assert_close(g1.to_dense(), torch.nn.functional.glu(x, 1))
    torch.testing.assert_close(g0.to_dense(), torch.nn.functional.glu(x, 0))
    P, xd = A.detach().requires_grad_(), x.clone().requires_grad_()
    (torch.nn.functional.glu(P, 1) * 2).sum().backward()
    (torch.nn.functional.glu(xd, 1) * 2).sum().backward()
    torch.testing.assert_close(P.grad.to_dense(), xd.grad * (x != 0))


def test_softmax_3d():
    x = rnd(3, 4, 5)
    A = scorch.as_sparse(x, "csf")
    torch.testing.assert_close(torch.softmax(A, 1).to_dense(), torch.sparse.softmax(x.to_sparse(), 1).to_dense())


@pytest.mark.parametrize("f", [lambda A: A.sum(1), lambda A: A.mean((0, 1)), lambda A: A.amax(0),
                               lambda A: A.amin(1), lambda A: torch.softmax(A, 1).values(),
                               lambda A: torch.log_softmax(A, 0).to_dense()],
                         ids=["sum", "mean", "amax", "amin", "softmax", "log_softmax"])
def test_gradcheck(f):
    P = scorch.as_sparse(rnd(5, 6), "csr")
    v = P.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: f(P.with_values(v)), (v,))


def test_attention_pipeline_is_differentiable():
    """SDDMM -> sparse softmax -> SpMM, the GAT / sparse-attention core, against dense masked attention."""
    mask = rnd(6, 6, density=0.5) != 0
    mask.fill_diagonal_(True)
    M = scorch.as_sparse(mask.double(), "csr")
    Q, K, V = (rnd(6, 4, density=1, seed=s).requires_grad_() for s in (1, 2, 3))
    out = torch.softmax(scorch.einsum("ij,ik,jk->ij", M, Q, K), dim=1) @ V
    scores = (Q @ K.t()).masked_fill(~mask, float("-inf"))
    want = torch.softmax(scores, 1) @ V
    torch.testing.assert_close(out, want)
    assert torch.autograd.gradcheck(
        lambda Q, K, V: torch.softmax(scorch.einsum("ij,ik,jk->ij", M, Q, K), dim=1) @ V, (Q, K, V))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape,fmt", [((9, 40), "csr"), ((3, 7, 33), "csr"), ((3, 7, 33), "csf")])
def test_softmax_kernel_over_rows(monkeypatch, dtype, log, shape, fmt):
    """The generated row-segment kernel (no gradient needed): rows of every length from 0 up
    (vector blocks of 16 and the rest), -inf entries, a scale; against dense torch with the
    absent entries at -inf."""
    from scorch.compiler import segments
    from scorch.ops.reduce import _softmax
    calls = []
    monkeypatch.setattr(segments, "softmax", lambda *a, f=segments.softmax: calls.append(1) or f(*a))
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(*shape, generator=g, dtype=dtype) * 4
    keep = torch.arange(shape[-1]) < torch.arange(shape[-2]).unsqueeze(1) * 5   # row r keeps 5r entries
    dense = dense * keep
    dense[..., 1, 0] = float("-inf")
    x = scorch.as_sparse(dense, fmt)
    for scale in (1.0, 0.25):
        got = _softmax(x, -1, log, scale=scale).to_dense()
        masked = (dense * scale).masked_fill(dense == 0, float("-inf"))
        want = (torch.log_softmax if log else torch.softmax)(masked, -1)
        want = want.masked_fill(dense == 0, 0.0).nan_to_num(0.0, posinf=0.0, neginf=0.0)
        got = got.nan_to_num(0.0, posinf=0.0, neginf=0.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert calls


def _masked_softmax(dense, present, dim, log):
    """Dense oracle: softmax over the stored entries (``present``), absent ones -inf, then 0."""
    want = (torch.log_softmax if log else torch.softmax)(dense.masked_fill(~present, float("-inf")), dim)
    return want.masked_fill(~present, 0.0).nan_to_num(0.0, posinf=0.0, neginf=0.0)


TRAILING_DENSE = [  # (levels, shape, dim): the softmax level compressed, dense levels below it
    (("dense", "compressed", "dense"), (7, 40, 3), 1),     # CSR with a vector per entry (GAT heads)
    (("compressed", "compressed", "dense"), (5, 9, 4), 1),
    (("compressed", "dense"), (9, 6), 0),                   # one run: whole stored rows per column
    (("dense", "dense", "compressed"), (3, 7, 40), 2),      # batched CSR: width 1
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("levels,shape,dim", TRAILING_DENSE, ids=["dcd", "ccd", "cd", "ddc"])
def test_softmax_kernel_with_dense_levels_below(monkeypatch, dtype, log, levels, shape, dim):
    """softmax along a compressed level with dense levels under it runs the generated kernel
    over interleaved columns (one per position of the dense levels), against dense torch."""
    from scorch.compiler import segments
    from scorch.format import Format, Level
    widths = []
    monkeypatch.setattr(segments, "softmax", lambda *a, f=segments.softmax: widths.append(a[-1]) or f(*a))
    g = torch.Generator().manual_seed(1)
    # stored pattern: rows of every length from 0 to the full run, then dense levels fill in
    lead = shape[:dim + 1]
    keep = torch.rand(*lead, generator=g) < torch.linspace(0, 1, lead[-1])
    keep = keep.view(*lead, *([1] * (len(shape) - dim - 1))).expand(shape)
    dense = torch.randn(*shape, generator=g, dtype=dtype) * 3 * keep
    x = scorch.as_sparse(dense, Format(tuple(Level(k) for k in levels)))
    present = torch.zeros(shape, dtype=torch.bool)
    coords, _ = scorch.convert.coords_of(x._format, x._shape, x._pos, x._crd, x._vals)
    present[tuple(coords)] = True
    with torch.no_grad():
        got = (torch.log_softmax if log else torch.softmax)(x, dim)
    assert widths and widths[-1] == math.prod(shape[dim + 1:])
    assert got.nnz == x.nnz and got.format == x.format
    want = _masked_softmax(dense, present, dim, log)
    torch.testing.assert_close(got.to_dense().nan_to_num(0.0, posinf=0.0, neginf=0.0), want,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("levels,shape,dim", [(("dense", "compressed", "dense"), (4, 5, 2), 1),
                                              (("compressed", "dense"), (5, 3), 0)], ids=["dcd", "cd"])
def test_softmax_with_dense_levels_below_is_differentiable(log, levels, shape, dim):
    """With a gradient the differentiable per-run path runs (segment reductions over the runs,
    a column per position of the dense levels); it agrees with the kernel and gradchecks."""
    from scorch.format import Format, Level
    fn = torch.log_softmax if log else torch.softmax
    P = scorch.as_sparse(rnd(*shape), Format(tuple(Level(k) for k in levels)))
    v = P.values().clone().requires_grad_()
    with torch.no_grad():
        fast = fn(P, dim).values()
    torch.testing.assert_close(fn(P.with_values(v), dim).values(), fast)
    assert torch.autograd.gradcheck(lambda v: fn(P.with_values(v), dim).values(), (v,))


WHOLE = {  # op on a SparseTensor with a stored zero -> the same op on the dense tensor
    "max": lambda t: t.max(), "min": lambda t: torch.min(t), "any": lambda t: t.any(), "all": lambda t: torch.all(t),
    "count_nonzero": lambda t: torch.count_nonzero(t), "count_nonzero dim": lambda t: t.count_nonzero(dim=1),
    "count_nonzero dims": lambda t: torch.count_nonzero(t, dim=(0, 1)), "nonzero": lambda t: t.nonzero(),
    "nonzero as_tuple": lambda t: torch.stack(torch.nonzero(t, as_tuple=True)),
    "argmax": lambda t: t.argmax(), "argmin": lambda t: torch.argmin(t), "prod": lambda t: t.prod(),
    "prod dim": lambda t: t.prod(1), "prod keepdim": lambda t: torch.prod(t, 0, keepdim=True),
    "any dim": lambda t: t.any(1), "all dim": lambda t: torch.all(t != 0, dim=0, keepdim=True),
}


@pytest.mark.parametrize("name", list(WHOLE))
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "ell"])
def test_whole_tensor_reductions_and_nonzero_run_sparse(name, fmt):
    """max / min / any / all / count_nonzero / nonzero from the stored entries, without the dense
    fallback (a stored 0 counts as zero; nonzero in row-major order whatever the format);
    oracle: the op on the dense tensor (value, dtype and shape)."""
    import warnings
    x = rnd(5, 6)
    A = scorch.as_sparse(x, fmt)
    A = A.with_values(torch.cat([torch.zeros(1, dtype=A.dtype), A.values()[1:]]))  # one stored zero
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        got = WHOLE[name](A)
    want = WHOLE[name](A.to_dense())
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_max_min_of_a_full_negative_tensor_and_errors():
    """No implicit zero where every element is stored; max(A, dim) and max(A, B) go the torch way;
    no elements: a clear error."""
    import warnings
    x = -torch.rand(3, 4) - 1
    A = scorch.as_sparse(x, "csr")
    assert A.max() == x.max() and A.min() == x.min()
    assert scorch.as_sparse(torch.tensor([[0.0, -2.0]]), "csr").max() == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(torch.max(A, 1).values, x.max(1).values)
        assert torch.equal(torch.max(A, torch.zeros(3, 4)), torch.max(x, torch.zeros(3, 4)))
    with pytest.raises(ValueError, match="max: the tensor has no elements"):
        scorch.as_sparse(torch.zeros(0, 3), "csr").max()


SPREAD = {
    "var": lambda t: t.var(), "std": lambda t: t.std(), "var dim": lambda t: t.var(1),
    "var keepdim": lambda t: torch.var(t, 0, keepdim=True), "var correction=0": lambda t: t.var(correction=0),
    "std unbiased=False": lambda t: torch.std(t, 1, unbiased=False), "var dims": lambda t: t.var((0, 1)),
    "diagonal": lambda t: t.diagonal(), "diagonal 2": lambda t: torch.diagonal(t, 2),
    "diagonal -3": lambda t: t.diagonal(-3), "diagonal past the end": lambda t: t.diagonal(9),
    "diagonal 1,0": lambda t: torch.diagonal(t, 1, 1, 0), "trace": lambda t: torch.trace(t),
}


@pytest.mark.parametrize("name", list(SPREAD))
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "ell"])
def test_var_std_diagonal_trace_run_sparse_and_differentiate(name, fmt):
    """var / std (two passes over the stored values), diagonal and trace without the dense
    fallback; oracle: the op on the dense tensor, value and gradient at the stored entries."""
    import warnings
    x = rnd(5, 7)
    A = scorch.as_sparse(x, fmt).requires_grad_()
    xd = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        got = SPREAD[name](A)
    want = SPREAD[name](xd)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    if want.numel():
        (g,), (gd,) = torch.autograd.grad(got.sum(), A), torch.autograd.grad(want.sum(), xd)
        torch.testing.assert_close(g.to_dense(), gd * (x != 0))


def test_var_keeps_float32_precision_under_a_large_offset():
    """Values around 1e4 with a spread of 0.3 in float32: a sum of squares would cancel; the two
    passes match torch's own (oracle)."""
    y = torch.rand(4, 6, generator=torch.Generator().manual_seed(0)) + 1e4
    torch.testing.assert_close(scorch.as_sparse(y, "csr").var(1), y.var(1), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("rows", [[[1.0, 0, 3], [2, 3, 0]], [[-1.0, -2, -3], [-2, -3, -1]], [[-1.0, 0, -3], [0, -3, -1]],
                                  [[0.0, 0], [0, 0]], [[0.0, -1], [-2, -3]], [[2.0, 3], [3, 1]]])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_argmax_argmin_prod_ties_and_implicit_zeros(rows, fmt):
    """The first flat index of the extreme (a stored value or an implicit zero, whichever comes
    first), and products that an implicit zero makes 0; oracle: dense torch."""
    x = torch.tensor(rows)
    A = scorch.as_sparse(x, fmt)
    assert A.argmax() == x.argmax() and A.argmin() == x.argmin()
    assert torch.equal(A.prod(), x.prod()) and torch.equal(A.prod(1), x.prod(1)) and torch.equal(A.prod(0), x.prod(0))


@pytest.mark.parametrize("rows", [[[1.0, 0, 3], [2, 3, 0]], [[-1.0, -2, -3], [-2, -3, -1]], [[-1.0, 0, -3], [0, -3, -1]],
                                  [[0.0, 0], [0, 0]], [[-1.0, -1, 0, -2], [-3, 0, 0, -1], [0, 0, 0, 0]]])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_max_min_argmax_along_a_dim(rows, fmt):
    """max / min along a dim give torch's (values, indices): the first position of the extreme,
    a stored value or an implicit zero; argmax / argmin along a dim likewise; oracle: dense torch."""
    import warnings
    x = torch.tensor(rows)
    A = scorch.as_sparse(x, fmt)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        for d in (0, 1, -1):
            for keepdim in (False, True):
                for f in (torch.max, torch.min):
                    got, want = f(A, d, keepdim), f(x, d, keepdim)
                    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
                for f in (torch.argmax, torch.argmin):
                    assert torch.equal(f(A, d, keepdim), f(x, d, keepdim))
            assert torch.equal(A.max(dim=d).indices, x.max(dim=d).indices)
        assert torch.equal(A.argmax(keepdim=True), x.argmax(keepdim=True))


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("fmt", ["dcsr", "coo", "csr"])
def test_extremes_over_mostly_empty_fibres_match_dense_and_differentiate(op, fmt):
    # more result positions than 4x the stored entries: only the fibres holding entries are reduced
    # (a 10^8-row hypersparse matrix took 6.2 s and 2 GB before), the rest are their implicit 0
    g = torch.Generator().manual_seed(3)
    x = torch.zeros(300, 5, dtype=torch.float64)
    x[torch.tensor([3, 3, 70, 299, 150]), torch.tensor([0, 4, 2, 1, 0])] = torch.tensor([-2.0, 5.0, -1.5, 3.0, 4.0], dtype=torch.float64)
    x[150] = torch.randn(5, generator=g, dtype=torch.float64) - 3  # a full row: no implicit zero
    A = scorch.as_sparse(x, fmt).requires_grad_()
    got = getattr(A, op)(1)
    torch.testing.assert_close(got, getattr(x, op)(1))
    w = torch.randn(300, generator=g, dtype=torch.float64)
    (got * w).sum().backward()
    xd = x.clone().requires_grad_()
    (getattr(xd, op)(1) * w).sum().backward()
    stored = torch.zeros_like(x)
    stored[tuple(A.detach().indices())] = 1
    torch.testing.assert_close(A.grad.to_dense(), xd.grad * stored)


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("fa,fb", [("csr", "coo"), ("csc", "csc"), ("ell", "dense tensor")])
def test_losses_of_sparse_operands(loss, reduction, fa, fb):
    """mse / l1 loss of a SparseTensor against a sparse (other pattern) or dense target: no dense
    fallback, the value and reduction='none' layout of torch's on the dense tensors, and the
    input's gradient at its pattern."""
    import warnings
    f = getattr(torch.nn.functional, loss)
    a, b = 2 * rnd(5, 6, seed=1), rnd(5, 6, seed=2)   # (differences on both sides of beta / delta = 1)
    A = scorch.as_sparse(a, fa).requires_grad_()
    B = b if fb == "dense tensor" else scorch.as_sparse(b, fb)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        got = f(A, B, reduction=reduction)
    x = a.clone().requires_grad_()
    want = f(x, b, reduction=reduction)
    assert isinstance(got, scorch.SparseTensor) == (reduction == "none" and fb != "dense tensor")
    torch.testing.assert_close(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
    w = torch.randn(want.shape, dtype=torch.float64)
    (got * w).sum().backward()
    (want * w).sum().backward()
    on = A.detach()._like(values=torch.ones(A._vals.shape), nnz=A._stored).to_dense() != 0
    torch.testing.assert_close(A.grad.to_dense(), torch.where(on, x.grad, 0.0))


def test_mse_loss_bad_reduction():
    A = scorch.as_sparse(rnd(3, 4), "csr")
    with pytest.raises(ValueError, match="reduction"):
        torch.nn.functional.mse_loss(A, A, reduction="max")


@pytest.mark.parametrize("test,invert", [([1.5, -2.0], False), ([0.0, 1.5], False), ([0.0], True), ([3.0], True)])
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_isin(test, invert, fmt):
    """isin: a bool SparseTensor in the pattern where the absent zeros test False, else dense;
    a sparse test_elements counts 0 unless full; oracle: torch.isin on the dense tensors."""
    import warnings
    x = torch.tensor([[1.5, 0, -2.0], [0, 3.0, 1.5]], dtype=torch.float64)
    A, t = scorch.as_sparse(x, fmt), torch.tensor(test, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.isin(A, t, invert=invert)
    want = torch.isin(x, t, invert=invert)
    zero_true = bool(torch.isin(torch.zeros((), dtype=x.dtype), t, invert=invert))
    assert isinstance(got, scorch.SparseTensor) == (not zero_true)
    assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
    T = scorch.as_sparse(torch.tensor([[0.0, 3.0]], dtype=x.dtype), "coo")   # stores 3; 0 absent: counts
    assert torch.equal(torch.isin(x, T), torch.isin(x, torch.tensor([0.0, 3.0], dtype=x.dtype)))


VALUE_KINDS = {   # (name) -> a dense 2 x 4 tensor with absent zeros, in a dtype and with values that
    "int64": torch.tensor([[0, 3, 0, -7], [-2, 0, 5, 0]]),                 # have tripped reductions
    "int8": torch.tensor([[0, 3, 0, -7], [-2, 0, 5, 0]], dtype=torch.int8),
    "uint8": torch.tensor([[0, 3, 0, 7], [2, 0, 5, 0]], dtype=torch.uint8),
    "bool": torch.tensor([[False, True, False, False], [False, False, False, False]]),
    "nan": torch.tensor([[0.0, float("nan"), 1.0, 0.0], [-2.0, 0.0, 0.0, float("inf")]]),
}


@pytest.mark.parametrize("kind", list(VALUE_KINDS))
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_extremes_products_and_flags_over_integer_bool_and_nan_values(kind, fmt):
    """max / min / argmax / argmin / amax / amin / median / prod / any / all of integer, bool and
    NaN-holding values: the dtypes, the values and the indices dense torch gives (the extremes
    started from +-inf, which integers cannot hold and bool reads as True; a NaN's index was past
    the end; a product of a NaN or inf with an absent zero was 0)."""
    x = VALUE_KINDS[kind]
    A = scorch.as_sparse(x, fmt)
    ops = {"amax": lambda t: t.amax(), "amax1": lambda t: t.amax(1), "amin0": lambda t: torch.amin(t, 0),
           "max1": lambda t: tuple(t.max(1)), "min0": lambda t: tuple(t.min(0)), "max": lambda t: t.max(),
           "any1": lambda t: t.any(1), "all0": lambda t: t.all(0), "any": lambda t: t.any(dim=(0, 1))}
    if kind != "bool":   # (torch has no bool argmax / median)
        ops.update({"argmax": lambda t: t.argmax(), "argmin1": lambda t: t.argmin(1), "prod1": lambda t: t.prod(1),
                    "median1": lambda t: t.median(1).values,   # (its index among tied zeros is torch's choice)
                    "median": lambda t: t.median(), "prod": lambda t: t.prod()})
    for name, op in ops.items():
        got, want = op(A), op(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert g.dtype == w.dtype, name
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=name)


def test_norms_sums_and_empty_dims_follow_torch():
    """A norm along a dim is NaN where the fibre holds a NaN (it was 0); ``sum(dtype=)`` casts
    before summing (float16 overflowed); ``dim=()`` / ``[]`` reduce every dim; a dim out of range
    is an IndexError, as torch's.  Oracle: dense torch."""
    x = torch.tensor([[0.0, float("nan"), 1.0], [-2.0, 0.0, 0.0]])
    A = scorch.as_sparse(x, "csr")
    for got, want in [(A.norm(dim=1), x.norm(dim=1)), (torch.linalg.vector_norm(A, 3, dim=1),
                                                        torch.linalg.vector_norm(x, 3, dim=1))]:
        torch.testing.assert_close(got, want, equal_nan=True)
    h = torch.zeros(2000, dtype=torch.float16)
    h[::2] = 100.0
    H = scorch.as_sparse(h, "coo")
    for got, want in [(H.sum(dtype=torch.float32), h.sum(dtype=torch.float32)),
                      (H.mean(dtype=torch.float32), h.mean(dtype=torch.float32))]:
        assert got.dtype == want.dtype and torch.isfinite(got)
        torch.testing.assert_close(got, want)
    f = torch.tensor([[0.0, 1.7, 0.0], [2.5, 0.0, -3.9]])
    for dtype in (torch.int32, torch.bool, torch.float64):   # cast first, then summed: in that dtype
        for got, want in [(scorch.as_sparse(f, "csr").sum(dtype=dtype), f.sum(dtype=dtype)),
                          (scorch.as_sparse(f, "coo").sum(1, dtype=dtype), f.sum(1, dtype=dtype))]:
            assert got.dtype == want.dtype and torch.equal(got, want)
    g = torch.tensor([[0.0, 2.0, 0.0], [-1.0, 0.0, 3.0]])
    G = scorch.as_sparse(g, "csr")
    for op in (lambda t: t.sum(()), lambda t: t.sum(dim=[]), lambda t: t.mean(dim=[]), lambda t: t.nansum(()),
               lambda t: torch.count_nonzero(t, ()), lambda t: t.sum((), keepdim=True)):
        got, want = op(G), op(g)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
    for op in (lambda t: t.sum(5), lambda t: t.amax(2), lambda t: t.max(-3), lambda t: t.argmax(2),
               lambda t: t.transpose(0, 2)):
        with pytest.raises(IndexError, match="out of range"):
            op(G)


def test_norms_of_ell_skip_what_is_written_in_its_unused_slots():
    """ELL's values() holds its padding slots too; values written there (with_values of a full-length
    array) are not entries: every norm over all dims reads only the stored entries, as the others do."""
    x = torch.tensor([[1.0, 0, 2, 0], [0, 0, 0, 0], [3, 0, 0, 0], [0, 4, 5, 6]])
    A = scorch.as_sparse(x, format="ell")
    B = A.with_values(torch.full_like(A.values(), -7.0))
    D = B.to_dense()
    assert int((D != 0).sum()) == 6 and B.values().numel() > 6
    for f in (lambda t: t.norm(), lambda t: torch.linalg.norm(t), lambda t: torch.linalg.vector_norm(t, 1),
              lambda t: torch.linalg.vector_norm(t, 0.5), lambda t: torch.linalg.vector_norm(t, float("inf")),
              lambda t: t.norm(p=3), lambda t: t.sum(), lambda t: t.abs().amax()):
        torch.testing.assert_close(f(B), f(D))


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc"])
def test_complex_sums_means_and_products(fmt):
    """Complex values: the kernels compute real ones, so an einsum with a complex sparse operand is
    the sum of the real einsums of the parts (times i where imaginary parts meet); differentiable
    as torch's complex autograd (it raised 'not supported')."""
    g = torch.Generator().manual_seed(0)
    d = torch.complex(torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g))
    d = d * (torch.rand(4, 5, generator=g) < 0.5)
    X = torch.complex(torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g))
    P, Q = torch.randn(4, 2, generator=g).to(torch.complex64), torch.randn(5, 2, generator=g).to(torch.complex64)
    A = scorch.as_sparse(d, fmt)
    for f in (lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.mean(), lambda t: t.mean(0), lambda t: t @ X,
              lambda t: t @ X[:, 0], lambda t: t.t() @ torch.ones(4, 2, dtype=torch.complex64),
              lambda t: torch.addmm(torch.ones(4, 3, dtype=torch.complex64), t, X),
              lambda t: torch.einsum("ij,ik,jk->ij", t, P, Q), lambda t: t @ t.t()):
        got, want = f(A), f(d)
        got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # real / imag keep the pattern (they ran densely)
        for part in ("real", "imag"):
            got = getattr(A, part)
            assert isinstance(got, scorch.SparseTensor) and torch.equal(got.to_dense(), getattr(d, part))
    As, Xs = scorch.as_sparse(d, fmt).requires_grad_(), X.clone().requires_grad_()
    D, Xd = d.clone().requires_grad_(), X.clone().requires_grad_()
    ((As @ Xs).abs().sum() + As.sum(1).abs().sum()).backward()
    ((D @ Xd).abs().sum() + D.sum(1).abs().sum()).backward()
    torch.testing.assert_close(Xs.grad, Xd.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(As.grad.to_dense(), D.grad * (d != 0), atol=1e-5, rtol=1e-5)
