"""+ - * / with SparseTensors against the same op on dense tensors (result layout included),
and their gradients (gradcheck, float64)."""

import warnings

import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return (x * (torch.rand(*shape, generator=g) < density)) + 0.0  # + 0.0: no negative zeros


def dense(y):
    return y.to_dense() if isinstance(y, scorch.SparseTensor) else y


CASES = [  # (name, function, sparse result?)
    ("A+B", lambda A, B, x: A + B, True),
    ("A-B", lambda A, B, x: A - B, True),
    ("A*B", lambda A, B, x: A * B, True),
    ("A*x", lambda A, B, x: A * x, True),
    ("x*A", lambda A, B, x: x * A, True),
    ("A*row", lambda A, B, x: A * x[0], True),
    ("A/x", lambda A, B, x: A / (x.abs() + 1), True),
    ("A+x", lambda A, B, x: A + x, False),
    ("x-A", lambda A, B, x: x - A, False),
    ("A*2", lambda A, B, x: A * 2, True),
    ("2*A", lambda A, B, x: 2 * A, True),
    ("A/2", lambda A, B, x: A / 2, True),
    ("A-1", lambda A, B, x: A - 1, False),
    ("1-A", lambda A, B, x: 1 - A, False),
    ("-A", lambda A, B, x: -A, True),
    ("add alpha", lambda A, B, x: torch.add(A, B, alpha=2), True),
    ("sub", lambda A, B, x: torch.sub(A, B), True),
    ("mul", lambda A, B, x: torch.mul(A, x), True),
    ("A+A", lambda A, B, x: A + A, True),
    ("A//2", lambda A, B, x: A // 2, True),
    ("floor_divide", lambda A, B, x: torch.floor_divide(A, 3), True),
]


@pytest.mark.parametrize("name,f,sparse", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("coo", "dcsr"), ("csc", "ell")])
def test_against_dense(name, f, sparse, fa, fb):
    """Three calls on new operands of one signature: the later ones take the cached-call path."""
    for seed in range(0, 9, 3):
        a, b, x = rnd(5, 6, seed=seed), rnd(5, 6, seed=seed + 1), rnd(5, 6, density=1, seed=seed + 2)
        A, B = scorch.as_sparse(a, fa), scorch.as_sparse(b, fb)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # none of these is a fallback
            got = f(A, B, x)
        want = f(a, b, x)
        assert isinstance(got, scorch.SparseTensor) == sparse, type(got)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(dense(got), want)


@pytest.mark.parametrize("fb", ["csr", "coo"])
def test_union_and_difference_cached(fb):
    """a + b and a - b share an equation with a * b: the cached calls keep them apart (each
    signature's bound call carries its expression, also where it re-formats an operand)."""
    from scorch.compiler import driver
    for seed in range(3):
        a, b = rnd(7, 8, seed=10 + seed), rnd(7, 8, seed=20 + seed)
        A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, fb)
        for f in (lambda u, v: u + v, lambda u, v: u - v, lambda u, v: u * v):
            torch.testing.assert_close(dense(f(A, B)), f(a, b))
    kinds = {type(v).__name__ for k, v in driver._BOUND.items() if k[0] == "ab,ab->ab" and k[4:6] == (A._sig, B._sig)}
    assert kinds <= {"_Assembled", "_Slow"} and kinds, kinds


def test_union_and_intersection_patterns():
    a, b = rnd(6, 7), rnd(6, 7, seed=1)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "csr")
    assert (A + B).nnz == int(((a != 0) | (b != 0)).sum())
    assert (A * B).nnz == int(((a != 0) & (b != 0)).sum())


def test_division_that_would_make_nans_is_dense():
    a, b = rnd(4, 5), rnd(4, 5, seed=1)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "csr")
    out = A / B  # 0/0 at entries absent in both: NaN, as in dense torch
    assert not isinstance(out, scorch.SparseTensor)
    torch.testing.assert_close(out, a / b, equal_nan=True)


@pytest.mark.parametrize("name,f", [("A+B", lambda A, B, x: A + B), ("A-B", lambda A, B, x: A - B),
                                    ("A*B", lambda A, B, x: A * B), ("A*x", lambda A, B, x: A * x),
                                    ("A+x", lambda A, B, x: A + x), ("x-A", lambda A, B, x: x - A),
                                    ("A/x", lambda A, B, x: A / (x * x + 1))])
def test_gradcheck(name, f):
    P, Q = scorch.as_sparse(rnd(4, 5), "csr"), scorch.as_sparse(rnd(4, 5, seed=1), "coo")
    v, w = P.values().clone().requires_grad_(), Q.values().clone().requires_grad_()
    x = rnd(4, 5, density=1, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, w, x: dense(f(P.with_values(v), Q.with_values(w), x)), (v, w, x))


UNARY = {  # op: keeps the pattern (f(0) == 0)?
    "neg": (torch.neg, True), "abs": (torch.abs, True), "relu": (torch.relu, True), "sqrt": (torch.sqrt, True),
    "sin": (torch.sin, True), "tanh": (torch.tanh, True), "sign": (torch.sign, True),
    "pow2": (lambda x: torch.pow(x, 2), True), "pow0.5": (lambda x: x.abs().pow(0.5), True),
    "clamp(-1,1)": (lambda x: torch.clamp(x, -1, 1), True), "clamp(min=0.5)": (lambda x: x.clamp(min=0.5), False),
    "exp": (torch.exp, False), "cos": (torch.cos, False), "sigmoid": (torch.sigmoid, False),
    "leaky_relu": (torch.nn.functional.leaky_relu, True), "gelu": (torch.nn.functional.gelu, True),
}


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell", "csf"])
def test_unary_ops(name, fmt):
    f, keeps = UNARY[name]
    x = rnd(5, 6)
    A = scorch.as_sparse(x, fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = f(A)
    want = f(x)
    assert isinstance(got, scorch.SparseTensor) == keeps
    if keeps:
        assert got.nnz == A.nnz
    torch.testing.assert_close(dense(got), want, equal_nan=True)


def test_linalg_gradchecks():
    P = scorch.as_sparse(rnd(4, 5), "csr")
    v = P.values().clone().requires_grad_()
    m, inp = rnd(5, 3, density=1).requires_grad_(), rnd(4, 3, density=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda v, m, inp: torch.addmm(inp, P.with_values(v), m, beta=0.5, alpha=2),
                                     (v, m, inp))
    Q = scorch.as_sparse(rnd(2, 4, 5), "csr")
    w, b = Q.values().clone().requires_grad_(), rnd(2, 5, 3, density=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda w, b: torch.bmm(Q.with_values(w), b), (w, b))
    assert torch.autograd.gradcheck(lambda w, b: torch.tensordot(Q.with_values(w), b[0], dims=([2], [0])), (w, b))


MEMO_CASES = [  # (name, op, sparse result?): whether f(0) == 0 depends on the scalars, not just the op
    ("A+1", lambda A: A + 1, False), ("A+0", lambda A: A + 0, True), ("A+True", lambda A: A + True, False),
    ("A+False", lambda A: A + False, True), ("clamp(min=0)", lambda A: A.clamp(min=0), True),
    ("clamp(max=0)", lambda A: A.clamp(max=0), True), ("clamp(min=1)", lambda A: A.clamp(min=1), False),
    ("clamp(max=1)", lambda A: A.clamp(max=1), True), ("clamp(max=-1)", lambda A: A.clamp(max=-1), False), ("pow(0)", lambda A: A.pow(0), False),
    ("pow(2)", lambda A: A.pow(2), True), ("A+tensor(1)", lambda A: A + torch.tensor(1.0), False),
    ("A+tensor(0)", lambda A: A + torch.tensor(0.0), True), ("A*2", lambda A: A * 2, True),
    ("add(1, alpha=0)", lambda A: torch.add(A, 1, alpha=0), True),            # alpha: a keyword at aten level
    ("add(1, alpha=1)", lambda A: torch.add(A, 1, alpha=1), False),
    ("sub(2, alpha=0)", lambda A: torch.sub(A, 2, alpha=0), True), ("sub(2)", lambda A: torch.sub(A, 2), False),
]


def test_pointwise_zero_check_remembered_per_scalar_arguments():
    """The pointwise path remembers per op and scalar arguments whether f(0) == 0 (sparse result)
    or not (dense): ops differing only in a scalar, or in the keyword it is passed as, each get
    their own answer, first time and remembered; oracle: the op on the dense tensor."""
    from scorch.ops import pointwise
    pointwise._ZERO_PRESERVING.clear()
    x = rnd(5, 6)
    A = scorch.as_sparse(x, "csr")
    for _ in range(2):
        for name, f, sparse in MEMO_CASES:
            got = f(A)
            assert isinstance(got, scorch.SparseTensor) == sparse, name
            torch.testing.assert_close(dense(got), f(x), msg=name)
    assert pointwise._ZERO_PRESERVING  # the scalar cases were remembered


def test_argument_walks_match_pytree():
    """map_sparse / leaves walk an op's arguments as torch's pytree does (oracle): SparseTensors
    inside lists, tuples and dicts replaced, the tensors found in order (a torch.Size, which
    holds no tensor, stays one leaf), everything else left as is."""
    from torch.utils import _pytree as pytree

    from scorch._dispatch import leaves, map_sparse
    A, B = scorch.as_sparse(rnd(3, 4), "csr"), scorch.as_sparse(rnd(3, 4, seed=1), "coo")
    args = (A, [B, 2.0, (A, None)], torch.Size([3, 4]), "s")
    kwargs = {"alpha": 2, "other": [B], "dim": (0, 1)}
    mark = lambda a: ("sparse", a.format.name)  # noqa: E731
    got = map_sparse(mark, args, kwargs)
    want = pytree.tree_map(lambda a: mark(a) if isinstance(a, scorch.SparseTensor) else a, (args, kwargs))
    assert got == want
    def tensors(xs):
        return [id(a) for a in xs if isinstance(a, torch.Tensor)]
    assert tensors(leaves(args, kwargs)) == tensors(pytree.tree_flatten((args, kwargs))[0])
    assert tensors(leaves(args, kwargs)) == [id(A), id(B), id(A), id(B)]


@pytest.mark.parametrize("name", ["abs_", "neg_", "relu_", "sqrt_ of abs"])
def test_in_place_pointwise_ops_keep_the_pattern(name):
    """In-place pointwise ops update the stored values (abs_ too, which aten leaves untagged);
    oracle: the op on the dense tensor."""
    ops = {"abs_": torch.Tensor.abs_, "neg_": torch.Tensor.neg_, "relu_": torch.relu_,
           "sqrt_ of abs": lambda t: t.abs_().sqrt_()}
    x = rnd(5, 6)
    A = scorch.as_sparse(x, "csr")
    got = ops[name](A)
    assert got is A and A.nnz == scorch.as_sparse(x, "csr").nnz
    torch.testing.assert_close(A.to_dense(), ops[name](x.clone()))


SCALES = {"mask": lambda x: (x.abs() > 0.3).to(x.dtype), "rows": lambda x: torch.arange(1.0, x.shape[0] + 1)[:, None],
          "columns": lambda x: torch.linspace(-2, 2, x.shape[1]), "full": lambda x: torch.rand(x.shape) + 0.5,
          "with inf": lambda x: torch.where(x == 0, float("inf"), 2.0)}


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell", "bsr"])
def test_in_place_ops_with_dense_operands_keep_the_pattern(scale, fmt):
    """``A.mul_(X)`` (a pruning mask, a per-row scale), ``A.div_(X)``, ``A.addcdiv_(G, X)`` (an
    optimizer's step with a dense denominator) update the stored values, each dense operand read at
    their positions, where the op leaves the absent entries 0; where it would not (``0 * inf``,
    ``0 / 0``, ``lerp`` towards a dense X) the entries it makes nonzero join the pattern.  Oracle:
    the dense op."""
    x = rnd(6, 4)
    A = scorch.as_sparse(x, scorch.formats.bsr(2, 2) if fmt == "bsr" else fmt)
    on = A._like(values=torch.ones(A._vals.shape), nnz=A._stored).to_dense() != 0
    X = SCALES[scale](x).to(x.dtype)
    G = A._like(values=torch.linspace(-1, 1, A._vals.numel(), dtype=x.dtype), nnz=A._stored)
    nnz, want = A.nnz, x.clone()
    for op in (lambda t, X, G: t.mul_(X), lambda t, X, G: t.div_(X), lambda t, X, G: t.addcdiv_(G, X, value=-0.5),
               lambda t, X, G: t.lerp_(X, 0.25)):
        step = op(want.clone(), X, G.to_dense())
        grows = bool((~on & ((step != 0) | step.isnan())).any())
        if grows:
            assert op(A, X, G) is A and A.nnz > nnz
            torch.testing.assert_close(A.to_dense(), step, rtol=0, atol=0, equal_nan=True)
            break
        assert op(A, X, G) is A and A.nnz == nnz
        want = step
        torch.testing.assert_close(A.to_dense(), want, rtol=0, atol=0, equal_nan=True)   # BSR: stored 0 * inf
    else:
        pytest.fail("lerp_ towards a dense X always grows the pattern")
    with pytest.raises(NotImplementedError, match="broadcastable"):
        A.mul_(torch.ones(3, 6, 4))


IN_PLACE_ON_DENSE = {
    "add_": lambda t, a: t.add_(a), "add_ alpha": lambda t, a: t.add_(a, alpha=-0.5),
    "sub_": lambda t, a: t.sub_(a), "sub_ alpha": lambda t, a: t.sub_(a, alpha=2), "+=": lambda t, a: t.__iadd__(a),
    "mul_": lambda t, a: t.mul_(a), "addcmul_": lambda t, a: t.addcmul_(a, a, value=3), "copy_": lambda t, a: t.copy_(a),
    "broadcast add_": lambda t, a: t.unsqueeze(0).expand(2, -1, -1).clone().add_(a),
}


@pytest.mark.parametrize("name", list(IN_PLACE_ON_DENSE))
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_in_place_ops_into_a_dense_tensor(name, fmt):
    """``dense += A`` and kin write into the dense tensor (they raised: the in-place path took the
    dense destination for a SparseTensor); oracle: the op with the dense value of A."""
    x = rnd(5, 6)
    A = scorch.as_sparse(x, fmt)
    for dtype in (torch.float64, torch.float32):
        t, ref = torch.linspace(-1, 1, 30, dtype=dtype).view(5, 6), torch.linspace(-1, 1, 30, dtype=dtype).view(5, 6)
        got, want = IN_PLACE_ON_DENSE[name](t, A), IN_PLACE_ON_DENSE[name](ref, x)
        assert not isinstance(got, scorch.SparseTensor)
        assert name == "broadcast add_" or got is t
        torch.testing.assert_close(got, want, rtol=0, atol=0)


MASKS = {"entrywise": lambda x: x > 0.2, "a row": lambda x: torch.arange(x.shape[1]) % 2 == 0,
         "a column": lambda x: (torch.arange(x.shape[0]) % 3 == 0)[:, None], "all": lambda x: torch.tensor(True)}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_masked_fill_keeps_the_pattern_for_zero_and_grows_it_in_place(mask, fmt):
    """``masked_fill(mask, 0)`` stays sparse in the pattern (it densified); another value gives
    the dense result; in place, a value lands on the stored entries, and where the mask selects
    others they join the pattern; oracle: masked_fill on the dense tensor."""
    x = rnd(5, 6)
    A = scorch.as_sparse(x, fmt)
    m = MASKS[mask](x)
    out = A.masked_fill(m, 0.0)
    assert isinstance(out, scorch.SparseTensor) and out.nnz == A.nnz
    torch.testing.assert_close(out.to_dense(), x.masked_fill(m, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(A.masked_fill(m, -2.5), x.masked_fill(m, -2.5), rtol=0, atol=0)
    B = A.clone()
    B.masked_fill_(m, 0.0)
    torch.testing.assert_close(B.to_dense(), x.masked_fill(m, 0.0), rtol=0, atol=0)
    on_stored = m.expand(x.shape) & (x != 0)
    C = A.clone()
    C.masked_fill_(on_stored, 3.0)
    torch.testing.assert_close(C.to_dense(), x.masked_fill(on_stored, 3.0), rtol=0, atol=0)
    D = A.clone()
    assert D.masked_fill_(m, 3.0) is D and D.format == A.format
    torch.testing.assert_close(D.to_dense(), x.masked_fill(m, 3.0), rtol=0, atol=0)
    assert D.nnz == int(((x != 0) | m.expand(x.shape)).sum())   # the stored entries and the filled ones


FILLS = {"uniform_": lambda t, g: t.uniform_(-2, 3, generator=g), "normal_": lambda t, g: t.normal_(1, 2, generator=g),
         "bernoulli_": lambda t, g: t.bernoulli_(0.3, generator=g), "exponential_": lambda t, g: t.exponential_(generator=g),
         "log_normal_": lambda t, g: t.log_normal_(generator=g), "cauchy_": lambda t, g: t.cauchy_(generator=g),
         "random_": lambda t, g: t.random_(0, 7, generator=g), "geometric_": lambda t, g: t.geometric_(0.4, generator=g)}


@pytest.mark.parametrize("name", list(FILLS))
@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
def test_random_fills_draw_the_stored_values(name, fmt):
    """In-place random fills (what ``nn.init`` calls) fill the stored values and keep the pattern
    (they raised); oracle: the same fill, same seed, on a plain tensor of the values."""
    A = scorch.as_sparse(rnd(5, 6), fmt)
    stored = A.values().clone()
    out = FILLS[name](A, torch.Generator().manual_seed(3))
    assert out is A
    want = FILLS[name](stored, torch.Generator().manual_seed(3))
    if fmt == "ell":   # its unused slots (coordinate -1) stay 0: a norm of the values counts them
        want[A._crd[-1].long() < 0] = 0
    assert torch.equal(A.values(), want)
    lin = scorch.nn.SparseLinear.from_dense(torch.nn.Linear(8, 4), sparsity=0.5)
    nnz = lin.weight.nnz
    torch.nn.init.xavier_uniform_(lin.weight)
    assert lin.weight.nnz == nnz and float(lin.weight.detach().values().abs().max()) <= (6 / 12) ** 0.5


def test_foreach_ops_over_lists_holding_sparse_tensors():
    """torch._foreach_* (optimizers with foreach=True) run element-wise through the sparse ops: in
    place on the stored values, out of place as the single op gives it; oracle: the dense tensors."""
    x, d = rnd(5, 6), rnd(5, 6, density=1, seed=7)
    A, D = scorch.as_sparse(x, "csr"), d.clone()
    G = A._like(values=torch.linspace(-1, 1, A._vals.numel(), dtype=x.dtype), nnz=A._stored)
    on = x != 0
    g = G.to_dense()
    torch._foreach_mul_([A, D], 2.0)
    torch._foreach_add_([A, D], [G, g], alpha=0.5)
    torch._foreach_addcdiv_([A, D], [G, g], [d.abs() + 1, d.abs() + 1], torch.tensor([0.25, 0.25]))
    torch._foreach_lerp_([A, D], [G, g], 0.3)
    torch._foreach_maximum_([A, D], [G, g])
    want = d.clone()
    for step in (lambda t, u: t.mul_(2.0), lambda t, u: t.add_(u, alpha=0.5),
                 lambda t, u: t.addcdiv_(u, d.abs() + 1, value=0.25), lambda t, u: t.lerp_(u, 0.3),
                 lambda t, u: t.copy_(torch.maximum(t, u))):
        step(want, g)
        step(x, g)
    torch.testing.assert_close(D, want)
    torch.testing.assert_close(A.to_dense(), torch.where(on, x, 0.0))
    norms = torch._foreach_norm([A, D], 1)
    torch.testing.assert_close(torch.stack(norms), torch.stack([A.to_dense().abs().sum(), D.abs().sum()]))
    sq = torch._foreach_sqrt([A.abs(), D.abs()])
    assert isinstance(sq[0], scorch.SparseTensor)
    torch.testing.assert_close(sq[0].to_dense(), A.to_dense().abs().sqrt())


TORCH_LAYOUTS = {"coo": lambda t: t.to_sparse(), "csr": lambda t: t.to_sparse_csr(),
                 "csc": lambda t: t.to_sparse_csc(), "bsr": lambda t: t.to_sparse_bsr((2, 2))}
MIXED = {"A+T": lambda A, T: A + T, "T+A": lambda A, T: T + A, "A-T": lambda A, T: A - T, "A*T": lambda A, T: A * T,
         "maximum": lambda A, T: torch.maximum(A, T), "where": lambda A, T: torch.where(A > 0, A, T),
         "remainder (dense result)": lambda A, T: torch.remainder(A, T), "A@T": lambda A, T: A @ T,
         "cat": lambda A, T: torch.cat([A, T])}


@pytest.mark.parametrize("name", list(MIXED))
@pytest.mark.parametrize("layout", list(TORCH_LAYOUTS))
def test_torch_sparse_operands_beside_a_sparse_tensor(name, layout):
    """A torch.sparse tensor beside a SparseTensor counts as one (``A + torch.eye(n).to_sparse()``
    raised 'expand is unsupported for Sparse tensors'); oracle: the op on the dense tensors."""
    a, t = rnd(4, 4), rnd(4, 4, seed=5)
    A = scorch.as_sparse(a, "csr")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*beta.*")
        T = TORCH_LAYOUTS[layout](t)
        warnings.filterwarnings("error")   # no dense fallback
        got = MIXED[name](A, T)
    want = MIXED[name](a, t)
    dense = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    assert type(dense) is torch.Tensor and dense.layout == torch.strided
    torch.testing.assert_close(dense, want, equal_nan=True)


DENSE_BY_DEFINITION = {
    "layer_norm": lambda a, b: torch.nn.functional.layer_norm(a, (6,)),
    "batch_norm": lambda a, b: torch.nn.functional.batch_norm(a, torch.zeros(6, dtype=a.dtype),
                                                              torch.ones(6, dtype=a.dtype)),
    "group_norm": lambda a, b: torch.nn.functional.group_norm(a, 2),
    "logsigmoid": lambda a, b: torch.nn.functional.logsigmoid(a),
    "bce_with_logits": lambda a, b: torch.nn.functional.binary_cross_entropy_with_logits(a, (b > 0).to(a.dtype)),
    "searchsorted": lambda a, b: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0], dtype=a.dtype), a),
    "bucketize": lambda a, b: torch.bucketize(a, torch.tensor([-1.0, 0.0, 1.0], dtype=a.dtype)),
    "histogram": lambda a, b: torch.histogram(a, 4).hist,
    "cdist": lambda a, b: torch.cdist(a, b),
}


@pytest.mark.parametrize("name", list(DENSE_BY_DEFINITION))
def test_dense_by_definition_ops_compute_densely_without_a_warning(name):
    """Normalisations, f(0) != 0 losses, bucket indices, distances: dense whatever the input,
    computed on the dense tensors without the fallback's warning; oracle: the same on them."""
    a, b = rnd(5, 6), rnd(5, 6, seed=1)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "coo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = DENSE_BY_DEFINITION[name](A, B)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, DENSE_BY_DEFINITION[name](a, b))


@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_bool_add_and_mul_are_or_and_and(fmt):
    """bool + bool and bool * bool (torch: logical or / and; the compiler takes no bool values):
    sparse where torch's sparse rules keep them sparse; bool - bool is refused as torch refuses
    it.  Oracle: dense torch."""
    b = torch.tensor([[False, True, False], [True, False, False]])
    c = torch.tensor([[True, True, False], [False, False, True]])
    B, C = scorch.as_sparse(b, fmt), scorch.as_sparse(c, "coo")
    for got, want, sparse in [(B + C, b + c, True), (B * C, b * c, True), (B * c, b * c, True),
                              (c[0] * B, c[0] * b, True), (B + c, b + c, False), (torch.add(B, C), b + c, True)]:
        assert isinstance(got, scorch.SparseTensor) == sparse
        got = got.to_dense() if sparse else got
        assert got.dtype == torch.bool and torch.equal(got, want)
    with pytest.raises(ValueError, match="with a bool tensor is not supported"):
        B - C


# ================================================================ dtypes and rounding as torch's

def test_division_by_a_dense_tensor_rounds_and_types_as_torch():
    """sparse / dense without zeros divides the stored values (it multiplied by 1 / b: a second
    rounding, float32 precision for float64, float32 results for float16); oracle: dense torch."""
    cases = [(torch.tensor([[49, 0, 7]], dtype=torch.int32), torch.tensor([[7, 3, 7]], dtype=torch.int32)),
             (torch.tensor([[1.0, 0, 3.0]], dtype=torch.float16), torch.tensor([[3, 7, 3]])),
             (torch.tensor([[1.0, 0, 10.0]], dtype=torch.float64), torch.tensor([[3, 7, 3]])),
             (torch.tensor([[1.0, 0, 1000.0]]), torch.tensor([[3., 3., 3.]], dtype=torch.float16)),
             (torch.tensor([[1.0, 0, 7.0]]), torch.tensor(3.0, dtype=torch.float64)),
             (rnd(20, 30, seed=3).float(), rnd(20, 30, density=1.0, seed=4).float().add(0.5))]
    for a, b in cases:
        out = scorch.as_sparse(a, "csr") / b
        assert isinstance(out, scorch.SparseTensor) and out.dtype == (a / b).dtype
        assert torch.equal(out.to_dense(), a / b)


def test_number_over_a_sparse_tensor_is_torchs_reciprocal_times_the_number():
    x = torch.tensor([[3., 0., 6.]], dtype=torch.float16)
    S = scorch.as_sparse(x, "csr")
    for number in (65520, -1e-8, 2):
        torch.testing.assert_close(number / S, number / x, equal_nan=True)


def test_alpha_scales_in_the_result_dtype():
    """``add(a, b, alpha=2)`` with an int8 ``b``: torch scales after promoting (it wrapped in int8)."""
    a = torch.tensor([[1., 0., 2.]])
    b = torch.tensor([[100, 0, -100]], dtype=torch.int8)
    for x, y in ((scorch.as_sparse(a, "csr"), b), (a, scorch.as_sparse(b, "csr")),
                 (scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "coo"))):
        torch.testing.assert_close(dense(torch.add(x, y, alpha=2)), torch.add(a, b, alpha=2))
        torch.testing.assert_close(dense(torch.sub(x, y, alpha=3)), torch.sub(a, b, alpha=3))


def test_int64_past_2_53_with_a_bool_operand_is_exact():
    a = torch.tensor([[2**60 + 1, 0, 3]])
    m = torch.tensor([[True, True, False]])
    A = scorch.as_sparse(a, "csr")
    assert torch.equal(dense(A * m), a * m) and torch.equal(dense(A + m), a + m)
    assert torch.equal(dense(A + scorch.as_sparse(m, "csr")), a + m)


def test_complex_sums_and_products_with_a_real_or_complex_operand():
    """sparse +- dense / sparse of another pattern with complex values, and a real SparseTensor
    times / plus a complex dense tensor (they raised); oracle: dense torch."""
    g = torch.Generator().manual_seed(5)
    z = torch.complex(rnd(4, 5, seed=1), rnd(4, 5, seed=2)).to(torch.complex64)
    w = torch.complex(rnd(4, 5, seed=3), torch.zeros(4, 5, dtype=torch.float64)).to(torch.complex64)
    r = rnd(4, 5, seed=6).float()
    x = torch.randn(4, 5, dtype=torch.complex64, generator=g)
    Z, W, R = scorch.as_sparse(z, "csr"), scorch.as_sparse(w, "coo"), scorch.as_sparse(r, "csr")
    for got, want in ((Z + x, z + x), (Z - W, z - w), (Z + W, z + w), (R * x, r * x), (R + x, r + x),
                      (x - R, x - r), (Z + R, z + r)):
        torch.testing.assert_close(dense(got), want)
        assert dense(got).dtype == want.dtype


def test_addcmul_with_another_pattern_computes_in_the_promoted_dtype():
    x = torch.tensor([[1.0, 0.0, 2.0]])
    t = torch.tensor([[100, 50, 0]], dtype=torch.int8)
    X = scorch.as_sparse(x, "csr")
    X.addcmul_(scorch.as_sparse(t, "csr"), scorch.as_sparse(t, "csr"))
    torch.testing.assert_close(X.to_dense(), x.clone().addcmul_(t, t))


def test_complex_in_place_with_a_half_precision_dense_operand():
    """``A.div_(d16)`` on complex64 values: the probe for absent entries promoted a 0-d complex zero
    with float16 to ComplexHalf and refused; oracle: dense torch."""
    x = torch.tensor([[1 + 1j, 0, 2j]], dtype=torch.complex64)
    d16 = torch.tensor([[2., 4., 8.]], dtype=torch.float16)
    for op in ("div_", "mul_"):
        A = scorch.as_sparse(x, "csr")
        getattr(A, op)(d16)
        torch.testing.assert_close(A.to_dense(), getattr(x.clone(), op)(d16))


def test_writes_torch_refuses_are_refused():
    """index_put_ wants values of the tensor's dtype (2.5 was truncated into an int tensor) and
    masked_fill_ a value the dtype holds (1e6 became inf in float16), as torch's; oracle: torch
    raises on the dense tensor too."""
    xi = torch.tensor([[1, 0, 3], [0, 5, 0]], dtype=torch.int32)
    idx, v = (torch.tensor([0]), torch.tensor([1])), torch.tensor([2.5])
    with pytest.raises(RuntimeError):
        xi.clone().index_put_(idx, v)
    with pytest.raises(TypeError, match="dtypes match"):
        scorch.as_sparse(xi, "csr").index_put_(idx, v)
    xf = torch.tensor([[1.5, 0, 0]], dtype=torch.float16)
    for x in (xf.clone(), scorch.as_sparse(xf, "csr")):
        with pytest.raises(RuntimeError, match="overflow"):
            x.masked_fill_(xf != 0, 1e6)
    S = scorch.as_sparse(xf, "csr")
    S.masked_fill_(xf != 0, 2.0)
    assert torch.equal(S.to_dense(), xf.masked_fill(xf != 0, 2.0))


def test_division_of_an_ell_tensor_leaves_its_padding_alone():
    """ELL's unused slots read 0 from the divisor: 0 / 0 put NaN in them (values(), gradients)."""
    x = torch.tensor([[1., 2., 3.], [4., 0., 0.], [0., 5., 0.]])
    E = scorch.as_sparse(x, "ell")
    b = torch.tensor([2., 2., 2.])
    R = E / b
    assert not torch.isnan(R.values()).any()
    torch.testing.assert_close(R.to_dense(), x / b)


@pytest.mark.parametrize("fmt", ["coo", "csr", "ell"])
@pytest.mark.parametrize("method", ["__rtruediv__", "__rdiv__"])
def test_reflected_division_by_a_tensor_is_true_division(fmt, method):
    """``A.__rtruediv__(b)`` is ``b / A`` for a tensor ``b`` too: 0 / 0 at positions neither stores
    is NaN, as torch's (a sparse ``b`` times ``A``'s dense reciprocal gave 0 there), and a
    torch.sparse ``b`` works (it raised inside torch); a number ``b`` is as before."""
    a, b = rnd(4, 5, seed=1), rnd(4, 5, seed=2)
    A, B = scorch.as_sparse(a, fmt), scorch.as_sparse(b, fmt)
    want = getattr(a, method)(b)
    assert torch.isnan(want).any()
    for other in (B, b, b.to_sparse()):
        torch.testing.assert_close(dense(getattr(A, method)(other)), want, equal_nan=True)
    torch.testing.assert_close(dense(getattr(A, method)(3.0)), getattr(a, method)(3.0))
