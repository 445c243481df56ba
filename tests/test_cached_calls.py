"""Property test: a cached einsum call (the same equation, formats, shapes and strides as an
earlier one, so the bound kernel runs without planning) gives what a fresh call gives on
its own data -- nothing of the first call's data may be baked into the cache.  Operands in
random level formats (dense / compressed / padded levels, COO-like chains, any mode order);
oracle: torch.einsum on the densified operands of each call."""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch.compiler import build

from strategies import level_formats

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

_SCALE = float(os.environ.get("CACHED_CALLS_EXAMPLES_SCALE", "1"))
LETTERS = "ijkl"


@st.composite
def problems(draw):
    """An equation, one (format or None) per operand, and two data sets of the same shapes."""
    nops = draw(st.integers(1, 3))
    letters = LETTERS[:draw(st.integers(1, 4))]
    sizes = {c: draw(st.integers(0, 5)) for c in letters}
    terms = ["".join(draw(st.permutations(letters))[:draw(st.integers(1, min(3, len(letters))))])
             for _ in range(nops)]
    used = sorted(set("".join(terms)))
    out = "".join(draw(st.permutations(used))[:draw(st.integers(0, len(used)))])
    fmts = [draw(level_formats(len(t))) if k == 0 or draw(st.booleans()) else None for k, t in enumerate(terms)]
    calls = []
    for _ in range(2):
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        ops = []
        for t, fmt in zip(terms, fmts):
            shape = tuple(sizes[c] for c in t)
            density = draw(st.sampled_from([0.0, 0.2, 0.6, 1.0]))
            x = torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < density)
            ops.append(x if fmt is None else scorch.as_sparse(x, fmt))
        calls.append(ops)
    return ",".join(terms) + "->" + out, calls


def dense(x):
    return x.to_dense() if isinstance(x, scorch.SparseTensor) else x


@settings(max_examples=max(1, int(150 * _SCALE)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_a_cached_call_reads_only_its_own_operands(problem):
    equation, calls = problem
    saved, scorch.config.dispatch = scorch.config.dispatch, "sparse"
    try:
        for ops in calls:   # the second call runs the kernel bound by the first
            got = scorch.einsum(equation, *ops)
            want = torch.einsum(equation, *[dense(x) for x in ops])
            torch.testing.assert_close(dense(got), want, atol=1e-9, rtol=1e-9)
    finally:
        scorch.config.dispatch = saved


OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - 2 * b, "mul": lambda a, b: a * b,
    "maximum": torch.maximum, "where": lambda a, b: torch.where(a > 0, a, b),
    "atan2": torch.atan2, "matmul": lambda a, b: a @ b.t(), "sum": lambda a, b: (a * b).sum(1),
}


@st.composite
def op_pairs(draw):
    """An op, a shape, a format per operand (None: dense), and two data sets."""
    shape = (draw(st.integers(0, 6)), draw(st.integers(0, 6)))
    fmts = [draw(level_formats(2)), draw(st.one_of(st.none(), level_formats(2)))]
    calls = []
    for _ in range(2):
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
        pair = []
        for fmt in fmts:
            density = draw(st.sampled_from([0.0, 0.3, 1.0]))
            x = torch.randn(shape, generator=g, dtype=torch.float64) * (torch.rand(shape, generator=g) < density)
            pair.append(x if fmt is None else scorch.as_sparse(x, fmt))
        calls.append(pair)
    return draw(st.sampled_from(sorted(OPS))), calls


@settings(max_examples=max(1, int(150 * _SCALE)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=op_pairs())
def test_torch_ops_called_again_on_new_data_read_only_it(problem):
    """The same torch op twice on operands of one signature (formats, shapes) but other data:
    elementwise (intersections, unions carrying positions), matmul and reductions each time
    against the op on the dense operands."""
    name, calls = problem
    for a, b in calls:
        got = OPS[name](a, b)
        want = OPS[name](dense(a), dense(b))
        torch.testing.assert_close(dense(got), want, atol=1e-9, rtol=1e-9, equal_nan=True)


def test_the_front_door_s_bound_call_steps_aside_whenever_the_general_path_differs(monkeypatch):
    """A repeated ``einsum(eq, A, x)`` runs its bound kernel from the front door; grad, a torch.func
    transform, forward-mode AD, dense dispatch and a size-1 broadcast still take the general path.
    Oracle: dense torch."""
    import torch.autograd.forward_ad as fwAD
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 5, generator=g) * (torch.rand(6, 5, generator=g) < 0.4)
    A, x = scorch.as_sparse(a, "csr"), torch.randn(5, generator=g)
    monkeypatch.setattr(scorch.config, "dispatch", "sparse")
    for _ in range(2):   # the second call: the bound kernel
        torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), a @ x)
        torch.testing.assert_close(A @ x, a @ x)
    xg = x.clone().requires_grad_()
    scorch.einsum("ij,j->i", A, xg).sum().backward()
    torch.testing.assert_close(xg.grad, a.sum(0))
    Ag = A.clone().requires_grad_()
    scorch.einsum("ij,j->i", Ag, x).sum().backward()
    torch.testing.assert_close(Ag.grad.to_dense(), (a != 0) * x)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(scorch.einsum("ij,j->i", A, fwAD.make_dual(x, torch.ones(5)))).tangent
    torch.testing.assert_close(tangent, a.sum(1))
    torch.testing.assert_close(torch.func.vmap(lambda v: scorch.einsum("ij,j->i", A, v))(x[None].expand(3, 5)),
                               (a @ x)[None].expand(3, 6))
    monkeypatch.setattr(scorch.config, "dispatch", "dense")
    torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), a @ x)
    B = scorch.as_sparse(a[:1], "csr")   # a size-1 dim broadcast against the dense operand
    torch.testing.assert_close(scorch.einsum("ij,ij->ij", B, x.expand(6, 5).contiguous()).to_dense(),
                               a[:1] * x.expand(6, 5))


def test_the_call_caches_stay_bounded_and_keep_remembering(monkeypatch):
    """A long run meets new signatures for ever (mini-batches of new sizes): the tables drop their
    oldest entry when full (they stopped remembering: every later signature took the slow path;
    one table grew without bound); oracle: dense torch for every call."""
    from scorch import _memo
    from scorch.compiler import driver
    import sys
    einsum_mod = sys.modules["scorch.ops.einsum"]
    monkeypatch.setattr(_memo, "LIMIT", 8)
    g = torch.Generator().manual_seed(0)
    for n in range(20, 40):
        d = torch.rand(n, n, generator=g) * (torch.rand(n, n, generator=g) < 0.3)
        A, x = scorch.as_sparse(d, "csr"), torch.randn(n, 3, generator=g)
        torch.testing.assert_close(A @ x, d @ x)
        key = driver._signature("ij,jk->ik", None, (A, x))
        assert key in driver._BOUND   # the newest signature is remembered
    assert len(driver._BOUND) <= 8 and len(einsum_mod._DENSE_RESULT) <= 8 and len(einsum_mod._PATHS) <= 8


def test_threads_making_the_first_product_on_a_new_pattern_together():
    """Several threads' first SpMV on a new pattern build its per-entry arrays at once: one builds
    them (a second build replaced the first while a kernel held only its address: a use after
    free); oracle: the single-threaded result."""
    import threading
    g = torch.Generator().manual_seed(1)
    n, nnz = 20_000, 400_000
    base = scorch.from_coo(torch.randint(0, n, (2, nnz), generator=g), torch.rand(nnz, generator=g), (n, n),
                           format="csr")
    x = torch.randn(n, generator=g)
    ref = base.to_dense() @ x
    for _ in range(4):
        A = base.clone()   # fresh index arrays: nothing derived yet
        bar, outs = threading.Barrier(4), [None] * 4

        def work(t):
            bar.wait()
            outs[t] = A @ x
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for out in outs:
            torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-4)
