"""Replicating ops (repeat, tile, expand, broadcast_to, repeat_interleave, kron) and order ops
(topk, sort, argsort, msort, cumsum, cumprod, logcumsumexp) on SparseTensors.

Oracle: the same op on the dense tensor with plain torch.  Replicating ops give SparseTensors
built on coordinates; topk works from the stored entries; sorts and scans give dense results.
None of them may reach the dense fallback (set to raise here).
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import scorch
from scorch import ScorchValueError, SparseTensor

from strategies import assert_dense_equal, assert_dense_equal_nan, make_dense
from test_shape_ops import SETTINGS, check, formats_for, sparse_tensors


@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


def rnd(*shape, density=0.5, seed=0):
    return make_dense(shape, density, seed, torch.float64)


# ================================================================ repeat / tile / expand


@SETTINGS
@given(st.data())
def test_repeat_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    extra = data.draw(st.integers(0, 2))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=A.dim() + extra, max_size=A.dim() + extra))
    check(A.repeat(*sizes), x.repeat(*sizes), A)
    check(A.repeat(sizes), x.repeat(sizes), A)
    check(torch.tile(A, sizes[extra:]), torch.tile(x, sizes[extra:]), A)


@SETTINGS
@given(st.data())
def test_expand_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    ones = data.draw(st.lists(st.booleans(), min_size=A.dim(), max_size=A.dim()))
    for d, one in enumerate(ones):    # make some dims size 1
        if one and x.shape[d]:
            A, x = A.narrow(d, 0, 1), x.narrow(d, 0, 1)
    sizes = [data.draw(st.sampled_from([-1, 0, 1, 3])) if s == 1 else data.draw(st.sampled_from([-1, s]))
             for s in x.shape]
    lead = data.draw(st.lists(st.integers(0, 3), max_size=2))
    target = lead + sizes
    check(A.expand(*target), x.expand(*target))
    check(A.expand(target), x.expand(target))
    full = x.expand(*target)
    check(torch.broadcast_to(A, full.shape), full)
    check(A.expand_as(full), full)


def test_broadcast_tensors_expands_sparse_operands():
    """torch.broadcast_tensors reaches aten's expand with a SparseTensor: the sparse form runs."""
    x = rnd(1, 4)
    A = scorch.as_sparse(x, "csr")
    out, other = torch.broadcast_tensors(A, torch.ones(3, 1, dtype=torch.float64))
    check(out, x.expand(3, 4))
    assert_dense_equal(other, torch.ones(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("call, message", [
    (lambda A: A.expand(3, 5), "not 1"),
    (lambda A: A.expand(4), "number of sizes"),
    (lambda A: A.expand(-1, 3, 4), "-1 only"),
    (lambda A: A.repeat(2), "at least 2 sizes"),
    (lambda A: A.repeat(2, -1), ">= 0"),
    (lambda A: torch.repeat_interleave(A, torch.tensor([1, 2]), dim=0), "one per position"),
    (lambda A: torch.repeat_interleave(A, -1, dim=1), ">= 0"),
    (lambda A: torch.topk(A, 5, dim=1), "k=5"),
    (lambda A: torch.topk(A, 1, dim=2), "dim=2"),
])
def test_bad_arguments_raise_clear_errors(call, message):
    A = scorch.as_sparse(rnd(3, 4), "csr")
    with pytest.raises((ScorchValueError, IndexError), match=message):
        call(A)


# ================================================================ repeat_interleave


@SETTINGS
@given(st.data())
def test_repeat_interleave_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    dim = data.draw(st.sampled_from([None] + list(range(-A.dim(), A.dim()))))
    if data.draw(st.booleans()) and dim is not None:
        reps = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=x.shape[dim], max_size=x.shape[dim])),
                            dtype=torch.int64)
        if reps.numel() == 1:
            reps = reps.reshape(())
    else:
        reps = data.draw(st.integers(0, 3))
    check(torch.repeat_interleave(A, reps, dim=dim), torch.repeat_interleave(x, reps, dim=dim))
    check(A.repeat_interleave(reps, dim), x.repeat_interleave(reps, dim))


# ================================================================ kron


@SETTINGS
@given(st.data())
def test_kron_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    shape = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    y = make_dense(shape, data.draw(st.sampled_from([0.0, 0.5, 1.0])), data.draw(st.integers(0, 99)), torch.float64)
    as_sparse = data.draw(st.booleans())
    other = scorch.as_sparse(y, data.draw(st.sampled_from(formats_for(tuple(shape))))) if as_sparse else y
    check(torch.kron(A, other), torch.kron(x, y))
    check(torch.kron(other, A), torch.kron(y, x))
    check(A.kron(other), torch.kron(x, y))


# ================================================================ topk


@SETTINGS
@given(st.data())
def test_topk_matches_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    dim = data.draw(st.integers(-A.dim(), A.dim() - 1))
    k = data.draw(st.integers(0, x.shape[dim]))
    largest = data.draw(st.booleans())
    values, indices = torch.topk(A, k, dim=dim, largest=largest)
    ref = torch.topk(x, k, dim=dim, largest=largest)
    assert_dense_equal(values, ref.values)      # torch's topk returns sorted values; so does ours
    assert indices.dtype == torch.int64 and indices.shape == ref.indices.shape
    assert_dense_equal(x.gather(dim, indices), values)   # ties may pick other positions than torch
    if k:   # no position twice in a fibre
        s = indices.sort(dim=dim).values
        assert bool((s.narrow(dim, 1, k - 1) != s.narrow(dim, 0, k - 1)).all())
    v2, i2 = A.topk(k, dim, largest, True)
    assert_dense_equal(v2, values) and assert_dense_equal(i2, indices)


def test_topk_with_nan_and_infinities_matches_dense():
    """NaN counts as the largest value either way, as in torch; -inf stored entries still win
    over padding slots."""
    x = torch.tensor([[float("nan"), 0, -1, 0], [float("-inf"), 0, float("inf"), 2], [0, 0, 0, 0]],
                     dtype=torch.float64)
    A = scorch.as_sparse(x, "csr")
    for k in range(5):
        for largest in (True, False):
            v, i = torch.topk(A, k, dim=1, largest=largest)
            assert_dense_equal_nan(v, torch.topk(x, k, dim=1, largest=largest).values)
            assert_dense_equal_nan(x.gather(1, i), v)


def test_topk_gradient_reaches_the_stored_values():
    """gradcheck on the stored values (no ties: a stored value's place is then fixed)."""
    A = scorch.as_sparse(torch.tensor([[1.5, 0, -3, 0.25], [0, 2, 0, 0], [0, 0, 0, -1]], dtype=torch.float64), "csr")
    v = A.values().clone().requires_grad_()
    for largest in (True, False):
        assert torch.autograd.gradcheck(lambda v: torch.topk(A.with_values(v), 2, dim=1, largest=largest)[0], (v,))
        assert torch.autograd.gradcheck(lambda v: torch.topk(A.with_values(v), 2, dim=0, largest=largest)[0], (v,))


# ================================================================ sorts and scans: dense results


ORDERS = {
    "sort": lambda t: torch.sort(t, dim=1, descending=True).values,
    "sort stable": lambda t: t.sort(stable=True, dim=0).indices,
    "argsort": lambda t: torch.argsort(t, dim=-1, stable=True),
    "msort": torch.msort,
    "cumsum": lambda t: torch.cumsum(t, 1),
    "cumsum dtype": lambda t: t.cumsum(0, dtype=torch.float32),
    "cumprod": lambda t: torch.cumprod(t, 0),
    "logcumsumexp": lambda t: torch.logcumsumexp(t, 1),
    "cummax": lambda t: torch.cummax(t, 1).values, "cummin indices": lambda t: t.cummin(0).indices,
}


@pytest.mark.parametrize("name", list(ORDERS))
@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell"])
def test_sorts_and_scans_give_dense_results(name, fmt):
    x = rnd(4, 6, seed=3)
    out = ORDERS[name](scorch.as_sparse(x, fmt))
    assert not isinstance(out, SparseTensor)
    assert_dense_equal(out, ORDERS[name](x))


def test_scans_respect_the_dense_size_limit(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback_max_bytes", 8)
    with pytest.raises(scorch.NotSupportedError, match="cumsum gives a dense result"):
        torch.cumsum(scorch.as_sparse(rnd(4, 6), "csr"), 1)


# ================================================================ gradients of the replicating ops


REPLICATING = {
    "repeat": lambda A: A.repeat(2, 1, 2),
    "expand": lambda A: A.unsqueeze(0).expand(3, -1, -1),
    "tile": lambda A: torch.tile(A, (2,)),
    "repeat_interleave": lambda A: torch.repeat_interleave(A, torch.tensor([2, 0, 1]), dim=0),
    "kron sparse": lambda A: torch.kron(A, A),
    "kron dense": lambda A: torch.kron(A, torch.arange(4.0, dtype=torch.float64).view(2, 2)),
}


@pytest.mark.parametrize("name", list(REPLICATING))
def test_replicating_ops_are_differentiable(name):
    A = scorch.as_sparse(rnd(3, 4, seed=1), "csr")
    v = A.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: REPLICATING[name](A.with_values(v)).to_dense(), (v,))


@pytest.mark.parametrize("op", [lambda ts: torch.cat(ts, 1), lambda ts: torch.stack(ts, 0), torch.hstack,
                                torch.vstack, torch.column_stack, torch.dstack])
def test_joining_a_dense_operand_gives_its_zeros_gradients_too(op):
    """cat / stack of a SparseTensor and a dense tensor that requires grad: the dense operand's
    zeros are entries with a gradient (they got none: the recommender's zero-initialised biases
    never trained); oracle: gradcheck of the dense operand."""
    A = scorch.as_sparse(rnd(3, 2, seed=3), "csr")
    y = torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y: op([A, y]).to_dense(), (y,))
    torch.testing.assert_close(op([A, y]).to_dense(), op([A.to_dense(), y]))


def test_kron_gradient_reaches_a_dense_operand():
    A = scorch.as_sparse(rnd(3, 4, seed=2), "csr")
    y = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y: torch.kron(A, y).to_dense(), (y,))


# ================================================================ kthvalue / median / nanmedian


@SETTINGS
@given(st.data())
def test_kthvalue_and_medians_match_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    if x.numel() == 0 or not x.dtype.is_floating_point:
        return
    if data.draw(st.booleans()):   # some NaNs among the stored values
        hit = (x != 0) & (torch.rand(x.shape, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 9)))) < 0.3)
        x = torch.where(hit, torch.full((), float("nan"), dtype=x.dtype), x)
        A = scorch.as_sparse(x, A.format)
    dim = data.draw(st.integers(-A.dim(), A.dim() - 1))
    keepdim = data.draw(st.booleans())
    if x.shape[dim]:
        k = data.draw(st.integers(1, x.shape[dim]))
        cases = [(torch.kthvalue(A, k, dim, keepdim), torch.kthvalue(x, k, dim, keepdim)),
                 (torch.median(A, dim, keepdim), torch.median(x, dim, keepdim)),
                 (A.nanmedian(dim, keepdim), x.nanmedian(dim, keepdim))]
        for (v, i), (rv, ri) in cases:
            assert_dense_equal_nan(v, rv)
            assert i.dtype == torch.int64 and i.shape == ri.shape
            assert_dense_equal_nan(x.gather(dim, i if keepdim else i.unsqueeze(dim)).reshape(v.shape), v)
    assert_dense_equal_nan(torch.median(A), torch.median(x))
    assert_dense_equal_nan(torch.nanmedian(A), torch.nanmedian(x))


def test_median_gradient_reaches_the_stored_values():
    A = scorch.as_sparse(torch.tensor([[1.5, 0, -3, 0.25, 2], [0, 2, 0, 0, 0], [-1, -2, 4, 3, 0.5]],
                                      dtype=torch.float64), "csr")
    v = A.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: torch.median(A.with_values(v), 1).values, (v,))
    assert torch.autograd.gradcheck(lambda v: torch.kthvalue(A.with_values(v), 2, 0).values, (v,))
