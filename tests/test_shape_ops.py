"""Shape ops on SparseTensors: reshape family, indexing, cat/stack, rearrange.

The oracle is always the same op on the dense tensor (``x.to_dense()`` then
torch): results must be SparseTensors with the same shape, dtype and values
(``torch.equal``), built without densifying.
"""

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch.ops import shape as shape_ops  # (scorch.ops is torch.ops: the package's name for it is torch's)
from scorch import Format, NotSupportedError, ScorchTypeError, ScorchValueError, SparseTensor, compressed, dense
from scorch.ops.rearrange import Pattern, parse_pattern, rearrange
from scorch.ops.shape import result_format

from strategies import assert_dense_equal, densities, make_dense, seeds, shapes



@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    """Every op here must run on coordinates: a dense fallback raises instead."""
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")

FORMATS = ("coo", "csr", "csc", "dcsr", "csf", "ell")
BSR = scorch.formats.bsr(2, 2)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def formats_for(shape) -> list:
    """The tested formats that apply to a tensor of ``shape`` (bsr 2x2 when it divides it)."""
    out = [f for f in FORMATS if len(shape) >= 2 or f != "csc"]
    if len(shape) == 2 and shape[0] % 2 == 0 and shape[1] % 2 == 0:
        out.append(BSR)
    return out


def sample(shape, seed=0, dtype=torch.float64, density=0.4) -> torch.Tensor:
    return make_dense(shape, density, seed, dtype)


def check(result, expected: torch.Tensor, src: SparseTensor = None) -> None:
    """``result`` is a SparseTensor equal to the dense ``expected`` (shape, dtype, values);
    with ``src``, it also kept ``src``'s index dtype."""
    assert isinstance(result, SparseTensor), type(result)
    assert result.shape == expected.shape, (result.shape, expected.shape)
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert_dense_equal(result.to_dense(), expected)
    if src is not None:
        assert result.index_dtype == src.index_dtype, (result.index_dtype, src.index_dtype)


@st.composite
def sparse_tensors(draw, min_dims=1, max_dims=4):
    """``(A, x)``: a SparseTensor in one of the tested formats and its dense value."""
    shape = draw(shapes(min_dims, max_dims))
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.int32]))
    x = make_dense(shape, draw(densities), draw(seeds), dtype)
    fmt = draw(st.sampled_from(formats_for(shape)))
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    return scorch.as_sparse(x, fmt, index_dtype=index_dtype), x


def divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def reshape_targets(draw, numel: int):
    """A shape with ``numel`` elements, maybe with one -1 (only where it is inferable)."""
    n = draw(st.integers(1, 4))
    if numel == 0:
        sizes = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        sizes[draw(st.integers(0, n - 1))] = 0
    else:
        sizes, rest = [], numel
        for _ in range(n - 1):
            d = draw(st.sampled_from(divisors(rest)))
            sizes.append(d)
            rest //= d
        sizes = list(draw(st.permutations(sizes + [rest])))
    i = draw(st.integers(0, n - 1))
    if draw(st.booleans()) and math.prod(s for j, s in enumerate(sizes) if j != i):
        sizes[i] = -1
    return tuple(sizes)


# ================================================================ reshape / view / flatten


@SETTINGS
@given(st.data())
def test_reshape_matches_dense(data):
    A, x = data.draw(sparse_tensors())
    target = data.draw(reshape_targets(x.numel()))
    check(A.reshape(target), x.reshape(target), A)
    check(torch.reshape(A, target), x.reshape(target), A)
    check(A.view(*target), x.view(*target), A)


RESHAPES = [
    ((3, 4), (4, 3)), ((3, 4), (12,)), ((3, 4), (2, -1, 2)), ((12,), (3, 4)), ((5,), (5, 1)),
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (4, -1)), ((2, 2, 3, 2), (4, 6)), ((2, 2, 3, 2), (24,)),
    ((0, 4), (2, 0, 2)), ((0, 4), (-1, 4)), ((3, 0, 2), (0,)), ((4, 6), (6, 4)),
]


@pytest.mark.parametrize("shape,target", RESHAPES, ids=str)
def test_reshape_cases_every_format(shape, target):
    x = sample(shape)
    for fmt in formats_for(shape):
        A = scorch.as_sparse(x, fmt)
        check(A.reshape(*target), x.reshape(*target), A)
        check(A.reshape(torch.Size(target)), x.reshape(target), A)
        check(A.view(list(target)), x.reshape(target), A)


def test_reshape_keeps_the_stored_entries():
    x = sample((4, 6), density=0.3)
    for fmt in ("coo", "csr", "csc", "dcsr", "ell"):
        A = scorch.as_sparse(x, fmt)
        assert A.reshape(3, 8).nnz == A.nnz == int((x != 0).sum())
        assert A.reshape(2, 3, 4).nnz == A.nnz


def test_reshape_to_the_same_shape_shares_storage():
    A = scorch.as_sparse(sample((3, 4)), "csr")
    B = A.reshape(3, 4)
    assert B._vals.data_ptr() == A._vals.data_ptr() and B.shape == A.shape


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "ell"])
def test_views_share_the_values_where_the_order_is_kept(fmt):
    """A reshape-family result keeps the values array when its storage holds the entries in the
    same order (row-major formats: view, flatten, unsqueeze): writes into its stored values reach
    the original as a torch view's do; where the storage reorders them (CSC) or pads (ELL), a copy,
    which refuses writes when torch's result is always a view (view, unsqueeze, squeeze: the write
    was lost).  Oracle: the same writes on a dense tensor and its views."""
    x = sample((4, 6))
    for always_a_view, make in ((True, lambda t: t.view(6, 4)), (True, lambda t: t.view(size=(24,))),
                                (False, lambda t: t.flatten()), (True, lambda t: t.unsqueeze(0)),
                                (True, lambda t: t.unsqueeze(0).squeeze(0))):
        A, D = scorch.as_sparse(x, fmt), x.clone()
        V = make(A)
        check(V, make(D), A)
        shared = V.values().data_ptr() == A.values().data_ptr()
        assert shared or fmt not in ("coo", "csr")   # row-major storage keeps the order
        if not shared and always_a_view:
            with pytest.raises(NotSupportedError, match="is a copy, not a view"):
                V.mul_(3)
            continue
        V.mul_(3)
        make(D).mul_(3)
        assert torch.equal(A.to_dense(), D if shared else x)


def test_view_dtype_is_not_supported():
    A = scorch.as_sparse(sample((2, 2)), "csr")
    with pytest.raises(NotSupportedError, match=r"view\(dtype=torch.int64\).*to_dense"):
        A.view(torch.int64)


@SETTINGS
@given(st.data())
def test_flatten_matches_dense(data):
    A, x = data.draw(sparse_tensors())
    n = x.dim()
    start = data.draw(st.integers(-n, n - 1))
    end = data.draw(st.integers(start % n, n - 1))
    check(A.flatten(start, end), x.flatten(start, end), A)
    check(torch.flatten(A, start_dim=start), torch.flatten(x, start_dim=start), A)
    check(A.ravel(), x.ravel(), A)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unflatten_matches_dense(fmt):
    x = sample((2, 12, 3))
    A = scorch.as_sparse(x, fmt)
    check(A.unflatten(1, (3, -1)), x.unflatten(1, (3, -1)), A)
    check(torch.unflatten(A, -1, (1, 3)), torch.unflatten(x, -1, (1, 3)), A)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 1, 3), (1, 2, 1, 3), (0, 2), (2, 0, 1)], ids=str)
def test_unsqueeze_squeeze_match_dense(shape):
    x = sample(shape)
    for fmt in formats_for(shape):
        A = scorch.as_sparse(x, fmt)
        for d in range(-x.dim() - 1, x.dim() + 1):
            check(A.unsqueeze(d), x.unsqueeze(d), A)
            check(torch.unsqueeze(A, d), x.unsqueeze(d), A)
        check(A.squeeze(), x.squeeze(), A)
        for d in range(-x.dim(), x.dim()):
            check(A.squeeze(d), x.squeeze(d), A)  # a dim that is not size 1 is left alone
        check(torch.squeeze(A, tuple(range(x.dim() - 1))), torch.squeeze(x, tuple(range(x.dim() - 1))), A)


IN_PLACE_VIEWS = [("t_", ()), ("transpose_", (0, -1)), ("unsqueeze_", (1,)), ("squeeze_", (1,)),
                  ("unsqueeze_", (0,)), ("unsqueeze_", (-1,)), ("squeeze_", ()), ("swapdims_", (0, -1)),
                  ("unsqueeze_", (0,)), ("squeeze_", ((0,),))]


@pytest.mark.parametrize("shape", [(5,), (3, 4), (1, 4), (2, 1, 3), (0, 2)], ids=str)
def test_in_place_views_match_dense(shape):
    """t_ / transpose_ / swapdims_ / unsqueeze_ / squeeze_ change the tensor itself (returned), its
    sizes and strides as the dense tensor's change, and keep its values."""
    x = sample(shape)
    for fmt in formats_for(shape):
        A, y = scorch.as_sparse(x, fmt), x.clone()
        for name, args in IN_PLACE_VIEWS:
            if name == "t_" and y.dim() > 2:
                continue
            assert getattr(A, name)(*args) is A
            getattr(y, name)(*args)
            assert A.stride() == y.stride(), (fmt, name, A.stride(), y.stride())
            check(A, y)


def test_in_place_views_in_autograd():
    """On a leaf that requires grad torch refuses, as for a dense leaf; inside a graph the view is
    recorded and the gradient reaches the leaf in its pattern."""
    x = sample((3, 4))
    A = scorch.as_sparse(x, "csr").requires_grad_()
    with pytest.raises(RuntimeError, match="leaf"):
        A.t_()
    B = A * 2
    B.t_()
    w = torch.randn(4, 3, dtype=torch.float64)
    (B * w).sum().backward()
    assert_dense_equal(A.grad.to_dense(), (2 * w.t()) * (x != 0))


def test_squeeze_in_place_to_0d_raises():
    A = scorch.as_sparse(torch.tensor([[2.5]]), "csr")
    with pytest.raises(NotSupportedError, match="0-d"):
        A.squeeze_()
    assert A.shape == (1, 1)


def test_squeeze_to_0d_gives_a_dense_scalar():
    for v in (0.0, 2.5):
        A = scorch.as_sparse(torch.tensor([[v]]), "csr")
        out = A.squeeze()
        assert type(out) is torch.Tensor and out.dim() == 0 and out.dtype == A.dtype
        assert float(out) == v


def test_result_format_rules():
    x = sample((4, 6))
    assert A_fmt(x, "csr", (2, 2, 6)) == scorch.formats.preset("csr", 3)
    assert A_fmt(x, "csr", (6, 4)) == scorch.formats.csr
    assert A_fmt(x, "csc", (24,)) == scorch.formats.preset("coo", 1)  # csc needs 2 dims
    assert A_fmt(x, "ell", (2, 12)) == scorch.formats.ell
    assert A_fmt(x, BSR, (6, 4)) == BSR                                  # the block still divides
    assert A_fmt(x, BSR, (8, 3)) == scorch.formats.coo                   # it does not: coo
    user = Format([compressed, dense])
    assert A_fmt(x, user, (8, 3)) == user                                # same ndim: kept
    assert A_fmt(x, user, (2, 3, 4)) == scorch.formats.preset("coo", 3)  # no name: coo
    assert result_format(user, (2, 3, 4)) == scorch.formats.preset("coo", 3)


def A_fmt(x, fmt, target):
    return scorch.as_sparse(x, fmt).reshape(target).format


def test_index_dtype_is_kept_and_widened_only_when_needed():
    x = sample((4, 6))
    assert scorch.as_sparse(x, "csr", index_dtype=torch.int64).reshape(-1).index_dtype == torch.int64
    assert scorch.as_sparse(x, "csr", index_dtype=torch.int32).reshape(-1).index_dtype == torch.int32
    n = 2**16  # a 2**16 x 2**16 tensor flattens to coordinates beyond int32: never densified
    A = scorch.from_coo([[1, n - 1], [2, n - 1]], [1.0, 2.0], (n, n), format="csr")
    assert A.index_dtype == torch.int32
    B = A.reshape(-1)
    assert B.shape == (n * n,) and B.index_dtype == torch.int64
    coords, vals = B.coo()
    assert coords.tolist() == [[n + 2, n * n - 1]] and vals.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("call,match", [
    (lambda A: A.reshape(4, 3), r"shape \(4, 3\) has 12 elements, expected 9.*\(3, 3\)"),
    (lambda A: A.reshape(-1, -1), "at most one -1"),
    (lambda A: A.reshape(-2, 9), "at most one -1"),
    (lambda A: A.reshape(2, -1), r"cannot infer the -1 in shape \(2, -1\).*9 elements"),
    (lambda A: A.view(10), "expected 9"),
    (lambda A: A.flatten(1, 0), "start_dim=1 comes after end_dim=0"),
    (lambda A: A.unflatten(0, (2, 2)), "expected 3"),
])
def test_reshape_errors_name_expected_and_actual(call, match):
    A = scorch.as_sparse(sample((3, 3)), "csr")
    with pytest.raises(ScorchValueError, match=match):
        call(A)


def test_reshape_of_empty_into_ambiguous_minus_one_fails():
    A = scorch.as_sparse(torch.zeros(0, 4), "coo")
    with pytest.raises(ValueError, match="cannot infer"):
        A.reshape(0, -1)


def test_bad_dims_and_shape_types():
    A = scorch.as_sparse(sample((3, 3)), "csr")
    with pytest.raises(IndexError, match=r"unsqueeze: dim=3 is out of range for a 3-d tensor"):
        A.unsqueeze(3)
    with pytest.raises(ScorchValueError, match=r"squeeze: dim=-3"):
        A.squeeze(-3)
    with pytest.raises(TypeError):  # torch's argument parser rejects this before dispatch
        A.reshape(3.0, 3)
    with pytest.raises(ScorchTypeError, match="shape must be an int, got float"):
        shape_ops.reshape(A, (3.0, 3))
    with pytest.raises(ScorchTypeError, match="got bool"):
        shape_ops.reshape(A, (True, 9))


# ================================================================ index_select / indexing


@SETTINGS
@given(st.data())
def test_index_select_matches_dense(data):
    A, x = data.draw(sparse_tensors())
    d = data.draw(st.integers(-x.dim(), x.dim() - 1))
    size = x.shape[d]
    idx = data.draw(st.lists(st.integers(0, size - 1), max_size=8)) if size else []
    index = torch.tensor(idx, dtype=data.draw(st.sampled_from([torch.int64, torch.int32])))
    check(torch.index_select(A, d, index), torch.index_select(x, d, index), A)
    check(A.index_select(d, index), x.index_select(d, index), A)


def test_index_select_errors():
    A = scorch.as_sparse(sample((3, 4)), "csr")
    with pytest.raises(IndexError, match=r"index 4 is out of range for a dim of size 4 \(expected \[0, 3\]\)"):
        A.index_select(1, torch.tensor([0, 4]))
    with pytest.raises(ScorchValueError, match="index -1 is out of range"):
        A.index_select(0, torch.tensor([-1]))  # torch rejects negatives here too
    with pytest.raises(ScorchTypeError, match="index must be an integer tensor, got dtype torch.float32"):
        A.index_select(0, torch.tensor([0.0]))
    with pytest.raises(ScorchValueError, match=r"index must be 0-d or 1-d, got shape \(1, 1\)"):
        A.index_select(0, torch.tensor([[0]]))


KEYS_3D = [
    1, -1, slice(1, 3), slice(None, None, 2), slice(-3, None), slice(5, 1), slice(0, 100, 3),
    torch.tensor([2, 0, 2, -1]), [1, 1], torch.tensor(0), (slice(None), 2), (slice(None), -1, slice(1, 4)),
    (0, 1), (0, 1, 2), (Ellipsis, 0), (None, 1), (slice(None), None, 0), (1, Ellipsis, None),
    (slice(None), [0, 2]), (slice(None), 1, [3, 3, 0]), (slice(1, None), slice(None, None, 2), -2), (),
]


@pytest.mark.parametrize("key", KEYS_3D, ids=repr)
def test_getitem_matches_dense(key):
    x = sample((4, 3, 5), seed=1)
    for fmt in formats_for(x.shape):
        A = scorch.as_sparse(x, fmt)
        out, want = A[key], x[key]
        if want.dim() == 0:
            assert type(out) is torch.Tensor
            assert_dense_equal(out, want)
        else:
            check(out, want, A)


@pytest.mark.parametrize("shape", [(6,), (0,), (4, 6), (0, 3), (2, 0, 3), (2, 3, 2, 3)], ids=str)
def test_getitem_first_dim_every_format(shape):
    x = sample(shape, seed=2)
    n = shape[0]
    keys = [slice(1, None), slice(None, None, 2), slice(-2, None), [0, -1] if n else [], torch.arange(n).flip(0)]
    keys += [0, -1] if n else []
    for fmt in formats_for(shape):
        A = scorch.as_sparse(x, fmt)
        for key in keys:
            want = x[key]
            if want.dim() == 0:
                assert_dense_equal(A[key], want)
            else:
                check(A[key], want, A)


@st.composite
def basic_keys(draw, shape):
    """An index tuple of ints, slices (any bounds, positive step), maybe an Ellipsis
    standing for some middle dims, and maybe a None."""
    items = []
    for size in shape:
        if size and draw(st.booleans()):
            items.append(draw(st.integers(-size, size - 1)))
        else:
            bound = st.none() | st.integers(-size - 2, size + 2)
            items.append(slice(draw(bound), draw(bound), draw(st.none() | st.integers(1, 3))))
    i = draw(st.integers(0, len(items)))
    if draw(st.booleans()):
        items = items[:i] + [Ellipsis] + items[draw(st.integers(i, len(items))):]
    else:
        items = items[:i]
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), None)
    return tuple(items)


@SETTINGS
@given(st.data())
def test_getitem_random_basic_keys(data):
    A, x = data.draw(sparse_tensors())
    key = data.draw(basic_keys(tuple(x.shape)))
    out, want = A[key], x[key]
    if want.dim() == 0:
        assert_dense_equal(out, want)
    else:
        check(out, want, A)


def test_int_index_of_1d_gives_a_dense_scalar():
    A = scorch.as_sparse(torch.tensor([0.0, 3.0, 0.0, -2.0]), "coo")
    for i, v in [(1, 3.0), (-1, -2.0), (0, 0.0)]:
        out = A[i]
        assert type(out) is torch.Tensor and out.shape == () and out.dtype == torch.float32 and float(out) == v


@pytest.mark.parametrize("key", [   # (bool masks and tensors on the leading dims: tests/test_lookup.py)
    True, 1.5, (slice(None), torch.tensor([0]), torch.tensor([1])), (slice(None), torch.tensor([[0, 1]])),
    (0, slice(None), torch.tensor([1])),
], ids=repr)
def test_unsupported_keys_raise_with_a_workaround(key):
    A = scorch.as_sparse(sample((3, 3, 3)), "csr")
    with pytest.raises(NotSupportedError, match=r"indexing a SparseTensor with .*x\.to_dense\(\)\[\.\.\.\]"):
        A[key]


def test_a_list_of_bools_is_a_mask_as_in_torch():
    """``[True, False, True]`` was refused as an unsupported key; torch reads it as a bool mask."""
    x = sample((3, 3, 3))
    check(scorch.as_sparse(x, "csr")[[True, False, True]], x[[True, False, True]])


def test_bad_keys():
    A = scorch.as_sparse(sample((3, 4)), "csr")
    with pytest.raises(IndexError, match=r"indexing dim 1: index 4 is out of range for a dim of size 4"):
        A[:, 4]
    with pytest.raises(ScorchValueError, match=r"index -4 is out of range"):
        A[-4]
    with pytest.raises(IndexError, match=r"too many indices \(3\) for a 2-d tensor"):
        A[0, 0, 0]
    with pytest.raises(ScorchValueError, match="slice step must be positive"):
        A[::-1]
    with pytest.raises(ScorchValueError, match="at most one Ellipsis"):
        A[..., ...]


@pytest.mark.parametrize("fmt", FORMATS)
def test_select_and_narrow_match_dense(fmt):
    x = sample((3, 4, 5))
    A = scorch.as_sparse(x, fmt)
    for d in range(-3, 3):
        check(A.select(d, 1), x.select(d, 1), A)
        check(torch.narrow(A, d, 1, 2), torch.narrow(x, d, 1, 2), A)
    check(A.narrow(2, -2, 2), x.narrow(2, -2, 2), A)
    with pytest.raises(IndexError, match="narrow: start=2, length=4"):
        A.narrow(1, 2, 4)


# ================================================================ cat / stack


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 4), (2, 3, 4), (2, 0, 2), (1, 2, 2, 2)], ids=str)
def test_cat_matches_dense(shape):
    for fmt in formats_for(shape):
        for d in range(-len(shape), len(shape)):
            parts = [sample(shape, seed=s) for s in range(3)]
            other = list(shape)
            other[d] = 2 if shape[d] % 2 == 0 else 0  # a piece of another size along d (bsr: still even)
            parts.append(sample(tuple(other), seed=4))
            As = [scorch.as_sparse(p, fmt) for p in parts[:2]] + parts[2:]  # dense ones are sparsified
            check(torch.cat(As, d), torch.cat(parts, d), As[0])
            check(torch.cat([parts[0], As[1]], dim=d), torch.cat(parts[:2], dim=d), As[1])


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (0, 3), (2, 1, 2, 2)], ids=str)
def test_stack_matches_dense(shape):
    for fmt in formats_for(shape):
        for d in range(-len(shape) - 1, len(shape) + 1):
            parts = [sample(shape, seed=s) for s in range(3)]
            As = [scorch.as_sparse(parts[0], fmt), parts[1], scorch.as_sparse(parts[2], "coo")]
            check(torch.stack(As, d), torch.stack(parts, d), As[0])


def test_cat_stack_result_layout():
    x, y = sample((2, 3)), sample((2, 3), seed=1)
    A, B = scorch.as_sparse(x, "csc"), scorch.as_sparse(y, "coo", index_dtype=torch.int64)
    assert torch.cat([A, B]).format == scorch.formats.csc           # the first sparse operand's format
    assert torch.cat([y, A, B]).index_dtype == torch.int64          # any int64 operand widens
    assert torch.cat([y, A]).index_dtype == torch.int32
    assert torch.stack([A, B]).format == scorch.formats.preset("csc", 3)
    assert torch.concat([B, A], 1).format == scorch.formats.coo
    check(torch.concatenate([A, y], axis=1), torch.cat([x, y], 1))


def test_cat_promotes_dtypes_and_skips_legacy_empty():
    x = sample((2, 3), dtype=torch.float32)
    y = sample((1, 3), dtype=torch.float64, seed=3)
    A = scorch.as_sparse(x, "csr")
    check(torch.cat([A, y]), torch.cat([x, y]))
    check(torch.cat([A, torch.zeros(0)]), torch.cat([x, torch.zeros(0)]))
    z = sample((2, 3), dtype=torch.int32)
    check(torch.stack([scorch.as_sparse(z, "coo"), x]), torch.stack([z, x]))


@pytest.mark.parametrize("call,exc,match", [
    (lambda A: torch.cat([A, torch.ones(2, 4)], 0), ScorchValueError,
     r"cat: tensors\[1\] has shape \(2, 4\), expected \(\*, 3\)"),
    (lambda A: torch.cat([A, torch.ones(3)], 0), ScorchValueError, r"tensors\[1\] has shape \(3,\)"),
    (lambda A: torch.cat([A, A], 2), IndexError, "cat: dim=2 is out of range for a 2-d tensor"),
    (lambda A: torch.cat([A, torch.tensor(1.0)]), ScorchValueError, r"tensors\[1\] is 0-d"),
    (lambda A: torch.cat([A], out=torch.empty(2, 3, dtype=torch.int64)), ValueError, "out= has dtype"),
    (lambda A: torch.stack([A, torch.ones(3, 2)]), ScorchValueError,
     r"stack: tensors\[1\] has shape \(3, 2\), expected \(2, 3\)"),
    (lambda A: torch.stack([A, A], 3), IndexError, "stack: dim=3 is out of range for a 3-d tensor"),
])
def test_cat_stack_errors(call, exc, match):
    A = scorch.as_sparse(sample((2, 3)), "csr")
    with pytest.raises(exc, match=match):
        call(A)


def test_dense_input_with_a_sparse_index_runs_densely():
    x = sample((3, 4))
    i = scorch.as_sparse(torch.tensor([2, 0, 1]), "coo")
    assert_dense_equal(torch.index_select(x, 0, i), x[[2, 0, 1]])
    assert_dense_equal(x[:, i], x[:, [2, 0, 1]])


def test_cat_of_nothing():
    with pytest.raises(ScorchValueError, match="non-empty"):
        shape_ops.cat([])


# ================================================================ rearrange: the parser


@pytest.mark.parametrize("pattern,lhs,rhs", [
    ("bd->bnd", "b d", "b n d"),
    ("bd -> bnd", "b d", "b n d"),
    ("b d -> b n d", "b d", "b n d"),
    ("(b n) d -> b n d", "(b n) d", "b n d"),
    ("b h w->b w h", "b h w", "b w h"),
    ("batch seq -> (seq batch)", "batch seq", "(seq batch)"),
    ("b 1 d -> b () d", "b () d", "b () d"),
])
def test_parse_pattern(pattern, lhs, rhs):
    def groups(side):
        return tuple(tuple(t.strip("()").split()) if t.startswith("(") else (t,)
                     for t in re.findall(r"\([^)]*\)|\S+", side))
    assert parse_pattern(pattern) == Pattern(groups(lhs), groups(rhs))


def test_parse_pattern_ellipsis_alone_or_in_a_group():
    assert parse_pattern("b ... -> (... b)") == Pattern((("b",), "..."), (("...", "b"),))
    assert parse_pattern("b ... -> b (...)").rhs == (("b",), ("...",))


def test_parse_pattern_compact_reads_letters_and_spaced_reads_names():
    assert parse_pattern("ij->ji") == Pattern((("i",), ("j",)), (("j",), ("i",)))
    assert parse_pattern("ij -> j i").lhs == (("ij",),)  # any space: the spaced form


@pytest.mark.parametrize("pattern,match", [
    ("b d", "must contain '->' exactly once"),
    ("a -> b -> c", "must contain '->' exactly once"),
    ("((a b)) -> a b", "nested parentheses"),
    ("a b) -> a b", r"unmatched '\)'"),
    ("(a b -> a b", r"unclosed '\('"),
    ("a a -> a", "axis 'a' appears twice"),
    ("aa->a", "axis 'a' appears twice"),
    ("a 2 -> a", "'2' is not an axis name"),
    ("a ... -> a", "'...' must be on both sides"),
    ("a ... ... -> a ...", "axis '...' appears twice"),
    ("(a ...) -> a ...", "cannot be inside a group on the left"),
])
def test_parse_pattern_errors(pattern, match):
    with pytest.raises(ScorchValueError, match=match) as err:
        parse_pattern(pattern)
    assert repr(pattern) in str(err.value)


def test_parse_pattern_rejects_non_strings():
    with pytest.raises(ScorchTypeError, match="pattern must be a str, got int"):
        parse_pattern(3)


# ================================================================ rearrange: dense tensors


def test_rearrange_seed_dispatch_broadcast():
    B, N, D = 3, 4, 5
    x = torch.randn(B, D)
    out = rearrange(x, "bd->bnd", n=N)
    assert_dense_equal(out.contiguous(), x.unsqueeze(1).expand(B, N, D).contiguous())
    assert out.shape == (B, N, D)


HANDWRITTEN = [
    ("b d -> b n d", {"n": 3}, (2, 5), lambda x: x.unsqueeze(1).expand(2, 3, 5)),
    ("(b n) d -> b n d", {"n": 2}, (6, 5), lambda x: x.reshape(3, 2, 5)),
    ("b n d -> (b n) d", {}, (2, 3, 4), lambda x: x.reshape(6, 4)),
    ("b h w -> b w h", {}, (2, 3, 4), lambda x: x.permute(0, 2, 1)),
    ("b h w -> (w b) h", {}, (2, 3, 4), lambda x: x.permute(2, 0, 1).reshape(8, 3)),
    ("b (h c) -> c b h", {"c": 2}, (2, 6), lambda x: x.reshape(2, 3, 2).permute(2, 0, 1)),
    ("b d -> n b d", {"n": 0}, (2, 3), lambda x: x.unsqueeze(0).expand(0, 2, 3)),
    ("b d -> (n b) d", {"n": 2}, (2, 3), lambda x: x.repeat(2, 1)),
    ("b d -> b (d n)", {"n": 2}, (2, 3), lambda x: x.repeat_interleave(2, 1)),
    ("ij->ji", {}, (2, 3), lambda x: x.t()),
    ("b ... -> ... b", {}, (2, 3, 4), lambda x: x.permute(1, 2, 0)),
    ("b 1 d -> b d ()", {}, (2, 1, 3), lambda x: x.reshape(2, 3, 1)),
    ("b ... -> b (...)", {}, (2, 3, 4), lambda x: x.reshape(2, 12)),
    ("(b n) d -> b n d", {"n": 2}, (0, 4), lambda x: x.reshape(0, 2, 4)),
]


@pytest.mark.parametrize("pattern,sizes,shape,expect", HANDWRITTEN, ids=[h[0] for h in HANDWRITTEN])
def test_rearrange_dense_matches_handwritten_torch(pattern, sizes, shape, expect):
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    out = rearrange(x, pattern, **sizes)
    assert type(out) is torch.Tensor
    assert_dense_equal(out.contiguous(), expect(x).contiguous())


@pytest.mark.parametrize("pattern,sizes,shape,expect", HANDWRITTEN, ids=[h[0] for h in HANDWRITTEN])
def test_rearrange_dense_matches_einops(pattern, sizes, shape, expect):
    einops = pytest.importorskip("einops")
    if "(" not in pattern and " " not in pattern:
        pattern = " -> ".join(" ".join(side.strip()) for side in pattern.split("->"))  # compact -> spaced
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    try:
        want = einops.repeat(x, pattern, **sizes) if any(k not in pattern.split("->")[0] for k in sizes) \
            else einops.rearrange(x, pattern, **sizes)
    except einops.EinopsError as e:  # e.g. an einops version without size-0 axes
        pytest.skip(f"einops rejects it: {e}")
    assert_dense_equal(rearrange(x, pattern, **sizes).contiguous(), want.contiguous())


def test_rearrange_dense_is_a_view_when_torch_can():
    x = torch.randn(2, 3, 4)
    assert rearrange(x, "b h w -> b w h")._base is x


# ================================================================ rearrange: sparse tensors


@st.composite
def rearrange_cases(draw):
    """``(A, x, pattern, sizes)``: a random split / permute / merge / new-axis pattern."""
    A, x = draw(sparse_tensors(max_dims=3))
    names = "abcd"[:x.dim()]
    lhs, axes, sizes = [], [], {}
    for a, s in zip(names, x.shape):
        if s % 2 == 0 and draw(st.booleans()):  # split the dim: (a z) with z=2
            lhs.append(f"({a} {a.upper()})")
            axes += [a, a.upper()]
            sizes[a.upper()] = 2
        else:
            lhs.append(a)
            axes.append(a)
    axes = list(draw(st.permutations(axes)))
    if draw(st.booleans()):
        axes.insert(draw(st.integers(0, len(axes))), "n")
        sizes["n"] = draw(st.integers(0, 3))
    rhs, i = [], 0
    while i < len(axes):
        k = draw(st.integers(1, len(axes) - i))
        rhs.append(axes[i] if k == 1 else f"({' '.join(axes[i:i + k])})")
        i += k
    return A, x, f"{' '.join(lhs)} -> {' '.join(rhs)}", sizes


@SETTINGS
@given(rearrange_cases())
def test_rearrange_sparse_matches_dense(case):
    A, x, pattern, sizes = case
    want = rearrange(x, pattern, **sizes).contiguous()
    check(rearrange(A, pattern, **sizes), want, A)


@pytest.mark.parametrize("pattern,sizes,shape,expect", HANDWRITTEN, ids=[h[0] for h in HANDWRITTEN])
def test_rearrange_sparse_matches_handwritten_torch(pattern, sizes, shape, expect):
    x = sample(shape, seed=5)
    for fmt in formats_for(shape):
        A = scorch.as_sparse(x, fmt)
        check(rearrange(A, pattern, **sizes), expect(x).contiguous(), A)


def test_rearrange_sparse_seed_repeats_entries_and_keeps_the_format():
    x = sample((4, 6), density=0.3)
    A = scorch.as_sparse(x, "csr", index_dtype=torch.int64)
    out = rearrange(A, "bd->bnd", n=3)
    check(out, x.unsqueeze(1).expand(4, 3, 6).contiguous(), A)
    assert out.format == scorch.formats.preset("csr", 3) and out.nnz == 3 * A.nnz


@pytest.mark.parametrize("pattern,sizes,match", [
    ("b d -> b n d", {}, "axis 'n' is only on the right.*pass its size"),
    ("b d -> b", {}, "axis 'd' of the left side is missing on the right"),
    ("b d -> b d", {"q": 2}, "size given for unknown axis 'q'"),
    ("(b n) d -> b n d", {}, "cannot infer the sizes of b, n in \\(b n\\)"),
    ("(b n) d -> b n d", {"n": 4}, "dim 0 of size 6 cannot be split as \\(b n\\)"),
    ("b d -> b d", {"d": 5}, "dim 1 has size 4, but d has size 5"),
    ("b d e -> b d e", {}, "the left side has 3 dims, the input has 2"),
    ("b d -> b n d", {"n": -1}, "size n=-1 must be a non-negative int"),
    ("b d -> (b d", {}, "unclosed"),
    ("a b c ... -> ...", {}, "the left side names 3 dims besides '...'"),
])
def test_rearrange_errors_repeat_pattern_and_shape(pattern, sizes, match):
    for x in (sample((6, 4)), scorch.as_sparse(sample((6, 4)), "csr")):
        with pytest.raises(ValueError, match=match) as err:
            rearrange(x, pattern, **sizes)
        assert repr(pattern) in str(err.value) and "(6, 4)" in str(err.value)
        assert isinstance(err.value, ScorchValueError)


# ================================================================ autograd through the values


GRAD_OPS = [
    ("reshape", lambda A: A.reshape(3, 2, 4)),
    ("flatten", lambda A: A.flatten()),
    ("unsqueeze", lambda A: A.unsqueeze(1)),
    ("getitem", lambda A: A[1:, [5, 0, 5]]),
    ("int index", lambda A: A[2, 3]),
    ("index_select", lambda A: A.index_select(1, torch.tensor([1, 1, 4]))),
    ("cat", lambda A: torch.cat([A, A[:2]], 0)),
    ("stack", lambda A: torch.stack([A, A.reshape(4, 6)], 2)),
    ("rearrange", lambda A: rearrange(A, "bd->bnd", n=2)),
]


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell", BSR], ids=str)
@pytest.mark.parametrize("name,op", GRAD_OPS, ids=[g[0] for g in GRAD_OPS])
def test_ops_are_differentiable_wrt_the_stored_values(name, op, fmt):
    P = scorch.as_sparse(sample((4, 6), seed=7), fmt)
    v = P.values().clone().requires_grad_()
    out, want = op(P.with_values(v)), op(P.to_dense())
    assert out.requires_grad
    assert_dense_equal((out.to_dense() if isinstance(out, SparseTensor) else out).detach(), want)

    def f(v):
        out = op(P.with_values(v))
        return out.to_dense() if isinstance(out, SparseTensor) else out
    assert torch.autograd.gradcheck(f, (v,))


def test_gradient_reaches_a_dense_operand_of_cat():
    A = scorch.as_sparse(sample((2, 3)), "csr")
    y = sample((2, 3), seed=1, density=1.0).requires_grad_()
    out = torch.cat([A, y], 1)
    assert out.requires_grad
    (out.to_dense() * 2).sum().backward()
    assert torch.equal(y.grad, torch.full((2, 3), 2.0, dtype=torch.float64))


def test_no_op_reshape_and_squeeze_stay_in_the_graph():
    P = scorch.as_sparse(sample((3, 4), seed=2), "csr")
    v = P.values().clone().requires_grad_()
    for op in (lambda A: A.reshape(3, 4), lambda A: A.squeeze(), lambda A: A[:]):
        out = op(P.with_values(v))
        assert out.requires_grad
        (g,) = torch.autograd.grad(out.values().sum(), v)
        assert torch.equal(g, torch.ones_like(v))


@pytest.mark.parametrize("k", [-2, 0, 1])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_tril_triu_keep_the_format_and_the_gradient(k, fmt):
    """tril / triu keep the entries on the chosen side of the k-th diagonal (batched over leading
    dims), in the input's format, differentiable; oracle: dense tril / triu and gradcheck."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, dtype=torch.float64, generator=g) * (torch.rand(5, 6, generator=g) < 0.6)
    A = scorch.as_sparse(x, fmt)
    for op in (torch.tril, torch.triu):
        got = op(A, k)
        assert isinstance(got, scorch.SparseTensor) and got.format == A.format
        assert torch.equal(got.to_dense(), op(x, k))
        v = A.values().clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda v: (op(A.with_values(v), k).to_dense() * (1 + torch.arange(30.0, dtype=torch.float64).view(5, 6))).sum(), (v,))
    B = scorch.as_sparse(torch.stack([x, 2 * x]), "csf")
    assert torch.equal(B.triu(k).to_dense(), torch.stack([x, 2 * x]).triu(k))
    with pytest.raises(ValueError, match="tril: expects at least 2 dims, got 1-d"):
        torch.tril(scorch.as_sparse(x[0], "coo"))


MOVES = {
    "flip 0": lambda t: t.flip(0), "flip 1,-1": lambda t: torch.flip(t, (1, -1)), "roll flat": lambda t: t.roll(3),
    "roll flat negative": lambda t: torch.roll(t, -7), "roll dims": lambda t: t.roll((1, -2), (0, 2)),
    "roll one dim": lambda t: torch.roll(t, 2, 1),
}


@pytest.mark.parametrize("name", list(MOVES))
@pytest.mark.parametrize("fmt", ["csf", "coo"])
def test_flip_and_roll_move_coordinates(name, fmt):
    """flip / roll move the stored entries' coordinates (sparse, same format, differentiable);
    oracle: the op on the dense tensor, and its gradient at the stored entries."""
    import warnings
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 6, dtype=torch.float64, generator=g) * (torch.rand(4, 5, 6, generator=g) < 0.3)
    A = scorch.as_sparse(x, fmt).requires_grad_()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        got = MOVES[name](A)
    assert isinstance(got, scorch.SparseTensor) and got.format == A.format and got.nnz == A.nnz
    xd = x.clone().requires_grad_()
    want = MOVES[name](xd)
    assert torch.equal(got.to_dense(), want)
    w = torch.arange(120, dtype=torch.float64).view(4, 5, 6)
    (ga,), (gd,) = torch.autograd.grad((got.to_dense() * w).sum(), A), torch.autograd.grad((want * w).sum(), xd)
    torch.testing.assert_close(ga.to_dense(), gd * (x != 0))


def test_flip_roll_errors():
    A = scorch.as_sparse(torch.eye(3), "csr")
    with pytest.raises(ValueError, match="flip: dims .* repeat"):
        A.flip((0, -2))
    with pytest.raises(ValueError, match="roll: shifts .* and dims .* differ in length"):
        A.roll((1, 2), 0)


PIECES = {
    "unbind 0": lambda t: torch.unbind(t, 0), "unbind 1": lambda t: t.unbind(1), "split 2": lambda t: torch.split(t, 2, 1),
    "split sections": lambda t: t.split([1, 4], 0), "chunk 4 of 6": lambda t: torch.chunk(t, 4, 1),
    "chunk 3": lambda t: t.chunk(3, 0),
}


@pytest.mark.parametrize("name", list(PIECES))
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_unbind_split_chunk_give_sparse_pieces(name, fmt):
    """Pieces along a dim without the dense fallback, as many and as large as torch's (oracle:
    the same call on the dense tensor)."""
    import warnings
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, dtype=torch.float64, generator=g) * (torch.rand(5, 6, generator=g) < 0.5)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no sparse implementation.*")
        got = PIECES[name](scorch.as_sparse(x, fmt))
    want = PIECES[name](x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert isinstance(a, scorch.SparseTensor) and torch.equal(a.to_dense(), b)
    with pytest.raises(ValueError, match="sections .* must be non-negative and sum to dim 0's size 5"):
        scorch.as_sparse(x, fmt).split([1, 2], 0)


PADS = [(1, 2), (0, 0), (2, 0, 1, 1), (-1, 1), (1, -2, -1, 0), (0, 0, 0, 0, 3, 1)]


@pytest.mark.parametrize("pad", PADS, ids=str)
@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4)], ids=str)
def test_pad_with_zeros_stays_sparse(pad, shape):
    """F.pad with 0 moves the entries (a negative pad crops): the same tensor as F.pad of the dense
    one, in the same format; another fill value gives torch's dense result."""
    x = sample(shape)
    if len(pad) > 2 * len(shape):
        with pytest.raises(ValueError, match="pad"):
            torch.nn.functional.pad(scorch.as_sparse(x, "coo"), pad)
        return
    for fmt in formats_for(shape):
        A = scorch.as_sparse(x, fmt)
        got = torch.nn.functional.pad(A, pad)
        check(got, torch.nn.functional.pad(x, pad), A)
        assert got.format == A.format
    A = scorch.as_sparse(x, "csr")
    out = torch.nn.functional.pad(A, pad, value=1.5)   # dense by definition (no fallback warning)
    assert type(out) is torch.Tensor
    assert_dense_equal(out, torch.nn.functional.pad(x, pad, value=1.5))


@pytest.mark.parametrize("value", [1.0, 0, 0.0, -2])
@pytest.mark.parametrize("pad", [(1, 2), (2, 0, 1, 1), (-1, 1)], ids=str)
def test_constant_pad_nd_takes_its_value_positionally(pad, value):
    """torch.constant_pad_nd(input, pad, value): the third argument is the fill value (it went
    into F.pad's ``mode`` and raised a TypeError about 'mode'); a zero keeps the result sparse."""
    x = sample((4, 5))
    for fmt in ("coo", "csr"):
        A = scorch.as_sparse(x, fmt)
        want = torch.constant_pad_nd(x, pad, value)
        got = torch.constant_pad_nd(A, pad, value)
        if value == 0:
            check(got, want, A)
        else:
            assert type(got) is torch.Tensor
            assert_dense_equal(got, want)
        keyword = torch.constant_pad_nd(A, pad, value=value)
        assert_dense_equal(keyword.to_dense() if isinstance(keyword, SparseTensor) else keyword, want)
        check(torch.constant_pad_nd(A, pad=pad), torch.constant_pad_nd(x, pad), A)   # value=0 by default


def test_pad_gradient_and_errors():
    x = sample((3, 4))
    A = scorch.as_sparse(x, "csr").requires_grad_()
    w = torch.randn(5, 7, dtype=x.dtype)
    (torch.nn.functional.pad(A, (2, 1, 1, 1)) * w).sum().backward()
    assert_dense_equal(A.grad.to_dense(), w[1:4, 2:6] * (x != 0))
    with pytest.raises(ValueError, match="negative size"):
        torch.nn.functional.pad(A.detach(), (-3, -2))


SETITEM = {  # key, value: the stored entries the key selects take the value; 0 may land anywhere
    "point stored": ((0, 0), 7.0), "point absent, 0": ((0, 1), 0.0), "negative point": ((-1, -1), 8.0),
    "bool mask on stored": ("mask", -1.5), "row to 0": (0, 0.0), "column, tensor": ((slice(None), 2), "column"),
    "index lists": (([0, 2], [0, 3]), "pair"), "everything to 0": ((Ellipsis,), 0.0),
}


@pytest.mark.parametrize("name", list(SETITEM))
def test_setitem_updates_stored_entries(name):
    """``A[key] = value`` writes the selected stored entries (it wrote into a temporary and was
    lost); zeros may land on absent positions; oracle: the same assignment on the dense tensor."""
    x = torch.tensor([[1.0, 0, 2, 0], [0, 3, 0, 0], [4, 0, 5, 6]], dtype=torch.float64)
    key, value = SETITEM[name]
    if key == "mask":
        key = x > 0
    value = {"column": torch.tensor([9.0, 0.0, 8.0], dtype=x.dtype),
             "pair": torch.tensor([-2.0, 6.5], dtype=x.dtype)}.get(value, value) if isinstance(value, str) else value
    for fmt in ("csr", "coo", "csc", "ell", "csf", scorch.formats.bsr(3, 2)):
        A, y = scorch.as_sparse(x, fmt), x.clone()
        nnz = A.nnz
        A[key] = value
        y[key] = value
        check(A, y)
        assert A.nnz == nnz   # the pattern is kept (a zero written stays stored)


def test_setitem_grows_the_pattern_and_refuses_to_bypass_autograd():
    """A nonzero written where nothing is stored joins the pattern (a point, a column, a row of
    NaNs), the format and index width kept; oracle: the same assignments on the dense tensor."""
    x = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    A, y = scorch.as_sparse(x, "csr"), x.clone()
    A[0, 1] = 5.0
    y[0, 1] = 5.0
    check(A, y)
    A[:, 1] = torch.tensor([1.0, 0.0], dtype=x.dtype)   # a stored position may take 0: it stays stored
    y[:, 1] = torch.tensor([1.0, 0.0], dtype=x.dtype)
    check(A, y)
    assert A.nnz == 4 and A.format == scorch.formats.csr and A.index_dtype == torch.int32
    A[1] = float("nan")
    y[1] = float("nan")
    torch.testing.assert_close(A.to_dense(), y, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(IndexError):
        A[2, 0] = 1.0
    assert A.nnz == 6
    B = scorch.as_sparse(x, "csr").requires_grad_()
    with pytest.raises(NotSupportedError, match="requires grad"):
        B[0, 0] = 1.0
    with torch.no_grad():
        B[0, 0] = 4.0   # a parameter update
    assert B.detach().to_dense()[0, 0] == 4.0
    w = torch.tensor(2.0, dtype=x.dtype, requires_grad=True)   # a value autograd would lose: refused
    with pytest.raises(NotSupportedError, match="or a value that does"):
        A[0, 0] = w
    with pytest.raises(NotSupportedError, match="or a value that does"):
        A.index_put_((torch.tensor([0]), torch.tensor([1])), w)


def test_setitem_after_saving_for_backward_is_detected():
    """The write bumps the tensor's version: autograd sees that a saved tensor changed."""
    x = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    w = torch.ones(3, 2, dtype=x.dtype, requires_grad=True)
    A = scorch.as_sparse(x, "csr")
    out = (A @ w).sum()
    A[0, 0] = 5.0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (3, 3, 3)], ids=str)
def test_fill_diagonal_(shape, wrap):
    """fill_diagonal_ writes the diagonal (it wrote into a copy: lost), absent positions joining the
    pattern; oracle: the dense fill_diagonal_."""
    x = sample(shape, density=0.6) + 0.0
    for d in range(min(shape)):
        x[(d,) * len(shape)] = 1.0 + d   # a stored diagonal
    for fmt in ("csr", "coo", "csf", "ell"):
        if fmt in ("csr", "ell") and len(shape) > 2:
            continue
        A, y = scorch.as_sparse(x, fmt), x.clone()
        y.fill_diagonal_(-4.0, wrap=wrap)
        assert A.fill_diagonal_(-4.0, wrap=wrap) is A   # (the wrapped diagonal may reach absent positions)
        check(A, y)
    E = scorch.as_sparse(torch.zeros(shape, dtype=torch.float64), "coo")
    E.fill_diagonal_(0.0)   # zeros land anywhere, stored nowhere
    assert E.nnz == 0
    E.fill_diagonal_(1.0)
    assert E.nnz == min(shape)
    check(E, torch.zeros(shape, dtype=torch.float64).fill_diagonal_(1.0))


def test_in_place_triangles_and_copy_of_a_number():
    x = sample((4, 5), density=0.7)
    for fmt in ("csr", "coo", "ell"):
        A, y = scorch.as_sparse(x, fmt), x.clone()
        assert A.tril_(1) is A and A.triu_(-1) is A
        check(A, y.tril_(1).triu_(-1))
        assert A.nnz == int((y != 0).sum())   # the removed entries left the pattern
        A.copy_(0.0)
        check(A, torch.zeros_like(x))
        A.copy_(2.5)   # a number fills every position
        check(A, torch.full_like(x, 2.5))
    B = scorch.as_sparse(x, "csr").requires_grad_()
    with pytest.raises(NotSupportedError, match="autograd"):
        B.tril_()


@pytest.mark.parametrize("dim,index,value", [(0, [0, 2], 0.0), (1, [1], 0.0), (1, [0, 3], 2.5), (-1, [], 7.0)])
def test_index_fill(dim, index, value):
    """index_fill_ writes through setitem (it raised), the filled positions joining the pattern;
    index_fill does the same on a copy; oracle: the dense ops."""
    x = torch.tensor([[1.0, 0, 2, 4], [0, 3, 0, 5], [6, 7, 8, 9]], dtype=torch.float64)
    idx = torch.tensor(index, dtype=torch.int64)
    want = x.index_fill(dim, idx, value)
    A = scorch.as_sparse(x, "csr")
    got = A.index_fill(dim, idx, value)
    assert isinstance(got, SparseTensor)
    torch.testing.assert_close(got.to_dense(), want, rtol=0, atol=0)
    check(A, x)   # the copy was written
    B = A.clone()
    assert B.index_fill_(dim, idx, value) is B
    check(B, want)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    """index_put_ writes (or adds) through setitem, repeated indices as torch treats them; a write
    to an absent position adds it to the pattern, in place or (index_put) in a copy."""
    x = torch.tensor([[1.0, 0, 2], [0, 3, 0]], dtype=torch.float64)
    rows, cols = torch.tensor([0, 1, 0]), torch.tensor([0, 1, 0])
    v = torch.tensor([5.0, 6.0, 7.0], dtype=torch.float64)
    A, y = scorch.as_sparse(x, "coo"), x.clone()
    assert A.index_put_((rows, cols), v, accumulate=accumulate) is A
    check(A, y.index_put_((rows, cols), v, accumulate=accumulate))
    key, four = (torch.tensor([1]), torch.tensor([2])), torch.tensor(4.0, dtype=x.dtype)
    got = A.index_put(key, four, accumulate=accumulate)
    assert isinstance(got, SparseTensor) and got.nnz == A.nnz + 1
    assert_dense_equal(got.to_dense(), y.index_put(key, four, accumulate=accumulate))
    assert A.index_put_(key, four, accumulate=accumulate) is A
    check(A, y.index_put_(key, four, accumulate=accumulate))


@st.composite
def setitem_keys(draw, shape):
    """A key torch takes for ``shape``: ints, slices, index lists, a bool mask, Ellipsis."""
    kind = draw(st.sampled_from(["point", "slices", "list", "mask", "ellipsis"]))
    if kind == "mask" or any(s == 0 for s in shape):
        return torch.rand(shape, generator=torch.Generator().manual_seed(draw(seeds))) < 0.4
    if kind == "point":
        return tuple(draw(st.integers(-s, s - 1)) for s in shape)
    if kind == "ellipsis":
        return (Ellipsis, draw(st.integers(0, shape[-1] - 1)))
    if kind == "list":
        return [draw(st.integers(0, shape[0] - 1)) for _ in range(draw(st.integers(1, 3)))]
    return tuple(slice(draw(st.integers(0, s)), None, draw(st.integers(1, 2))) for s in shape)


@SETTINGS
@given(data=st.data())
def test_setitem_property(data):
    """Any key, a number or a tensor value: the SparseTensor equals the dense tensor after the
    same assignment; it stores what it stored and the nonzeros written where it did not."""
    A, x = data.draw(sparse_tensors())
    key = data.draw(setitem_keys(tuple(x.shape)))
    y = x.clone()
    selected_shape = y[key].shape
    if data.draw(st.booleans()):
        value = data.draw(st.sampled_from([0, 2, -3]))
    else:
        value = make_dense(selected_shape, data.draw(densities), data.draw(seeds), x.dtype)
    y[key] = value
    stored = A._like(values=torch.ones(A._vals.shape), nnz=A._stored).to_dense() != 0
    fmt = A.format
    A[key] = value
    assert_dense_equal(A.to_dense(), y)
    held = stored | ((y != 0) | y.isnan())
    if fmt.block:   # a blocked format stores whole blocks around what it holds
        bh, bw = fmt.block
        blocks = held.reshape(held.shape[0] // bh, bh, held.shape[1] // bw, bw).any(3).any(1)
        held = blocks.repeat_interleave(bh, 0).repeat_interleave(bw, 1)
    assert A.format == fmt and A.nnz == int(held.sum())


def test_setitem_of_rows_columns_blocks_needs_no_dense_copy():
    """Ints and slices are matched against the coordinates: a 1e6 x 1e6 matrix (4 TB dense,
    beyond the dense-copy limit) gets a row, a column and a block zeroed, then a row of ones (a
    million new entries); a whole matrix of them is refused by the dense-copy limit."""
    n = 10**6
    idx = torch.tensor([[5, 5, 7, 12, 999_999], [3, 7, 7, 40, 7]])
    A = scorch.from_coo(idx, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), (n, n), format="csr")
    A[5] = 0.0
    A[:, 7] = 0
    A[10:20, ...] = 0.0
    assert A.values().tolist() == [0.0, 0.0, 0.0, 0.0, 0.0] and A.nnz == 5
    A[999_999, :] = 1.0
    assert A.nnz == 5 + n - 1 and float(A.values().sum()) == n   # (999_999, 7) was stored: a 0 before
    with pytest.raises(NotSupportedError, match="would add them to its pattern, over"):
        A[:, :] = 2.0


def test_scatters_and_index_add_on_a_sparse_self_and_sparse_masks_as_keys(monkeypatch):
    """Out of place, scatter / scatter_add / scatter_reduce / index_add of a SparseTensor ``self``
    compute on its dense copy (they raised, though nothing is written into ``self``); in place,
    the changed positions join its pattern; a sparse bool mask indexes and assigns as a dense one
    (``A[A > 0]``).  Oracle: the same calls on the dense tensor."""
    x = torch.tensor([[0.0, 2, 0], [-1, 0, 3]], dtype=torch.float64)
    idx, src = torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.ones(2, 3, dtype=x.dtype)
    ops = {"scatter": lambda t: t.scatter(1, idx, src), "scatter_add": lambda t: torch.scatter_add(t, 1, idx, src),
           "scatter_reduce": lambda t: t.scatter_reduce(1, idx, src, "amax"),
           "index_add": lambda t: t.index_add(0, torch.tensor([1]), src[:1], alpha=2),
           "scatter_": lambda t: t.scatter_(1, idx[:, :1], 5.0), "scatter_add_": lambda t: t.scatter_add_(1, idx, src),
           "scatter_reduce_": lambda t: t.scatter_reduce_(1, idx, src, "sum", include_self=False),
           "index_add_": lambda t: t.index_add_(1, torch.tensor([0, 0]), torch.ones(2, 2, dtype=x.dtype))}
    monkeypatch.setattr(scorch.config, "dense_fallback", "silent")   # (this module raises on it)
    for name, op in ops.items():
        A = scorch.as_sparse(x, "csr")
        got, want = op(A), op(x.clone())
        if name.endswith("_"):
            assert got is A and A.format == scorch.formats.csr
            check(A, want)
        else:
            assert_dense_equal(got, want)
            check(A, x)
    A = scorch.as_sparse(x, "coo")
    assert_dense_equal(A[A > 0], x[x > 0])
    assert_dense_equal(A[:, scorch.as_sparse(x[0] != 0, "coo")].to_dense(), x[:, x[0] != 0])
    A[A < 0] = 7.0
    y = x.clone()
    y[y < 0] = 7.0
    check(A, y)


@pytest.mark.parametrize("fmt", ["csf", "coo"])
def test_init_through_a_view_of_another_shape_reaches_the_weight(fmt, monkeypatch):
    # nn.init.orthogonal_ fills a conv weight through w.view_as(q).copy_(q): the write gave the
    # view new storage and left the weight as it was
    monkeypatch.setattr(scorch.config, "dense_fallback", "silent")   # (its QR runs densely)
    torch.manual_seed(0)
    W = torch.randn(4, 3, 3, 3) * (torch.rand(4, 3, 3, 3) < 0.5)
    A, D = scorch.as_sparse(W.clone(), fmt), W.clone()
    torch.manual_seed(1)
    torch.nn.init.orthogonal_(A)
    torch.manual_seed(1)
    torch.nn.init.orthogonal_(D)
    torch.testing.assert_close(A.to_dense(), D)
    B = scorch.as_sparse(W.clone(), fmt)
    B.view(4, 27).copy_(torch.ones(4, 27))
    assert torch.equal(B.to_dense(), torch.ones(4, 3, 3, 3))


def test_writes_into_a_view_that_is_a_copy_are_refused():
    # a CSC matrix's entries are column-major: its 1-d view is a copy, and a write into it was lost
    M = torch.tensor([[1., 0, 2], [0, 3, 0]])
    B = scorch.as_sparse(M, "csc")
    V = B.view(-1)
    torch.testing.assert_close(V.to_dense(), M.view(-1))   # reading it is fine
    for write in (lambda v: v.mul_(2), lambda v: v.__setitem__(0, 5.), lambda v: v.copy_(torch.ones(6))):
        with pytest.raises(scorch.NotSupportedError, match="is a copy, not a view"):
            write(V)
    assert torch.equal(B.to_dense(), M)
    R = scorch.as_sparse(M, "csr").view(-1)   # row-major storage: a view, whose writes reach the tensor
    R.mul_(2)
    C = scorch.as_sparse(torch.tensor([[1 + 1j, 0], [0, 2 - 1j]]), "csr")
    for write in (lambda r: r.__setitem__((0, 0), 5.), lambda r: r.index_put_((torch.tensor([0]),) * 2, torch.tensor(7.))):
        with pytest.raises(scorch.NotSupportedError, match="is a copy, not a view"):
            write(C.real)


@pytest.mark.parametrize("shape", [(7, 5), (1, 3), (0, 4), (5, 0)])
def test_rows_of_a_csr_read_off_its_row_starts(shape):
    # A[i] / select / unbind read every stored entry per row: for row in A was quadratic
    torch.manual_seed(0)
    x = torch.randn(shape) * (torch.rand(shape) < 0.4)
    A = scorch.as_sparse(x, "csr")
    for k in (0, -1, 2, slice(1, 4), slice(None), slice(3, 1), (1, slice(None)), (None, 1), (slice(0, 3), 2), (-2,),
              slice(2, None, 2), 9, -9):
        try:
            want = x[k]
        except IndexError:
            with pytest.raises(IndexError):
                A[k]
            continue
        got = A[k]
        check(got, want, A) if isinstance(got, SparseTensor) else torch.testing.assert_close(got, want)
    for got, want in zip(A.unbind(0), x.unbind(0)):
        assert torch.equal(got.to_dense(), want)
    B = scorch.as_sparse(x, "csr").requires_grad_()
    if shape[0] > 2:
        B[2].to_dense().sum().backward()
        assert torch.equal(B.grad.to_dense(), torch.zeros(shape).index_fill_(0, torch.tensor([2]), 1) * (x != 0))


@pytest.mark.parametrize("fmt", ["csc", "ell"])
def test_view_as_and_unflatten_copies_refuse_writes(fmt):
    x = torch.tensor([[1., 0, 2], [0, 3, 0]])
    A = scorch.as_sparse(x, fmt)
    for make in (lambda a: a.view_as(torch.empty(6)), lambda a: a.unflatten(1, (3, 1))):
        V = make(A)
        assert torch.equal(V.to_dense(), make(x))
        with pytest.raises(NotSupportedError, match="is a copy, not a view"):
            V.mul_(10)
    C = scorch.as_sparse(x, "csr")
    C.view_as(torch.empty(6)).mul_(10)   # row-major: a view, the write reaches C
    assert torch.equal(C.to_dense(), 10 * x)
