"""Hypothesis strategies and oracles shared by the property tests.

Dense torch tensors are the oracle: every strategy here produces a plain
strided tensor (and, where useful, a format that applies to it).
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

import scorch
from scorch import Format, Level, compressed, dense, padded, singleton

FLOAT_DTYPES = (torch.float32, torch.float64)
ALL_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32)


# ---------------------------------------------------------------- dense tensors

def make_dense(shape, density: float, seed: int, dtype=torch.float64) -> torch.Tensor:
    """A random tensor of ``shape`` whose entries are nonzero with probability ``density``
    (density 1 gives a tensor without zeros, density 0 the zero tensor)."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    if dtype.is_floating_point:
        vals = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        vals[vals == 0] = 1  # e.g. tiny values that underflow in float16
    else:
        mag = torch.randint(1, 50, shape, generator=g)
        sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
        vals = (mag * sign).to(dtype)
    keep = torch.rand(shape, generator=g) < density
    return torch.where(keep, vals, torch.zeros((), dtype=dtype))


densities = st.one_of(st.sampled_from([0.0, 1.0, 0.2]), st.floats(0.0, 1.0))
seeds = st.integers(0, 2**31 - 1)


def shapes(min_dims=1, max_dims=4, max_side=None):
    """Shapes with zero-size dims allowed; sides shrink as ndim grows (bounded numel)."""
    sides = {1: 12, 2: 7, 3: 5, 4: 4}

    @st.composite
    def draw_shape(draw):
        n = draw(st.integers(min_dims, max_dims))
        side = sides[n] if max_side is None else max_side
        return tuple(draw(st.lists(st.integers(0, side), min_size=n, max_size=n)))

    return draw_shape()


@st.composite
def dense_tensors(draw, min_dims=1, max_dims=4, dtypes=FLOAT_DTYPES, shape=None):
    shp = draw(shapes(min_dims, max_dims)) if shape is None else shape
    dtype = draw(st.sampled_from(dtypes))
    return make_dense(shp, draw(densities), draw(seeds), dtype)


def divisors_or_small(n: int):
    """Block sizes that divide ``n`` (any small size divides 0)."""
    if n == 0:
        return [1, 2, 3]
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def blocked_matrices(draw, dtypes=FLOAT_DTYPES, max_blocks=4, max_block=3):
    """``(x, (bh, bw))``: a 2-d tensor whose shape the block size divides."""
    bh, bw = draw(st.integers(1, max_block)), draw(st.integers(1, max_block))
    mb, nb = draw(st.integers(0, max_blocks)), draw(st.integers(0, max_blocks))
    dtype = draw(st.sampled_from(dtypes))
    x = make_dense((mb * bh, nb * bw), draw(densities), draw(seeds), dtype)
    if draw(st.booleans()):  # make some blocks entirely zero
        keep = make_dense((mb, nb), draw(densities), draw(seeds)) != 0
        x = x * keep.repeat_interleave(bh, 0).repeat_interleave(bw, 1).to(x.dtype)
    return x, (bh, bw)


@st.composite
def matrices_with_block(draw, dtypes=FLOAT_DTYPES):
    """A 2-d tensor and a block size dividing its shape (from its divisors)."""
    x = draw(dense_tensors(2, 2, dtypes))
    bh = draw(st.sampled_from(divisors_or_small(x.shape[0])))
    bw = draw(st.sampled_from(divisors_or_small(x.shape[1])))
    return x, (bh, bw)


# ---------------------------------------------------------------- formats

def preset_names(ndim: int) -> list[str]:
    names = ["dense", "coo", "csr", "dcsr", "csf", "ell"]
    if ndim >= 2:
        names += ["csc", "dcsc"]
    return names


def user_formats(ndim: int) -> list[Format]:
    """Hand-written user-defined formats (not presets) for ``ndim``-d tensors."""
    if ndim == 1:
        return [Format([padded]), Format([compressed(ordered=False)])]
    if ndim == 2:
        return [
            Format([dense, compressed], order=(1, 0)),                      # == csc
            Format([compressed, dense]),                                    # dense rows
            Format([compressed(unique=False), singleton], order=(1, 0)),    # column-major COO
            Format([dense, padded], order=(1, 0)),                          # ELL by columns
            Format([dense, dense], order=(1, 0)),                           # column-major dense
            Format([compressed, padded]),
            Format([padded, compressed], order=(1, 0)),
        ]
    if ndim == 3:
        return [
            Format([dense, compressed, dense], order=(2, 0, 1)),
            Format([compressed, dense, compressed], order=(1, 2, 0)),
            Format([compressed(unique=False), singleton(unique=False), singleton], order=(2, 0, 1)),
            Format([dense, dense, padded], order=(1, 2, 0)),
            Format([padded, dense, dense]),
            Format([compressed, compressed(unique=False), singleton], order=(0, 2, 1)),
        ]
    return [
        Format([dense, compressed, dense, compressed], order=(3, 1, 0, 2)),
        Format([compressed(unique=False), singleton(unique=False), singleton(unique=False), singleton]),
        Format([dense, dense, dense, padded], order=(0, 1, 3, 2)),
    ]


def block_formats(shape, block) -> list[Format]:
    if len(shape) != 2 or block is None:
        return []
    bh, bw = block
    return [scorch.formats.bsr(bh, bw), scorch.formats.bsc(bh, bw)]


def all_formats(shape, block=None) -> list:
    """Every preset name, the hand-written user formats and (2-d, given a dividing
    block size) bsr/bsc, for a tensor of ``shape``."""
    n = len(shape)
    return preset_names(n) + user_formats(n) + block_formats(shape, block)


@st.composite
def level_formats(draw, nlevels: int, block=None):
    """A random valid Format with ``nlevels`` levels: dense / compressed / padded levels
    (ordered or not) and nonunique-compressed + singleton chains, any mode order."""
    levels: list[Level] = []
    while len(levels) < nlevels:
        remaining = nlevels - len(levels)
        kinds = ["dense", "compressed", "padded"] + (["chain"] if remaining >= 2 else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "chain":
            length = draw(st.integers(2, remaining))
            levels.append(compressed(unique=False, ordered=draw(st.booleans())))
            levels += [singleton(unique=False)] * (length - 2) + [singleton]
        elif kind == "dense":
            levels.append(dense)
        else:
            levels.append(Level(kind, ordered=draw(st.booleans())))
    order = tuple(draw(st.permutations(range(nlevels))))
    return Format(levels, order, block)


@st.composite
def tensor_and_random_format(draw, max_dims=4, dtypes=FLOAT_DTYPES, blocked=None):
    """``(x, fmt)``: a dense tensor and a random (possibly blocked) Format for it."""
    if blocked is None:
        blocked = draw(st.booleans())
    if blocked:
        n = draw(st.integers(1, min(max_dims, 3)))
        block = tuple(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
        nblocks = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        shape = tuple(b * m for b, m in zip(block, nblocks))
        fmt = draw(level_formats(2 * n, block))
    else:
        shape = draw(shapes(1, max_dims))
        fmt = draw(level_formats(len(shape)))
    x = make_dense(shape, draw(densities), draw(seeds), draw(st.sampled_from(dtypes)))
    return x, fmt


# ---------------------------------------------------------------- oracles

def expected_nnz(fmt: Format, x: torch.Tensor) -> int:
    """Stored entries of ``x`` in ``fmt`` built from the dense tensor: every position of
    the levels below the last non-dense level, under each distinct nonzero prefix."""
    sizes = fmt.level_sizes(x.shape)
    last = max((k for k, lv in enumerate(fmt.levels) if lv.kind != "dense"), default=-1)
    below = math.prod(sizes[last + 1:])
    if last < 0:
        return below  # all dense: every position is stored
    coords = x.nonzero().t()
    if fmt.block:
        b = torch.tensor(fmt.block).unsqueeze(1)
        coords = torch.cat([coords // b, coords % b])
    prefix = coords[list(fmt.order)][: last + 1]
    distinct = torch.unique(prefix, dim=1).shape[1] if prefix.shape[1] else 0
    return distinct * below


def assert_dense_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality of two strided tensors: type, layout, dtype, shape, values."""
    assert type(actual) is torch.Tensor, type(actual)
    assert actual.layout == torch.strided, actual.layout
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.equal(actual, expected), (actual, expected)


def assert_dense_equal_nan(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact equality where NaN equals NaN."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    an, en = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(an, en), (actual, expected)
    zero = torch.zeros((), dtype=actual.dtype)
    assert torch.equal(torch.where(an, zero, actual), torch.where(en, zero, expected)), (actual, expected)


def fmt_id(f) -> str:
    return f if isinstance(f, str) else str(f)
