"""Level formats: what a sparse format *is*.

A format is one level per stored dimension, a mode order saying which tensor
dimension each level stores, and optionally a block split (TACO's format
abstraction, Chou et al. OOPSLA'18).  Named formats (csr, coo, bsr, ...) are
only presets built from these pieces; a user-defined format is a new
combination, never new code.  This module owns the level kinds and their
capabilities; the storage lives in :mod:`scorch.tensor`, the conversions in
:mod:`scorch.convert`.

Level kinds (each maps a parent position ``p`` to child positions):

=========== ================= ==========================================
kind        storage           children of ``p``
=========== ================= ==========================================
dense       none (size N)     ``p*N .. p*N+N-1``, coordinate = offset
compressed  ``pos``, ``crd``  ``pos[p] .. pos[p+1]-1``, coordinate ``crd[q]``
singleton   ``crd``           exactly ``p``, coordinate ``crd[p]``
padded      ``crd``           ``p*K .. p*K+K-1`` (K slots, ELL); an unused
                              slot holds coordinate -1 and value 0
=========== ================= ==========================================

Blocked formats: with ``block=(b0, .., b{n-1})`` an n-d tensor of shape
``(s0, .., s{n-1})`` is stored as the 2n-d tensor of shape
``(s0/b0, .., s{n-1}/b{n-1}, b0, .., b{n-1})`` (block coordinates, then the
coordinates inside a block), and ``levels``/``order`` describe that 2n-d
tensor.  BSR is ``[dense, compressed, dense, dense]`` with ``block=(bh, bw)``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

from .errors import ScorchTypeError, ScorchValueError

__all__ = ["Level", "Format", "dense", "compressed", "singleton", "padded", "resolve"]

_KINDS = ("dense", "compressed", "singleton", "padded")


def _ints(name: str, values) -> tuple:
    """``values`` as a tuple of ints (bools and floats refused: ``order=(0.5, 1)`` is no order)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ScorchTypeError(f"Format: {name} must be a sequence of ints, got {values!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ScorchTypeError(f"Format: {name} must hold ints, got {tuple(values)!r}")
    return tuple(int(v) for v in values)


@dataclass(frozen=True)
class Level:
    """One level of a format.

    ``ordered``: coordinates of one parent's children are sorted.
    ``unique``: no coordinate repeats among one parent's children.
    """

    kind: str
    ordered: bool = True
    unique: bool = True

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ScorchValueError(f"Level: kind must be one of {_KINDS}, got {self.kind!r}")
        for flag in ("ordered", "unique"):
            if not isinstance(getattr(self, flag), bool):
                raise ScorchTypeError(f"Level: {flag} must be True or False, got {getattr(self, flag)!r}")
        if self.kind == "dense" and not (self.ordered and self.unique):
            raise ScorchValueError("Level: a dense level is always ordered and unique")
        if self.kind == "padded" and not self.unique:
            raise ScorchValueError("Level: a padded level is always unique (use compressed(unique=False) for COO)")

    # Capabilities: the code generator asks these, never "is this CSR?".
    @property
    def full(self) -> bool:
        """Every coordinate of the dimension is present (dense)."""
        return self.kind == "dense"

    @property
    def has_pos(self) -> bool:
        return self.kind == "compressed"

    @property
    def has_crd(self) -> bool:
        return self.kind in ("compressed", "singleton", "padded")

    @property
    def can_locate(self) -> bool:
        """Coordinate -> position in O(1)."""
        return self.kind == "dense"

    @property
    def may_pad(self) -> bool:
        """Some positions are unused slots (coordinate -1)."""
        return self.kind == "padded"

    def __call__(self, *, ordered: bool = True, unique: bool = True) -> "Level":
        """``compressed(unique=False)``: the same kind with other properties."""
        return Level(self.kind, ordered, unique)

    def __repr__(self) -> str:
        flags = [f for f, on in (("unordered", not self.ordered), ("nonunique", not self.unique)) if on]
        return self.kind + (f"({','.join(flags)})" if flags else "")


dense = Level("dense")
compressed = Level("compressed")
singleton = Level("singleton")
padded = Level("padded")


MAX_DIMS = 26                        # one einsum letter per dim (scorch's own equations: a-z)
_KEYS: dict = {}                     # (levels, order, block) -> the format's cache key
_KEY_COUNTER = itertools.count()     # next() is atomic: two formats never share a key


@dataclass(frozen=True)
class Format:
    """A storage format: ``levels`` (outer to inner), the mode ``order``
    (level k stores dimension ``order[k]``) and an optional ``block`` split.

    >>> import scorch
    >>> csc = scorch.Format([scorch.dense, scorch.compressed], order=(1, 0))
    >>> csc == scorch.formats.csc
    True
    """

    levels: tuple
    order: tuple = None  # type: ignore[assignment]
    block: tuple | None = None

    def __post_init__(self):
        levels = self.levels
        if isinstance(levels, Level):
            levels = (levels,)
        if not isinstance(levels, Sequence) or isinstance(levels, str):
            raise ScorchTypeError(f"Format: levels must be a sequence of Level, got {type(levels).__name__}")
        levels = tuple(levels)
        if not levels:
            raise ScorchValueError("Format: levels must not be empty (0-d tensors cannot be sparse)")
        for k, lv in enumerate(levels):
            if not isinstance(lv, Level):
                raise ScorchTypeError(f"Format: levels[{k}] must be a Level, got {lv!r}")
        order = tuple(range(len(levels))) if self.order is None else _ints("order", self.order)
        if sorted(order) != list(range(len(levels))):
            raise ScorchValueError(
                f"Format: order must be a permutation of 0..{len(levels) - 1}, got {tuple(self.order)}")
        block = self.block
        if block is not None:
            block = _ints("block", block)
            if 2 * len(block) != len(levels):
                raise ScorchValueError(
                    f"Format: a block split of {len(block)} dims needs {2 * len(block)} levels "
                    f"(block coordinates, then in-block coordinates), got {len(levels)}")
            if any(b < 1 for b in block):
                raise ScorchValueError(f"Format: block sizes must be positive, got {block}")
        for k, lv in enumerate(levels):
            if lv.kind == "singleton" and (k == 0 or levels[k - 1].unique):
                raise ScorchValueError(
                    f"Format: singleton level {k} must follow a nonunique level "
                    f"(e.g. compressed(unique=False)), got {levels[:k + 1]}")
            if not lv.unique and (k + 1 == len(levels) or levels[k + 1].kind != "singleton"):
                raise ScorchValueError(f"Format: nonunique level {k} must be followed by a singleton level")
        if (len(levels) // 2 if block else len(levels)) > MAX_DIMS:
            raise ScorchValueError(f"Format: a sparse tensor has at most {MAX_DIMS} dims here (the compiler names "
                                   f"each dim with a letter), got {len(levels) // 2 if block else len(levels)}")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "block", block)
        object.__setattr__(self, "_hash", hash((levels, order, block)))
        # an int standing for this format in the kernel caches' keys (equal formats, equal ints):
        # hashing a Format there took a Python __hash__ call on every kernel call
        object.__setattr__(self, "_key", _KEYS.setdefault((levels, order, block), next(_KEY_COUNTER)))

    def __hash__(self) -> int:  # cached: formats key the kernel caches on every call
        return self._hash

    @property
    def ndim(self) -> int:
        """Order of the logical tensor this format stores."""
        return len(self.levels) // 2 if self.block else len(self.levels)

    @property
    def name(self) -> str | None:
        """The preset name ('csr', 'bsr', ...) if this format is one, else None."""
        return _preset_name(self)

    def stored_shape(self, shape: Sequence[int]) -> tuple:
        """Shape of the (possibly blocked) tensor the levels describe, in dimension order."""
        shape = tuple(shape)
        if not self.block:
            return shape
        return tuple(s // b for s, b in zip(shape, self.block)) + self.block

    def level_sizes(self, shape: Sequence[int]) -> tuple:
        """Size of the dimension each level stores, outer to inner."""
        st = self.stored_shape(shape)
        return tuple(st[o] for o in self.order)

    def permuted(self, perm: Sequence[int]) -> "Format":
        """The format of this tensor's storage seen as ``x.permute(perm)`` (no data moves)."""
        perm = _ints("permuted: perm", perm)
        if sorted(perm) != list(range(self.ndim)):
            raise ScorchValueError(f"Format.permuted: perm must be a permutation of 0..{self.ndim - 1}, got {perm}")
        return _permuted(self, perm)

    def _permuted(self, perm: tuple) -> "Format":
        n = self.ndim
        inv = [0] * n
        for new, old in enumerate(perm):
            inv[old] = new
        if self.block:
            inv2 = inv + [n + i for i in inv]
            order = tuple(inv2[o] for o in self.order)
            block = tuple(self.block[p] for p in perm)
            return Format(self.levels, order, block)
        return Format(self.levels, tuple(inv[o] for o in self.order))

    def __str__(self) -> str:
        if self.name:
            return self.name
        return self._spec_text()

    def _spec_text(self) -> str:
        text = f"Format([{', '.join(map(repr, self.levels))}]"
        if self.order != tuple(range(len(self.levels))):
            text += f", order={self.order}"
        if self.block:
            text += f", block={self.block}"
        return text + ")"

    def __repr__(self) -> str:
        return f"{self._spec_text()[:-1]}, name={self.name!r})" if self.name else self._spec_text()

    # Plain-data spec, used for pickling (torch.load(weights_only=True) only rebuilds plain data).
    def to_spec(self) -> tuple:
        return (tuple((lv.kind, lv.ordered, lv.unique) for lv in self.levels), self.order, self.block)

    @staticmethod
    def from_spec(spec) -> "Format":
        levels, order, block = spec
        return Format(tuple(Level(*lv) for lv in levels), tuple(order), None if block is None else tuple(block))

    def __reduce__(self):
        # rebuilt through __init__: the cached hash and cache key belong to the process that made them
        return Format, (self.levels, self.order, self.block)


@functools.lru_cache(maxsize=1024)
def _permuted(fmt: Format, perm: tuple) -> Format:
    """:meth:`Format.permuted`, remembered (a transpose built and validated a Format each time)."""
    return fmt._permuted(perm)


# ---------------------------------------------------------------- presets

def _swap_last_two(n: int) -> tuple:
    return tuple(range(n - 2)) + (n - 1, n - 2)


def _coo(n: int) -> Format:
    if n == 1:
        return Format((compressed,))
    return Format((compressed(unique=False),) + (singleton(unique=False),) * (n - 2) + (singleton,))


def _need2(name: str, n: int) -> None:
    if n < 2:
        raise ScorchValueError(f"format {name!r} needs a tensor of at least 2 dims, got {n}-d")


def _csc(n):
    _need2("csc", n)
    return Format((dense,) * (n - 1) + (compressed,), _swap_last_two(n))


def _dcsc(n):
    _need2("dcsc", n)
    return Format((compressed,) * n, _swap_last_two(n))


# Each preset adapts to the tensor's number of dims: csr/csc keep dense outer
# (batch) levels, csf/dcsr compress every level, coo is one nonunique level
# followed by singletons.
_PRESETS = {
    "dense": lambda n: Format((dense,) * n),
    "coo": _coo,
    "csr": lambda n: Format((dense,) * (n - 1) + (compressed,)),
    "csc": _csc,
    "dcsr": lambda n: Format((compressed,) * n),
    "dcsc": _dcsc,
    "csf": lambda n: Format((compressed,) * n),
    "ell": lambda n: Format((dense,) * (n - 1) + (padded,)),
}


def bsr_format(bh: int, bw: int) -> Format:
    """Block sparse row with ``bh x bw`` dense blocks."""
    _check_block_sizes("bsr", bh, bw)
    return Format((dense, compressed, dense, dense), (0, 1, 2, 3), (int(bh), int(bw)))


def bsc_format(bh: int, bw: int) -> Format:
    """Block sparse column with ``bh x bw`` dense blocks (row-major inside a block)."""
    _check_block_sizes("bsc", bh, bw)
    return Format((dense, compressed, dense, dense), (1, 0, 2, 3), (int(bh), int(bw)))


def _check_block_sizes(name, *sizes):
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ScorchValueError(f"{name}: block sizes must be positive ints, got {sizes}")


def preset(name: str, ndim: int) -> Format:
    """The preset called ``name`` for an ``ndim``-d tensor."""
    if not isinstance(name, str):
        raise ScorchTypeError(f"format name must be a str, got {type(name).__name__}")
    if isinstance(ndim, bool) or not isinstance(ndim, int):
        raise ScorchTypeError(f"format {name!r}: ndim must be an int, got {ndim!r}")
    key = _preset_key(name)
    if ndim < 1:
        raise ScorchValueError(f"format {name!r}: a sparse tensor needs at least 1 dim, got {ndim}-d")
    return _PRESETS[key](ndim)


def _preset_key(name: str, arg: str = "") -> str:
    """``name`` as a key of the presets, or a ScorchValueError (``arg``: the argument it came as)."""
    key = name.lower()
    where = f"{arg}: " if arg else ""
    if key in ("bsr", "bsc"):
        raise ScorchValueError(f"{where}format {name!r} needs a block size: use scorch.formats.{key}(bh, bw)")
    if key not in _PRESETS:
        raise ScorchValueError(f"{where}unknown format name {name!r}; expected one of "
                               f"{sorted(_PRESETS) + ['bsr', 'bsc']} or a scorch.Format")
    return key


def check_format(fmt, *, arg: str) -> None:
    """A format argument checked before the dims of the tensor it will store are known (a name
    that adapts to them, or a Format): errors name ``arg`` at the call that took it."""
    if isinstance(fmt, str):
        _preset_key(fmt, arg)
    elif not isinstance(fmt, Format):
        raise ScorchTypeError(f"{arg} must be a format name (str) or a scorch.Format, got {type(fmt).__name__}")


@functools.lru_cache(maxsize=512)
def _preset_name(fmt: Format) -> str | None:
    if fmt.block:
        for key, make in (("bsr", bsr_format), ("bsc", bsc_format)):
            if len(fmt.block) == 2 and fmt == make(*fmt.block):
                return f"{key}{fmt.block[0]}x{fmt.block[1]}"
        return None
    # dcsr and csf are the same format; prefer the 2-d name where it applies.
    names = ("dense", "coo", "csr", "csc", "dcsr", "dcsc", "ell") if fmt.ndim == 2 else \
        ("dense", "coo", "csr", "csc", "csf", "dcsc", "ell")
    for key in names:
        try:
            if preset(key, fmt.ndim) == fmt:
                return key
        except ScorchValueError:
            continue
    return None


def resolve(fmt, ndim: int, *, arg: str | None = None) -> Format:
    """Turn a format argument (a name or a :class:`Format`) into a Format for ``ndim`` dims; errors
    name ``arg`` (the argument it came as) when given."""
    if isinstance(fmt, str):
        try:
            return preset(fmt, ndim)
        except ScorchValueError as err:   # (a name that does not fit the dims: say which argument)
            if arg is None:
                raise
            raise ScorchValueError(f"{arg}: {err}") from None
    if isinstance(fmt, Format):
        if fmt.ndim != ndim:
            raise ScorchValueError(f"{arg or 'format'}: {fmt} stores {fmt.ndim}-d tensors, got a {ndim}-d "
                                   f"tensor{_other_dims_hint(fmt, ndim)}")
        return fmt
    raise ScorchTypeError(f"{arg or 'format'} must be a format name (str) or a scorch.Format, "
                          f"got {type(fmt).__name__}")


def _other_dims_hint(fmt: Format, ndim: int) -> str:
    """How to store ``ndim`` dims in ``fmt``'s kind: an unblocked preset's name adapts to the dims; a
    blocked format's display name (``'bsr2x2'``) is no name ``resolve`` takes, so none is suggested."""
    if fmt.block:
        return (f" (a blocked format has one block size per dim: for {ndim} dims give scorch.Format(levels, order, "
                f"block) {2 * ndim} levels and {ndim} block sizes, or split with a schedule's block())")
    return f" (pass format={fmt.name!r} as a string to adapt it to {ndim} dims)" if fmt.name else ""
