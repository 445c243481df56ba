"""Assignment into a SparseTensor on coordinates: tensor keys, ``index_put_`` with accumulate,
``fill_diagonal_`` / ``index_fill_``, the scatters with a sparse self, ``index_copy_`` / ``put_`` /
``masked_scatter_``; and the index forms torch takes (``take_along_dim`` broadcasting, empty and
bool lists, uint8 masks, zero-size tensors).

The oracle is always the same op with plain torch on the dense tensor (values, dtype, shape); the
huge-shape tests (10**6 x 10**6, a few entries) would need terabytes if anything were densified.
"""

import pytest
import torch

import scorch
from scorch import NotSupportedError, ScorchTypeError, ScorchValueError, SparseTensor

from strategies import assert_dense_equal

FORMATS = ("coo", "csr", "csc", "ell", scorch.formats.bsr(2, 2))
HUGE = 10**6


@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    """Every write here runs on coordinates: a dense fallback raises instead."""
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


def base(dtype=torch.float32) -> torch.Tensor:
    """Integer-valued (sums are exact in any order), with zeros to grow into."""
    return torch.tensor([[1, 0, 2, 0], [0, 0, 3, 4], [5, 0, 0, 6], [0, 7, 0, 0]], dtype=dtype)


def check_write(fmt, op, x=None):
    """``op`` in place on a SparseTensor equals ``op`` on the dense tensor; returns the SparseTensor."""
    x = base() if x is None else x
    want = x.clone()
    op(want)
    A = scorch.as_sparse(x.clone(), fmt)
    with torch.no_grad():
        op(A)
    assert isinstance(A, SparseTensor)
    assert_dense_equal(A.to_dense(), want)
    return A


def huge(fmt="csr"):
    return scorch.from_coo([[0, 5, 9], [1, 7, 3]], [1., 2., 3.], (HUGE, HUGE), format=fmt)


# ================================================================ tensor-keyed writes on coordinates

POINT_WRITES = {
    "points scalar": lambda t: t.__setitem__((torch.tensor([0, 1, 3]), torch.tensor([1, 2, 0])), 9.0),
    "points zero": lambda t: t.__setitem__((torch.tensor([0, 1, 3]), torch.tensor([0, 2, 1])), 0.0),
    "points tensor": lambda t: t.__setitem__((torch.tensor([0, 2]), torch.tensor([1, 3])), torch.tensor([8., 0.])),
    "broadcast keys": lambda t: t.__setitem__((torch.tensor([[0], [2]]), torch.tensor([1, 2])), -1.0),
    "row tensor value": lambda t: t.__setitem__(torch.tensor([1, 3]), torch.tensor([1., 0., 2., 0.])),
    "row with leading 1": lambda t: t.__setitem__(1, torch.tensor([[1., 0., 2., 0.]])),
    "column slice key": lambda t: t.__setitem__((slice(1, 3), torch.tensor([0, 3])), torch.tensor([[4.], [0.]])),
    "dense mask value": lambda t: t.__setitem__(torch.eye(4, dtype=torch.bool), torch.tensor([1., 2., 0., 4.])),
    "bool list rows": lambda t: t.__setitem__([True, False, True, False], 3.0),
    "index_put_": lambda t: t.index_put_((torch.tensor([3, 0]), torch.tensor([3, 3])), torch.tensor([5., 6.])),
    "index_put_ accumulate repeats": lambda t: t.index_put_(
        (torch.tensor([0, 0, 1, 2, 3]), torch.tensor([1, 1, 2, 0, 0])), torch.tensor([1., 2., -3., -5., 4.]),
        accumulate=True),
    "index_put_ accumulate one row": lambda t: t.index_put_((torch.tensor([2]),), torch.tensor([1., 0., 0., -6.]),
                                                            accumulate=True),
    "fill_diagonal_ 0": lambda t: t.fill_diagonal_(0.0),
    "fill_diagonal_ 2": lambda t: t.fill_diagonal_(2.0),
    "index_fill_ 0": lambda t: t.index_fill_(1, torch.tensor([2, 0]), 0.0),
    "index_fill_ -1": lambda t: t.index_fill_(0, torch.tensor([-1]), 8.0),
}


@pytest.mark.parametrize("name", list(POINT_WRITES))
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_tensor_keyed_writes_match_dense(name, fmt):
    """Tensor keys, accumulate, fill_diagonal_ / index_fill_ (they marked the dense shape)."""
    check_write(fmt, POINT_WRITES[name])


def test_writes_with_nan_keep_it():
    A = scorch.as_sparse(base(), "csr")
    A.index_fill_(0, torch.tensor([-1]), float("nan"))
    want = base().index_fill_(0, torch.tensor([-1]), float("nan"))
    assert torch.equal(A.to_dense().isnan(), want.isnan())
    A[torch.tensor([0]), torch.tensor([1])] = float("nan")
    assert bool(A.to_dense()[0, 1].isnan())


def test_zero_writes_do_not_grow_the_pattern():
    A = scorch.as_sparse(base(), "csr")
    nnz = A.nnz
    A[torch.tensor([0, 1, 3]), torch.tensor([1, 0, 2])] = 0.0   # all absent
    A.index_fill_(1, torch.tensor([1]), 0.0)
    A.fill_diagonal_(0.0)
    A.index_put_((torch.tensor([0]), torch.tensor([3])), torch.tensor(0.0), accumulate=True)
    assert A.nnz == nnz


SCATTERS = {
    "scatter_ src": lambda t: t.scatter_(1, torch.tensor([[1, 3], [0, 1], [2, 2], [3, 0]]),
                                         torch.tensor([[9., 0.], [1., 2.], [3., 3.], [0., 4.]], dtype=t.dtype)),
    "scatter_ value": lambda t: t.scatter_(0, torch.tensor([[1, 0, 3, 2]]), 7.0),
    "scatter_ value kw": lambda t: t.scatter_(0, torch.tensor([[1, 0, 3, 2]]), value=-2.0),
    "scatter_ multiply": lambda t: t.scatter_(1, torch.tensor([[0, 0], [3, 2]]), torch.full((2, 2), 3., dtype=t.dtype),
                                              reduce="multiply"),
    "scatter_add_": lambda t: t.scatter_add_(0, torch.tensor([[0, 1, 1, 3], [0, 2, 1, 3]]),
                                             torch.tensor([[1., 2., 3., -6.], [4., 5., 6., 7.]], dtype=t.dtype)),
    **{f"scatter_reduce_ {r} {s}": (lambda r, s: lambda t: t.scatter_reduce_(
        1, torch.tensor([[0, 0, 1], [3, 3, 2], [1, 1, 1]]),
        torch.tensor([[2., -4., 6.], [0., 8., 1.], [3., 5., 7.]], dtype=t.dtype), r, include_self=s))(r, s)
       for r in ("sum", "prod", "mean", "amax", "amin") for s in (True, False)},
    "index_add_": lambda t: t.index_add_(0, torch.tensor([2, 0, 2]), torch.arange(12., dtype=t.dtype).view(3, 4) - 5),
    "index_add_ alpha dim 1": lambda t: t.index_add_(1, torch.tensor([1, 1]), torch.ones(4, 2, dtype=t.dtype),
                                                     alpha=2),
    **{f"index_reduce_ {r} {s}": (lambda r, s: lambda t: t.index_reduce_(
        0, torch.tensor([1, 3, 1]), torch.tensor([[2., 0., 4., 1.], [1., 3., 0., 5.], [4., 2., 2., 2.]],
                                                 dtype=t.dtype), r, include_self=s))(r, s)
       for r in ("prod", "mean", "amax", "amin") for s in (True, False)},
}


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("name", list(SCATTERS))
@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_scatters_into_a_sparse_self_match_dense(name, fmt):
    """In place on the touched positions only (they computed on the dense copy)."""
    check_write(fmt, SCATTERS[name])


def test_scatters_check_their_arguments():
    A = scorch.as_sparse(base(), "csr")
    with pytest.raises(IndexError, match="out of bounds"):
        A.scatter_(1, torch.tensor([[4]]), 1.0)
    with pytest.raises(RuntimeError, match="no larger than src"):
        A.scatter_(1, torch.tensor([[0, 1, 2]]), torch.ones(1, 1))
    with pytest.raises(ScorchValueError, match="as many dims"):
        A.scatter_add_(1, torch.tensor([0]), torch.ones(1, 1))
    with pytest.raises(IndexError, match="out of bounds"):
        A.index_reduce_(0, torch.tensor([4]), torch.ones(1, 4), "prod")
    B = scorch.as_sparse(base(), "csr").requires_grad_()
    with pytest.raises(NotSupportedError, match="requires grad"):
        B.scatter_(1, torch.tensor([[0]]), 1.0)


def test_writes_into_a_huge_sparse_tensor_stay_on_coordinates():
    """10**6 x 10**6 with 3 entries: every one raised (a 7 TiB dense copy)."""
    A = huge()
    A[torch.tensor([5, 7]), torch.tensor([9, 2])] = 1.0
    assert A.nnz == 5 and A[5, 9].item() == 1.0 and A[7, 2].item() == 1.0
    A[torch.tensor([5]), torch.tensor([9])] = 0.0        # a stored entry takes it; the pattern stays
    assert A.nnz == 5 and A[5, 9].item() == 0.0
    A.index_put_((torch.tensor([5, 5, 0]), torch.tensor([7, 7, 1])), torch.tensor([1., 2., 3.]), accumulate=True)
    assert A.nnz == 5 and A[5, 7].item() == 5.0 and A[0, 1].item() == 4.0
    A.scatter_(1, torch.tensor([[0]]), 1.0)
    A.scatter_add_(0, torch.tensor([[9, 9]]), torch.tensor([[2., 3.]]))
    assert A[0, 0].item() == 1.0 and A[9, 0].item() == 2.0 and A[9, 1].item() == 3.0
    A.scatter_reduce_(1, torch.tensor([[1]]), torch.tensor([[-7.]]), "amin")
    assert A[0, 1].item() == -7.0 and A.nnz == 8
    A.index_add_(1, torch.tensor([3]), scorch.from_coo([[9]], [10.], (HUGE,)).reshape(HUGE, 1))
    assert A[9, 3].item() == 13.0
    A.fill_diagonal_(0.0)
    assert A.nnz == 8 and A[0, 0].item() == 0.0
    A.index_fill_(0, torch.tensor([5, 9]), 0.0)
    assert A[9, 3].item() == 0.0 and A[0, 1].item() == -7.0 and A.nnz == 8
    A.fill_diagonal_(2.0)                                 # 10**6 - 1 new entries: O(min(n, m)), fine
    assert A.nnz == HUGE + 7 and A[HUGE - 1, HUGE - 1].item() == 2.0


def test_a_huge_nonzero_fill_is_a_clear_size_error():
    """index_fill_ with a nonzero fills whole slices: a pattern that big is refused, naming the limit."""
    A = scorch.from_coo([[0], [1]], [1.], (10**9, 10**9), format="coo")
    with pytest.raises(NotSupportedError, match="index_fill_.*dense_fallback_max_bytes"):
        A.index_fill_(0, torch.tensor([3]), 1.0)
    A.index_fill_(0, torch.tensor([0]), 0.0)              # a zero touches the stored entries only
    assert A.nnz == 1 and A[0, 1].item() == 0.0


# ================================================================ index_copy_ / put_ / masked_scatter_

def small():
    return torch.tensor([[0., 2., 0.], [3., 0., 0.], [0., 0., 4.]])


IN_PLACE = {
    "index_copy_": lambda t: t.index_copy_(0, torch.tensor([2, 0]), torch.tensor([[1., 0., 1.], [0., 5., 0.]])),
    "index_copy_ dim 1": lambda t: t.index_copy_(1, torch.tensor([1]), torch.zeros(3, 1)),
    "index_copy_ 0-d index": lambda t: t.index_copy_(1, torch.tensor(2), torch.tensor([[7.], [0.], [8.]])),
    "put_": lambda t: t.put_(torch.tensor([0, -1, 4]), torch.tensor([5., 6., 0.])),
    "put_ 2-d": lambda t: t.put_(torch.tensor([[1, 2]]), torch.tensor([[0., 9.]])),
    "put_ accumulate": lambda t: t.put_(torch.tensor([1, 1, 8, 3]), torch.tensor([5., 1., -4., -3.]), accumulate=True),
    "masked_scatter_": lambda t: t.masked_scatter_(torch.eye(3, dtype=torch.bool), torch.tensor([7., 0., 9., 1.])),
    "masked_scatter_ broadcast": lambda t: t.masked_scatter_(torch.tensor([True, False, True]),
                                                             torch.arange(8.).view(2, 4)),
}


@pytest.mark.parametrize("name", list(IN_PLACE))
@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "ell"])
def test_index_copy_put_masked_scatter_match_dense(name, fmt):
    """They raised ("writing into a SparseTensor in place is not supported")."""
    want = small()
    got = IN_PLACE[name](want)
    assert got is want
    A = scorch.as_sparse(small(), fmt)
    assert IN_PLACE[name](A) is A
    assert_dense_equal(A.to_dense(), want)


def test_masked_scatter_with_a_sparse_mask():
    """A bool SparseTensor mask: its stored True entries, in row-major order."""
    eye = torch.eye(3, dtype=torch.bool)
    eye[0, 0] = False
    mask = scorch.as_sparse(eye, "csc")   # (column-major storage: the order is still torch's)
    A = scorch.as_sparse(small(), "csr")
    A.masked_scatter_(mask, torch.tensor([-1., -2., 5.]))
    assert_dense_equal(A.to_dense(), small().masked_scatter_(eye, torch.tensor([-1., -2., 5.])))


def test_index_copy_put_masked_scatter_check_as_torch():
    A = scorch.as_sparse(small(), "csr")
    with pytest.raises(IndexError, match="out of bounds"):
        A.index_copy_(0, torch.tensor([3]), torch.ones(1, 3))
    with pytest.raises(IndexError, match="int64"):
        A.index_copy_(0, torch.tensor([1], dtype=torch.int32), torch.ones(1, 3))
    with pytest.raises(RuntimeError, match="Number of indices"):
        A.index_copy_(0, torch.tensor([1]), torch.ones(2, 3))
    with pytest.raises(ScorchTypeError, match="same dtype"):
        A.index_copy_(0, torch.tensor([1]), torch.ones(1, 3, dtype=torch.float64))
    with pytest.raises(IndexError, match="out of range"):
        A.put_(torch.tensor([9]), torch.tensor([1.]))
    with pytest.raises(IndexError, match="one element per index"):
        A.put_(torch.tensor([1, 2]), torch.tensor([1.]))
    with pytest.raises(ScorchTypeError, match="int64"):
        A.put_(torch.tensor([1], dtype=torch.int32), torch.tensor([1.]))
    with pytest.raises(ScorchValueError, match="fewer than"):
        A.masked_scatter_(torch.ones(3, 3, dtype=torch.bool), torch.tensor([1., 2.]))
    with pytest.raises(ScorchTypeError, match="bool"):
        A.masked_scatter_(torch.ones(3, 3, dtype=torch.uint8), torch.ones(9))
    assert_dense_equal(A.to_dense(), small())   # nothing written by a refused call


@pytest.mark.parametrize("name", ["index_copy_", "put_", "masked_scatter_"])
def test_index_copy_put_masked_scatter_refuse_grad_as_their_siblings(name):
    A = scorch.as_sparse(small(), "csr").requires_grad_()
    with pytest.raises(NotSupportedError, match="requires grad"):
        IN_PLACE[name](A)
    with torch.no_grad():   # a parameter update: allowed
        IN_PLACE[name](A)
    want = IN_PLACE[name](small())
    assert_dense_equal(A.detach().to_dense(), want)


# ================================================================ take_along_dim

@pytest.mark.parametrize("shape,idx,dim", [((1, 4), [[0, 1], [3, 3], [1, 0]], 1),
                                           ((3, 2), [[1]], 0),
                                           ((3, 1), [[0, 0, 0]], 1),
                                           ((2, 1, 3), [[[2], [0]]], 2)])
def test_take_along_dim_broadcasts_as_torch(shape, idx, dim):
    """The input broadcast against the indices (it raised a bare RuntimeError)."""
    x = (torch.arange(torch.Size(shape).numel(), dtype=torch.float64) % 3).view(shape)   # (zeros among them)
    idx = torch.tensor(idx)
    want = torch.take_along_dim(x, idx, dim)
    got = torch.take_along_dim(scorch.as_sparse(x, "coo"), idx, dim)
    assert_dense_equal(got, want)


def test_take_along_dim_errors_as_torch():
    x = torch.tensor([[0., 2., 0., 4.]])
    A = scorch.as_sparse(x, "csr")
    with pytest.raises(RuntimeError):
        torch.take_along_dim(x, torch.tensor([1, 0]), 1)
    with pytest.raises(ScorchValueError, match="same number of dimensions"):
        torch.take_along_dim(A, torch.tensor([1, 0]), 1)
    with pytest.raises(RuntimeError):
        torch.take_along_dim(x, torch.tensor([-1, 0]))
    with pytest.raises(IndexError, match="out of bounds"):
        torch.take_along_dim(A, torch.tensor([-1, 0]))
    with pytest.raises(RuntimeError):
        torch.take_along_dim(x, torch.tensor([[1]], dtype=torch.int32), 1)
    with pytest.raises(ScorchTypeError, match="int64"):
        torch.take_along_dim(A, torch.tensor([[1]], dtype=torch.int32), 1)
    assert_dense_equal(torch.take_along_dim(A, torch.tensor([3, 1])), torch.take_along_dim(x, torch.tensor([3, 1])))


# ================================================================ index_fill_'s index; zero-size tensors

@pytest.mark.parametrize("op", ["index_fill_", "index_fill"])
def test_index_fill_checks_the_index_as_torch(op):
    x = torch.zeros(3, 4)
    A = scorch.as_sparse(x.clone(), "csr")
    for bad, err, match in [(torch.tensor([1.9]), IndexError, "int64"),
                            (torch.tensor([1], dtype=torch.int32), IndexError, "int64"),
                            (torch.tensor([[0, 2]]), (ValueError, RuntimeError), "vector")]:
        with pytest.raises(err, match=match):
            getattr(x.clone(), op)(0, bad, 5.0)   # the oracle raises too
        with pytest.raises(err, match=match):
            getattr(A, op)(0, bad, 5.0)
    assert A.nnz == 0   # nothing written (1.9 was truncated to row 1)
    with pytest.raises(ScorchValueError, match="0-d"):
        getattr(A, op)(0, torch.tensor([1]), torch.tensor([5.0]))
    want = getattr(x.clone(), op)(0, torch.tensor(1), torch.tensor(5.0))
    assert_dense_equal(getattr(A, op)(0, torch.tensor(1), torch.tensor(5.0)).to_dense(), want)


ZERO_SIZE = {
    "index_fill_": lambda t: t.index_fill_(0, torch.tensor([9]), 1.0),
    "index_fill": lambda t: t.index_fill(0, torch.tensor([9]), 1.0),
    "index_fill_ dim 1": lambda t: t.index_fill_(1, torch.tensor([0]), 0.0),
    "index_add": lambda t: t.index_add(0, torch.tensor([9]), torch.ones(1, 0)),
    "index_add_": lambda t: t.index_add_(0, torch.tensor([9]), torch.ones(1, 0)),
    "index_copy_": lambda t: t.index_copy_(0, torch.tensor([9]), torch.ones(1, 0)),
}


@pytest.mark.filterwarnings("ignore:scorch")
@pytest.mark.parametrize("name", list(ZERO_SIZE))
def test_writes_into_a_zero_size_tensor_do_nothing_as_torch(name, monkeypatch):
    """torch writes nothing into a (4, 0) tensor whatever the index (they raised IndexError)."""
    x = torch.zeros(4, 0)
    if name != "index_fill_ dim 1":   # (there torch fails with an internal storage error: nothing to match)
        assert_dense_equal(ZERO_SIZE[name](x.clone()), x)
    monkeypatch.setattr(scorch.config, "dense_fallback", "warn")   # (index_add out of place: torch's, densely)
    got = ZERO_SIZE[name](scorch.as_sparse(x.clone(), "csr"))
    assert_dense_equal(got.to_dense() if isinstance(got, SparseTensor) else got, x)


# ================================================================ index forms

def test_empty_lists_bool_lists_and_uint8_masks_index_as_torch():
    x = torch.tensor([[0., 2.], [3., 0.]])
    A = scorch.as_sparse(x, "csr")
    assert_dense_equal(A[[], []], x[[], []])
    for key in ([True, False], ([True, False], [False, True]), (slice(None), [False, True])):
        got = A[key]
        assert_dense_equal(got.to_dense() if isinstance(got, SparseTensor) else got, x[key])
    mask = torch.tensor([1, 0], dtype=torch.uint8)
    with pytest.warns(UserWarning, match="uint8"):
        want = x[mask]
    with pytest.warns(UserWarning, match="uint8"):
        got = A[mask]
    assert_dense_equal(got.to_dense(), want)


def test_a_mask_of_the_wrong_shape_is_refused_as_torch():
    """A bool mask whose shape does not match the dims it indexes: torch's IndexError (it was read as
    the indices of its True entries and wrote there)."""
    x = torch.tensor([[1., 0, 0], [0, 2, 0], [0, 0, 3]])
    A = scorch.as_sparse(x, "csr")
    with pytest.raises(IndexError):
        x.clone()[torch.tensor([True, False])] = 9.0
    with pytest.raises(IndexError, match="shape of the mask"):
        A[torch.tensor([True, False])] = 9.0
    with pytest.raises(IndexError, match="shape of the mask"):
        A.index_put_((torch.tensor([[True, False]]),), torch.tensor(1.0), accumulate=True)
    assert torch.equal(A.to_dense(), x)
