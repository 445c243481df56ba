"""SparseTensor: a ``torch.Tensor`` wrapper subclass over level storage.

It owns the storage (per-level ``pos`` / ``crd`` index tensors and one flat
values tensor, all plain torch tensors), the tensor-level methods (metadata,
conversions, dtype moves, transposes as mode-order changes) and the hooks
that route torch calls to scorch: ``__torch_function__`` consults one
dispatch table (:mod:`scorch._dispatch`); whatever reaches
``__torch_dispatch__`` unhandled runs densely there.

The wrapper itself has no data: ``isinstance(A, torch.Tensor)`` holds, and its
shape, dtype, device and ``requires_grad`` are those of the sparse tensor.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import threading

import torch
import torch.autograd.forward_ad as _FORWARD_AD

from . import convert
from .errors import NotSupportedError, ScorchIndexError, ScorchTypeError, ScorchValueError
from .format import Format, bsr_format, preset, resolve

__all__ = ["SparseTensor"]

_VERSION = 1  # of the pickled form
_COO2, _CSR2 = preset("coo", 2), preset("csr", 2)
_CSX2 = (_CSR2, preset("csc", 2))
_DCSX2 = (preset("dcsr", 2), preset("dcsc", 2))
_PLAIN2 = _CSX2 + _DCSX2 + (_COO2,)  # converted among each other without sorting (_via_csr)
_ELL2 = preset("ell", 2)


_KERNEL_DENSE_MIN = 4096    # stored entries from which to_dense runs a generated kernel
_DENSE_BY_KERNEL: dict = {}  # SparseTensor._sig -> does the copy kernel's schedule split rows (None: seen once)
_FIRST = object()
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class SparseTensor(torch.Tensor):
    """A sparse tensor in any level format.  Build one with :func:`scorch.as_sparse`,
    :func:`scorch.from_coo` or :meth:`SparseTensor.from_levels` (all validate their
    input); the raw constructor is internal and trusts its arrays.  Its index arrays are not
    changed in place (kernels read them unchecked): ``pos()`` / ``crd()`` / ``crow_indices()``...
    give copies; arrays a tensor was built from without a copy (``from_levels``, a torch.sparse
    tensor taken as is, ``with_values``) must not be resized or rewritten afterwards.

    ``values()`` is the stored values array, one entry per position of the
    innermost level: for BSR that includes the zeros inside stored blocks, for
    ELL the zeros of unused slots.  ``nnz`` counts stored entries, not padding.
    """

    _format: Format
    _pos: tuple
    _crd: tuple
    _vals: torch.Tensor
    # flags most tensors leave unset, read on every in-place write (a class default: no __getattr__ call)
    _grad_view = False   # values shared with a tensor that requires grad: writes refused in grad mode
    _source = None        # the leaf whose storage this tensor shares (x.data, x.detach(), a view: _alias_of)
    _source_back = None   # (new storage, _source) -> the source's: a view of another shape / dtype
    _copy_note = None    # "x.real of ... is a copy, not a view (...)": writes into it refused (check_write)

    @staticmethod
    def __new__(cls, fmt: Format, shape, pos, crd, values, *, requires_grad: bool = False, nnz=None):
        shape = torch.Size(shape)
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=values.dtype, device=values.device, requires_grad=requires_grad)
        self._format = fmt
        self._shape = tuple(shape)  # plain tuple: internal code reads it without a torch-function hop
        self._set_storage(tuple(pos), tuple(crd), values, nnz)
        if requires_grad:
            self._grads_keep_pattern()
        return self

    def _grads_keep_pattern(self) -> None:
        """On a leaf that requires grad: a hook giving a gradient this tensor's pattern (the
        gradient of an op that ran on the dense tensor, e.g. ``exp``, is dense; torch's backward
        of a composite, e.g. ``diff``'s, may sum sparse gradients into a wider pattern; an
        optimizer updates the stored values in place)."""
        if getattr(self, "_pattern_hook", False) or self.grad_fn is not None:
            return
        # the hook holds a twin sharing this tensor's pattern (kept current by _set_storage), not
        # the tensor: a weak reference would stop Module.double() / .to() from swapping a
        # Parameter's contents (torch.utils.swap_tensors refuses a tensor with weakrefs)
        self._pattern_box = [self._like(nnz=self._stored)]
        self.register_hook(functools.partial(_grad_in_pattern, self._pattern_box))
        self._pattern_hook = True

    @classmethod
    def from_levels(cls, format, shape, pos, crd, values) -> "SparseTensor":
        """A SparseTensor from level storage, validated: ``pos`` / ``crd`` give one entry per
        level (None where the level kind has no such array), ``values`` one per position of
        the innermost level.

        >>> import torch, scorch
        >>> A = scorch.SparseTensor.from_levels("csr", (2, 3), [None, torch.tensor([0, 1, 2])],
        ...                                     [None, torch.tensor([2, 0])], torch.tensor([1., 2.]))
        >>> A.to_dense().tolist()
        [[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]]
        """
        from .interop import validate_storage
        fmt = resolve(format, len(tuple(shape)))
        pos, crd = tuple(pos), tuple(crd)
        validate_storage(fmt, shape, pos, crd, values, arg="from_levels")
        return cls(fmt, shape, pos, crd, values)

    def _set_storage(self, pos, crd, values, nnz=None):
        # Contiguous storage is an invariant: kernels take raw pointers to these arrays.
        contig = lambda t: None if t is None else t.contiguous()  # noqa: E731
        if torch._C._functorch.maybe_current_level() is not None:   # made inside a torch.func transform: its
            contig = lambda t: None if t is None else _unwrapped(t).contiguous()  # noqa: E731  arrays unwrapped
            if _batched(values):                                 # (the kernels need their storage)
                raise NotSupportedError("torch.func.vmap over a SparseTensor's values (with_values / from_coo of "
                                        "batched values) is not supported: batch the dense operands of its "
                                        "products, or loop over the batch")
            values = _unwrapped(values)
        self._pos, self._crd = tuple(map(contig, pos)), tuple(map(contig, crd))
        self._vals = resolved(values).contiguous()
        self._stored = self._count_nnz() if nnz is None else nnz
        n = math.prod(self._shape)
        self._density = self._stored / n if n else 0.0   # read on every dispatch decision
        # the part of a kernel call's cache key this tensor gives (compiler.driver._signature)
        self._sig = (self._format._key, self._vals.dtype, self._crd_dtype(), self._shape, self._vals.device.type)
        box = getattr(self, "_pattern_box", None)
        if box is not None:   # the leaf's gradient hook reads the pattern from here
            box[0] = self._like(nnz=self._stored)

    def _become(self, other: "SparseTensor") -> None:
        """Take ``other``'s format, shape and storage (an in-place view op; the wrapper's own
        sizes are the caller's to change)."""
        self._format, self._shape = other._format, other._shape
        self._set_storage(other._pos, other._crd, other._vals, other._stored)

    def _restore(self, other: "SparseTensor") -> None:
        """A write that changes the pattern (``copy_`` of another pattern, ``A[i, j] = v`` on a
        position not stored): this tensor takes ``other``'s storage (same shape), and so does the
        tensor it was detached from (``x.data``, ``x.detach()``: :attr:`_source`) while that one is
        still on the storage this one had -- as a dense tensor's base sees a write into its storage.
        (Only that way: an alias is not told of a write into its source.)"""
        fmt, shape, before, src = self._format, self._shape, self._vals, self._source
        back = self._source_back
        self._become(other)
        torch.autograd.graph.increment_version(before)   # (values saved for a backward are stale now)
        while src is not None:
            if (back is None and (src._format != fmt or src._shape != shape)) \
                    or src._vals.data_ptr() != before.data_ptr() \
                    or src._vals.numel() * src._vals.element_size() != before.numel() * before.element_size():
                self._source = None   # it went its own way: no longer an alias (nor kept alive by one)
                return
            if back is not None:   # a view of another shape / dtype on the source's values: the new
                other = back(other, src)   # entries as the source holds them
            fmt, shape, before, nxt = src._format, src._shape, src._vals, src._source
            back = src._source_back
            src._become(other._like(values=other._vals.to(src._vals.dtype), nnz=other._stored))
            torch.autograd.graph.increment_version(src)
            src = nxt

    def _alias_of(self, source: "SparseTensor", back=None) -> "SparseTensor":
        """Record that this tensor shares ``source``'s storage when ``source`` is a leaf (a
        parameter's ``p.data``): a strong reference, as a view's to its base -- not to a result,
        whose autograd graph it would keep alive (``h = h.detach()`` in a loop) -- and no weak
        reference on ``source``, which ``torch.utils.swap_tensors`` refuses.  ``back(new, source)``:
        this tensor is a view of another shape or dtype on ``source``'s values (``w.view_as(q)``,
        ``torch.view_as_real(w)``), and gives a write changing its pattern in ``source``'s terms
        (:meth:`_restore`)."""
        with torch._C.DisableTorchFunctionSubclass():
            leaf = source.grad_fn is None
        if leaf:
            self._source, self._source_back = source, back
        return self

    def _count_nnz(self) -> int:
        if not any(lv.kind == "padded" for lv in self._format.levels):
            return self._vals.numel()
        return convert.count_used(self._format, self._shape, self._pos, self._crd)

    def _on_pattern(self, values: torch.Tensor) -> "SparseTensor":
        """This tensor's pattern holding ``values``, a fresh contiguous array as long as
        ``self._vals`` (a kernel's pattern-shaped result): the storage is not checked again
        (1.3 us of a cached SDDMM call's 17 on Cora)."""
        new = torch.Tensor._make_wrapper_subclass(SparseTensor, torch.Size(self._shape), dtype=values.dtype,
                                                  device=values.device)
        new._format, new._shape, new._pos, new._crd = self._format, self._shape, self._pos, self._crd
        new._vals, new._stored, new._density = values, self._stored, self._density
        new._sig = (self._format._key, values.dtype) + self._sig[2:]
        return new

    def _like(self, fmt=None, shape=None, pos=None, crd=None, values=None, nnz=None) -> "SparseTensor":
        """A new SparseTensor sharing whatever is not replaced (pass ``nnz`` when the
        pattern is unchanged, to skip recounting)."""
        out = SparseTensor(
            self._format if fmt is None else fmt, self._shape if shape is None else shape,
            self._pos if pos is None else pos, self._crd if crd is None else crd,
            self._vals if values is None else values, nnz=nnz)
        if self._copy_note and (values is None or values.data_ptr() == self._vals.data_ptr()):
            out._copy_note = self._copy_note   # (x.real.t(), x.real.detach(): the copy's values, its writes lost too)
        return out

    # ------------------------------------------------------------ metadata
    # shape, dtype, device, ndim, dim() and numel() read the tensor's own fields: torch's take a
    # __torch_function__ round trip on every access (1.9 us each, 30x a dense tensor's)
    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._vals.dtype

    @property
    def device(self) -> torch.device:
        return self._vals.device

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        return math.prod(self._shape)

    @property
    def format(self) -> Format:
        return self._format

    @property
    def nnz(self) -> int:
        return self._stored

    @property
    def density(self) -> float:
        return self._density

    def _crd_dtype(self):
        for t in self._crd:
            if t is not None:
                return t.dtype
        return None

    @property
    def index_dtype(self) -> torch.dtype:
        for t in self._crd:
            if t is not None:
                return t.dtype
        return torch.int32  # all-dense storage: no index arrays

    def _needs_grad(self) -> bool:
        """``requires_grad`` with grad mode on, read without torch's __torch_function__ round
        trip (2 us a read on a SparseTensor) -- or a forward-mode tangent on this tensor
        (``fwAD.make_dual(A, T)``): the ops then take their autograd Functions, whose ``jvp``
        rules carry it (the direct paths compute on the arrays and dropped it)."""
        if torch.is_grad_enabled():
            with torch._C.DisableTorchFunctionSubclass():
                if self.requires_grad:
                    return True
        return _FORWARD_AD._current_level >= 0 and _has_tangent(self)

    def values(self) -> torch.Tensor:
        """The stored values (1-d, shares memory with the tensor: writes into it are the tensor's;
        differentiable).  A view: ``resize_`` / ``set_`` / ``.data =`` on it leave the tensor's
        own array as it is (kernels read that array by pointer, trusting its length and dtype)."""
        if self._needs_grad():
            from .ops.einsum import Values
            return Values.apply(self)
        return self._vals.view(self._vals.shape)

    def with_values(self, values: torch.Tensor) -> "SparseTensor":
        """This pattern holding ``values`` (same length as ``values()``); differentiable
        w.r.t. ``values``."""
        if not isinstance(values, torch.Tensor) or values.shape != self._vals.shape:
            raise ScorchValueError(f"with_values: values must be a tensor of shape {tuple(self._vals.shape)}, "
                                   f"got {getattr(values, 'shape', type(values).__name__)}")
        check_values(values, "with_values")
        if (values.requires_grad and torch.is_grad_enabled()) or (
                torch._C._functorch.maybe_current_level() is not None and _layers_deep(values)):
            from .ops.einsum import FromValues   # (torch.func: values it wraps have their tangents there)
            out = FromValues.apply(self.detach(), values)
            # values that are a leaf's or a view's (x.t() holds x.values()): writes through out would change
            # them unrecorded -- refused in grad mode (_dispatch); fresh values (a clone's) are out's own
            out._grad_view = values.is_leaf or values._is_view()
            return out
        return self._like(values=values, nnz=self._stored)

    def pos(self, level: int) -> torch.Tensor | None:
        """``pos`` array of a compressed level (None for other kinds): a copy -- the pattern is
        not changed in place (kernels read it unchecked); ``values()`` is the tensor's own."""
        return _copy(self._pos[self._check_level(level)])

    def crd(self, level: int) -> torch.Tensor | None:
        """Coordinates of a compressed, singleton or padded level (None for dense): a copy, as
        :meth:`pos`."""
        return _copy(self._crd[self._check_level(level)])

    def _check_level(self, level: int) -> int:
        n = len(self._format.levels)
        if isinstance(level, bool) or not hasattr(type(level), "__index__"):
            raise ScorchTypeError(f"level must be an int, got {type(level).__name__}")
        level = operator.index(level)
        if not -n <= level < n:
            raise ScorchValueError(f"level must be an int in [{-n}, {n}), got {level!r}")
        return level % n

    # ------------------------------------------------------------ conversions
    def to_dense(self, dtype=None, *, masked_grad=None) -> torch.Tensor:
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ScorchTypeError(f"to_dense: dtype must be a torch.dtype or None, got {dtype!r}")
        if self._needs_grad():
            from .ops.einsum import ToDense
            out = ToDense.apply(self)
            return out if dtype is None else out.to(dtype)
        if _FORWARD_AD._current_level >= 0 and _above_autograd():   # values with a tangent: both parts
            primal, tangent = _FORWARD_AD.unpack_dual(self._vals)
            if tangent is not None:
                dense = [self._like(values=v, nnz=self._stored).to_dense(dtype) for v in (primal, tangent)]
                return _FORWARD_AD.make_dual(*dense)
        out = self._dense_by_kernel()
        if out is None:
            out = convert.to_dense(self._format, self._shape, self._pos, self._crd, self._vals)
        return out if dtype is None else out.to(dtype)

    def _dense_by_kernel(self):
        """The dense tensor written by a generated copy kernel (the einsum ``ab->ab`` into a dense
        result: no coordinate arrays; CSR 2000 x 3000 at 2%: 1.5 -> 0.45 ms), where it pays: float
        values, at least ``_KERNEL_DENSE_MIN`` entries, and a schedule splitting the rows across
        threads (COO's would sum per-thread copies: slower than the coordinates' path) -- from a
        signature's second call on, so a one-off ``to_dense`` compiles nothing.  None where it
        does not apply."""
        if self._stored < _KERNEL_DENSE_MIN or self._vals.dtype not in (torch.float32, torch.float64) \
                or convert.is_all_dense(self._format) or not 0 < len(self._shape) <= len(_LETTERS):
            return None
        from .compiler import build, driver
        if not build.have_compiler():
            return None
        eq = _LETTERS[:len(self._shape)]
        eq = f"{eq}->{eq}"
        rows = _DENSE_BY_KERNEL.get(self._sig, _FIRST)
        if rows is _FIRST:   # a signature's first call: the coordinates' path (no compile for a one-off)
            if len(_DENSE_BY_KERNEL) < 4096:
                _DENSE_BY_KERNEL[self._sig] = None
            return None
        if rows is None:
            rows = driver._plan(eq, [self], "dense")[0].schedule.parallel != "buffers"
            _DENSE_BY_KERNEL[self._sig] = rows
        return driver.einsum(eq, self, format="dense") if rows else None

    def coo(self):
        """``(indices, values)``: the ``ndim x nnz`` int64 coordinates of the stored
        entries (in the format's level order) and their values."""
        return convert.coords_of(self._format, self._shape, self._pos, self._crd, self._vals)

    def asformat(self, format, *, index_dtype=None) -> "SparseTensor":
        """This tensor in another format (``self`` if nothing changes).

        ``index_dtype=None`` keeps the current index width when it can hold the result."""
        fmt = resolve(format, self.dim())
        from .interop import _check_blocks, _check_index_dtype
        _check_index_dtype(index_dtype)   # (an int16 or float one reached the kernels: a segfault)
        if fmt != self._format:   # blocks that divide the shape, a position array that fits
            _check_blocks(fmt, self._shape)
        want = index_dtype if index_dtype is not None else self.index_dtype
        if fmt == self._format:
            if want == self.index_dtype:
                return self
            pos, crd = convert.recast(fmt, self.shape, self._pos, self._crd, want)
            return self._keep_grad(self._like(pos=pos, crd=crd, nnz=self._stored))
        if self._needs_grad():  # the entries' positions travel through the conversion instead of values
            from .ops.shape import take_positions
            return take_positions(self.detach()._positions().asformat(fmt, index_dtype=index_dtype), self.values())
        if convert.is_all_dense(self._format):  # its zeros are not entries: store only nonzeros
            return SparseTensor(fmt, self.shape, *_from_dense_with_width(fmt, self.to_dense(), index_dtype))
        if self.dim() == 2 and self._format.block and self._format == bsr_format(*self._format.block) \
                and fmt in _PLAIN2:  # BSR: its blocks' values placed in CSR order (no sort), then on
            (pos, crd), vals = convert.bsr_to_csr(self._shape, self._format.block, self._pos, self._crd,
                                                  self._vals, want)
            return SparseTensor(_CSR2, self._shape, pos, crd, vals).asformat(fmt, index_dtype=want)
        if self._format == _ELL2 and fmt in _PLAIN2:  # ELL: its used slots in order, then on
            (pos, crd), vals = convert.ell_to_csr(self._shape, self._crd, self._vals, want)
            return SparseTensor(_CSR2, self._shape, pos, crd, vals, nnz=self._stored).asformat(fmt, index_dtype=want)
        if fmt == _ELL2 and self._format in _PLAIN2:  # via CSR: each row's entries in its first slots
            x = self.asformat(_CSR2, index_dtype=want)
            (pos, crd), vals = convert.csr_to_ell(x._shape, x._pos, x._crd, x._vals, want)
            return SparseTensor(_ELL2, self._shape, pos, crd, vals, nnz=x._stored)
        if self._format in _PLAIN2 and fmt in _PLAIN2 and not (self._format == _COO2 and fmt == _CSR2):
            if (out := self._via_csr(fmt, want)) is not None:  # 2-d CSR / CSC / DCSR / DCSC / COO: no sort
                return out
        if self.dim() == 2 and self._format == _COO2 and fmt == _CSR2:  # the common one, directly
            def make(width):
                return convert.coo_to_csr(self._shape, self._pos, self._crd, self._vals, width)
        else:
            coords, vals = self.coo()

            def make(width):
                return convert.build(fmt, self.shape, coords, vals, width)
        try:
            (pos, crd), values = make(want)
        except ScorchValueError:
            if index_dtype is not None:
                raise
            (pos, crd), values = make(None)
        return SparseTensor(fmt, self.shape, pos, crd, values)

    def _via_csr(self, fmt, want) -> "SparseTensor | None":
        """This 2-d CSR, CSC, DCSR, DCSC or COO matrix as another of them (``fmt``) without
        sorting: to the CSR-like form of its own order (COO -> CSR by counting rows, DCSR -> CSR
        by expanding the outer level), the counting sort (compiler.recompress) where the order
        changes, then to ``fmt`` (compressing the outer level, or each entry's row for COO).
        None where that does not run (no C compiler, an index width the sort would not keep), or
        where its CSR-like forms would be far larger than the entries (a hypersparse matrix: the
        caller's sort by coordinates is O(nnz) in memory)."""
        x = self
        if max(x._shape) > 4 * x._stored + 65536:
            return None
        if x._format == _COO2:
            (pos, crd), vals = convert.coo_to_csr(x._shape, x._pos, x._crd, x._vals, want)
            x = SparseTensor(_CSR2, x._shape, pos, crd, vals, nnz=x._stored)
        elif x._format in _DCSX2:
            plain = _CSX2[_DCSX2.index(x._format)]
            pos, crd = convert.expand_outer(x._pos, x._crd, x._shape[x._format.order[0]])
            x = SparseTensor(plain, x._shape, pos, crd, x._vals, nnz=x._stored)
        target = _CSX2[_DCSX2.index(fmt)] if fmt in _DCSX2 else _CSR2 if fmt == _COO2 else fmt
        if x._format != target and (x.index_dtype != want or (x := x._recompressed(target)) is None):
            return None
        if fmt == _COO2:
            (pos, crd), vals = convert.csr_to_coo(x._shape, x._pos, x._crd, x._vals, want)
            return SparseTensor(_COO2, x._shape, pos, crd, vals, nnz=x._stored)
        if fmt in _DCSX2:
            pos, crd = convert.compress_outer(x._pos, x._crd)
            x = SparseTensor(fmt, x._shape, pos, crd, x._vals, nnz=x._stored)
        if x.index_dtype != want:
            x = x.asformat(fmt, index_dtype=want)  # same format: only the index arrays recast
        if x._vals is self._vals:  # a result never aliases its source's buffers
            x = x._like(values=x._vals.clone(), nnz=x._stored)
        return x

    def _recompressed(self, fmt) -> "SparseTensor | None":
        """This CSR matrix as CSC or the reverse (``fmt``, the other one), by the generated
        counting sort (compiler.recompress), its pattern remembered; None where that does not run."""
        from .compiler.recompress import recompressed
        major, minor = (self._shape[d] for d in self._format.order)
        got = recompressed(self._pos[1], self._crd[1], self._vals, major, minor)
        if got is None:
            return None
        pos, crd, values = got
        return SparseTensor(fmt, self._shape, (None, pos), (None, crd), values, nnz=self._stored)

    def to_torch(self) -> torch.Tensor:
        """The matching ``torch.sparse`` tensor: CSR, CSC, BSR or BSC where the format
        is one of those, a strided tensor for the dense format, else coalesced COO."""
        from .interop import to_torch
        return to_torch(self)

    def to_scipy(self):
        """A ``scipy.sparse`` array (csr/csc/bsr where the format matches, else coo); 2-d only."""
        from .interop import to_scipy
        return to_scipy(self)

    # torch.sparse COO vocabulary: a SparseTensor is always coalesced (sorted, no duplicates).
    def coalesce(self) -> "SparseTensor":
        """This tensor when :meth:`is_coalesced`; else its entries in COO (row-major, every stored
        entry once), whose ``indices()`` and ``values()`` line up as torch's COO ones do."""
        return self if self.is_coalesced() else self.asformat("coo")

    def is_coalesced(self) -> bool:
        """Whether ``indices()`` lists the entries row-major, each once, aligned with ``values()``
        (as torch's coalesced COO): not in a column-major (CSC), blocked (BSR) or padded (ELL)
        storage order, which torch code trusting the flag would misread."""
        f = self._format
        return not f.block and tuple(f.order) == tuple(range(len(f.order))) \
            and all(lv.kind != "padded" for lv in f.levels)

    def indices(self) -> torch.Tensor:
        """``ndim x nnz`` int64 coordinates of the stored entries (as torch's COO ``indices()``)."""
        return self.coo()[0]

    def _coo_values(self) -> torch.Tensor:
        """torch's COO ``_values()``: the stored entries' values, paired with :meth:`indices`
        (``values()`` less a padded format's unused slots); differentiable."""
        if self._stored == self._vals.numel():
            return self.values()
        _, _, where = convert.coords_of(self._format, self._shape, self._pos, self._crd, self._vals, positions=True)
        return self.values()[where]

    def _nnz(self) -> int:
        """torch's ``_nnz()``: the number of stored entries."""
        return self._stored

    def sparse_dim(self) -> int:
        return self.dim()

    def dense_dim(self) -> int:
        return 0

    # torch.sparse compressed vocabulary, for a 2-d SparseTensor in the matching preset
    def crow_indices(self) -> torch.Tensor:
        return self._compressed_level("crow_indices", ("csr", "bsr"), pos=True)

    def col_indices(self) -> torch.Tensor:
        return self._compressed_level("col_indices", ("csr", "bsr"), pos=False)

    def ccol_indices(self) -> torch.Tensor:
        return self._compressed_level("ccol_indices", ("csc", "bsc"), pos=True)

    def row_indices(self) -> torch.Tensor:
        return self._compressed_level("row_indices", ("csc", "bsc"), pos=False)

    def _compressed_level(self, op: str, names: tuple, pos: bool) -> torch.Tensor:
        name = self._format.name or ""
        if self.dim() != 2 or not name.startswith(names):
            raise ScorchTypeError(
                f"{op}(): expects a 2-d SparseTensor in {' or '.join(names)} format, got "
                f"{name or 'a user-defined format'} with {self.dim()} dims; convert with x.asformat({names[0]!r})")
        return _copy(self._pos[1] if pos else self._crd[1])   # (a copy, as pos() / crd())

    # torch's conversions to a sparse layout: the matching preset, kept a SparseTensor
    def to_sparse(self, *args, layout=None, blocksize=None, dense_dim=None) -> "SparseTensor":
        """``to_sparse()`` / ``to_sparse(sparse_dim)``: COO; ``to_sparse(layout=..., blocksize=...)``:
        that layout's preset (CSR, CSC, BSR, BSC)."""
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            if args[0] != self.dim():
                raise ScorchValueError(f"to_sparse: sparse_dim={args[0]}: every dim of a SparseTensor is sparse "
                                       f"(expected {self.dim()})")
            args = args[1:]
        if args:
            layout = args[0]
        if dense_dim not in (None, 0):
            raise ScorchValueError(f"to_sparse: dense_dim={dense_dim} is not supported (values are scalars)")
        names = {None: "coo", torch.sparse_coo: "coo", torch.sparse_csr: "csr", torch.sparse_csc: "csc",
                 torch.sparse_bsr: "bsr", torch.sparse_bsc: "bsc"}
        if layout not in names:
            raise ScorchValueError(f"to_sparse: layout must be a torch sparse layout, got {layout!r}")
        name = names[layout]
        if name in ("bsr", "bsc"):
            if isinstance(blocksize, int) and not isinstance(blocksize, bool):   # torch's: (b, b)
                blocksize = (blocksize, blocksize)
            if blocksize is None or not isinstance(blocksize, (tuple, list, torch.Size)) or len(blocksize) != 2:
                raise ScorchValueError(f"to_sparse: layout {layout} needs blocksize=(rows, cols), got {blocksize!r}")
            from .format import bsc_format, bsr_format
            return self.asformat((bsr_format if name == "bsr" else bsc_format)(*blocksize))
        return self.asformat(name)

    def to_sparse_coo(self) -> "SparseTensor":
        return self.to_sparse()

    def to_sparse_csr(self, dense_dim=None) -> "SparseTensor":
        return self.to_sparse(layout=torch.sparse_csr, dense_dim=dense_dim)

    def to_sparse_csc(self, dense_dim=None) -> "SparseTensor":
        return self.to_sparse(layout=torch.sparse_csc, dense_dim=dense_dim)

    def to_sparse_bsr(self, blocksize, dense_dim=None) -> "SparseTensor":
        return self.to_sparse(layout=torch.sparse_bsr, blocksize=blocksize, dense_dim=dense_dim)

    def to_sparse_bsc(self, blocksize, dense_dim=None) -> "SparseTensor":
        return self.to_sparse(layout=torch.sparse_bsc, blocksize=blocksize, dense_dim=dense_dim)

    def tolist(self):
        """The dense value as nested Python lists (within ``config.dense_fallback_max_bytes``)."""
        from ._dispatch import check_dense_size
        check_dense_size("tolist() lists every element, and", [self])
        return self.to_dense().tolist()

    def numpy(self, *, force: bool = False):
        raise ScorchTypeError("numpy(): a SparseTensor has no dense buffer; use x.to_dense().numpy() "
                              "or x.to_scipy()")

    def __array__(self, dtype=None, copy=None):
        # numpy asks for this when it converts a SparseTensor itself: np.asarray(x), or a numpy array
        # on the other side of an operator (x + ndarray, after torch's __add__ declined it)
        raise ScorchTypeError("numpy cannot convert a SparseTensor (np.asarray(x), or a numpy array as the other "
                              "operand of x: convert that one with torch.as_tensor(a)); use x.to_dense().numpy() "
                              "or x.to_scipy()")

    # ------------------------------------------------------------ dtype / copies
    def to(self, *args, **kwargs) -> "SparseTensor":
        kwargs = dict(kwargs)
        copy = kwargs.pop("copy", False)   # torch's parser of to()'s arguments does not take it
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type != "cpu":   # (to("meta") was taken: C then read meta pointers)
            raise NotSupportedError(f"to(): a SparseTensor lives on the CPU (scorch's kernels run there), got "
                                    f"device {device}; use x.to_dense().to({str(device)!r})")
        if dtype is not None and dtype not in _VALUE_DTYPES:
            check_values(torch.empty(0, dtype=dtype), "to()")
        values = self._vals
        if dtype is not None or device is not None:
            values = values.to(device=device, dtype=dtype, non_blocking=non_blocking, copy=copy)
        pos, crd = self._pos, self._crd
        if device is not None and torch.device(device) != self.device:
            pos = tuple(None if t is None else t.to(device) for t in pos)
            crd = tuple(None if t is None else t.to(device) for t in crd)
        if values is self._vals and pos is self._pos and not copy:
            return self
        if copy and values is self._vals:   # copy=True: never the caller's values (the pattern is immutable)
            values = values.clone()
        out = self._like(pos=pos, crd=crd, values=values, nnz=self._stored)
        if self._needs_grad():  # the cast in the graph: values() -> cast -> this pattern
            return out.with_values(self.values().to(device=device, dtype=dtype, non_blocking=non_blocking, copy=copy))
        return out

    def double(self, memory_format=None):
        return self.to(torch.float64)

    def float(self, memory_format=None):
        return self.to(torch.float32)

    def half(self, memory_format=None):
        return self.to(torch.float16)

    def bfloat16(self, memory_format=None):
        return self.to(torch.bfloat16)

    def clone(self, *, memory_format=None) -> "SparseTensor":
        clone = lambda t: None if t is None else t.clone()  # noqa: E731
        out = self._like(pos=tuple(map(clone, self._pos)), crd=tuple(map(clone, self._crd)),
                         values=self._vals.clone(), nnz=self._stored)
        return out.with_values(self.values().clone()) if self._needs_grad() else out

    def detach(self) -> "SparseTensor":
        out = self._like(values=self._vals.detach(), nnz=self._stored)._alias_of(self)
        if getattr(self, "_unset", False):   # (empty_like(A).detach().fill_(s): every position, as A's)
            out._unset = True
        return out

    def copy_(self, src, non_blocking: bool = False) -> "SparseTensor":
        """Take ``src``'s entries (its pattern too), in this tensor's format and dtype.  Into the
        same pattern the values are written in place; another pattern gives this tensor new
        storage, and its ``x.detach()`` / ``x.data`` aliases too (``p.data.copy_(q)``, an EMA
        update): :meth:`_restore`.  A view of another format (``x.t()``) keeps the old entries."""
        from .interop import as_sparse
        from .ops._pattern import project, same_pattern
        if self._copy_note:   # x.real / x.imag / a reordering x.view(...): a copy, the write would be lost
            from ._dispatch import check_write
            check_write("copy_", self)
        if not isinstance(src, torch.Tensor):   # a number: every position takes it (stored when not 0)
            src = torch.as_tensor(src, dtype=self.dtype).expand(self.shape)
        if torch.is_grad_enabled():
            with torch._C.DisableTorchFunctionSubclass():
                recorded = self.requires_grad or src.requires_grad
            if recorded:   # torch rebases the history onto src; here the write would not be recorded
                raise NotSupportedError("copy_: writing into a SparseTensor that requires grad, or from a source that "
                                        "does, is not recorded by autograd; copy under torch.no_grad() (a parameter "
                                        "update), or use the source itself (src.clone())")
        if tuple(src.shape) != tuple(self.shape):   # broadcast as torch's copy_ does
            try:
                if torch.broadcast_shapes(tuple(src.shape), tuple(self.shape)) != tuple(self.shape):
                    raise RuntimeError
            except RuntimeError:
                raise ScorchValueError(f"copy_: src of shape {tuple(src.shape)} does not broadcast to this tensor's "
                                       f"shape {tuple(self.shape)}") from None
            src = src.expand(self.shape)
        s = as_sparse(src, self._format, index_dtype=self.index_dtype)
        if same_pattern(s, self):
            self._vals.copy_(s._vals)
        elif _within(s, self):   # (src's zeros at stored positions: 0 written there, in place)
            self._vals.copy_(project(s, self))
        else:
            # (a copy of the values: as_sparse and .to may hand back src's own, and a copy_ never aliases)
            self._restore(s._like(values=s._vals.to(self.dtype, copy=True), nnz=s._stored))
        torch.autograd.graph.increment_version(self)
        return self

    # ------------------------------------------------------------ shape: mode-order changes, no copy
    def permute(self, *dims, **kwargs) -> "SparseTensor":
        if "dims" in kwargs and not dims:   # x.permute(dims=(1, 0))
            dims = (kwargs.pop("dims"),)
        if kwargs:
            raise ScorchTypeError(f"permute() got unexpected keyword arguments {sorted(kwargs)}")
        if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
            dims = tuple(dims[0])
        n = self.dim()
        perm = tuple(_wrap_dim(d, n, "permute") for d in dims)
        if sorted(perm) != list(range(n)):
            raise ScorchValueError(f"permute: dims must be a permutation of 0..{n - 1}, got {tuple(dims)}")
        shape = tuple(self.shape[p] for p in perm)
        return self._keep_grad(self._like(fmt=self._format.permuted(perm), shape=shape, nnz=self._stored))

    def _keep_grad(self, view: "SparseTensor") -> "SparseTensor":
        """``view`` (this tensor's values in the same order, under another format, shape or index
        width) in the autograd graph when this tensor requires grad: its values are ours."""
        return self._view_in_graph(view) if self._needs_grad() else view

    def _on_values_of(self, pattern: "SparseTensor") -> "SparseTensor":
        """``pattern`` (of as many entries, in the same order) holding this tensor's values array: a
        view, whose writes reach this tensor; in the autograd graph when this tensor requires grad."""
        if self._needs_grad():
            return self._view_in_graph(pattern)
        return pattern._like(values=self.values(), nnz=pattern._stored)

    def _view_in_graph(self, pattern: "SparseTensor") -> "SparseTensor":
        from .ops.einsum import ViewOf
        out = ViewOf.apply(self, pattern)
        out._grad_view = True   # writes through it would change this tensor unrecorded: refused in grad mode
        return out

    def _positions(self) -> "SparseTensor":
        """This pattern holding 1, 2, ... (float64): each stored entry's position in the values
        array plus one, so that a conversion shows where every entry went (0: padding; see
        :func:`ops.shape.take_positions`)."""
        ids = torch.zeros(self._vals.numel(), dtype=torch.float64)
        _, _, where = convert.coords_of(self._format, self._shape, self._pos, self._crd, self._vals,
                                        positions=True)
        ids[where] = (where + 1).to(torch.float64)
        return self._like(values=ids, nnz=self._stored)


    def transpose(self, dim0: int, dim1: int) -> "SparseTensor":
        n = self.dim()
        perm = list(range(n))
        a, b = _wrap_dim(dim0, n, "transpose"), _wrap_dim(dim1, n, "transpose")
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(perm)

    def t(self) -> "SparseTensor":
        if self.dim() > 2:
            raise ScorchValueError(f"t() expects a tensor with <= 2 dims, got {self.dim()}-d; use transpose()")
        return self if self.dim() < 2 else self.transpose(0, 1)

    @property
    def T(self) -> "SparseTensor":
        return self.permute(tuple(reversed(range(self.dim()))))

    @property
    def mT(self) -> "SparseTensor":
        return self.transpose(-2, -1)

    # ------------------------------------------------------------ printing, pickling, copying
    def __repr__(self, *, tensor_contents=None) -> str:
        shape = tuple(self.shape)
        extra = ", requires_grad=True" if self.requires_grad else ""
        vals = repr(self._vals.detach()).replace("\n", "\n" + " " * 7)
        return (f"SparseTensor(shape={shape}, format={self._format}, nnz={self._stored}, "
                f"density={self.density:.4g}, dtype={self.dtype}, index_dtype={self.index_dtype}{extra},\n"
                f"       values={vals})")

    # An nn.Parameter of a SparseTensor is a SparseTensor marked ``_is_param`` (torch's way for tensor
    # subclasses: isinstance(p, nn.Parameter) reads the mark); copies and pickles keep the mark, or a
    # deep-copied / reloaded model's sparse weight would stop being a parameter (weight_norm would
    # register its originals as buffers, load_state_dict(assign=True) would refuse it).
    def __reduce_ex__(self, proto):
        if _inside(torch.serialization._legacy_save):
            raise NotSupportedError("torch.save(..., _use_new_zipfile_serialization=False): a SparseTensor cannot be "
                                    "saved in torch's legacy format (its arrays are read back only after it is "
                                    "rebuilt, too late to check them); use the default format")
        args = (_VERSION, self._format.to_spec(), tuple(self.shape), _bare(self._pos), _bare(self._crd), self._vals,
                self.requires_grad, bool(getattr(self, "_is_param", False)))
        attrs = self._user_attributes()   # kept, as torch keeps a tensor's
        return (_rebuild_sparse, args + (attrs,) if attrs else args)

    def _user_attributes(self) -> dict:
        """The attributes a user set on this tensor (scorch's own start with ``_``)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch._C.DisableTorchFunctionSubclass():
            leaf = self.grad_fn is None
        if not leaf:   # as torch's Tensor.__deepcopy__
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment (a SparseTensor computed from tensors that require grad "
                               "is not one: deepcopy its .detach())")
        import copy
        out = SparseTensor(self._format, self.shape, copy.deepcopy(_bare(self._pos), memo),
                           copy.deepcopy(_bare(self._crd), memo), copy.deepcopy(self._vals, memo),
                           requires_grad=self.requires_grad, nnz=self._stored)
        memo[id(self)] = out
        if getattr(self, "_is_param", False):   # as nn.Parameter.__deepcopy__: the data, no grad or attributes
            out._is_param = True
            return out
        if self.grad is not None:   # as torch's Tensor.__deepcopy__: its grad and a user's attributes
            out.grad = copy.deepcopy(self.grad, memo)
        for name, value in copy.deepcopy(self._user_attributes(), memo).items():
            setattr(out, name, value)
        return out

    # for torch.compile-style tracing: the inner tensors and a plain-data context
    def __tensor_flatten__(self):
        names = ["_vals"]
        for k in range(len(self._format.levels)):
            if self._pos[k] is not None:
                names.append(f"_pos_{k}")
            if self._crd[k] is not None:
                names.append(f"_crd_{k}")
        return names, (self._format.to_spec(), tuple(self.shape), self._stored)

    def __getattr__(self, name):  # only reached for attributes not found normally
        if name.startswith(("_pos_", "_crd_")):
            k = int(name[5:])
            return (self._pos if name.startswith("_pos_") else self._crd)[k]
        raise AttributeError(f"'SparseTensor' object has no attribute {name!r}")

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        spec, shape, nnz = ctx
        fmt = Format.from_spec(spec)
        n = len(fmt.levels)
        pos = tuple(inner.get(f"_pos_{k}") for k in range(n))
        crd = tuple(inner.get(f"_crd_{k}") for k in range(n))
        return SparseTensor(fmt, shape, pos, crd, inner["_vals"], nnz=nnz)

    # ------------------------------------------------------------ torch hooks
    # ``@`` straight to the dispatch table's matmul: through torch.Tensor.__matmul__ it takes
    # torch's Python wrapper and a __torch_function__ round trip first (a cached 8x8 SpMM on a
    # 2 GHz core: 63 -> 47 us).  Python tries a subclass's reflected method first, so
    # ``dense @ sparse`` comes here too.  A non-tensor operand gets Python's TypeError.
    def __matmul__(self, other):
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if _mode_stack():
            return on_cpu(_MATMUL[0] if _MATMUL else _bind_matmul(), self, other)
        return (_MATMUL[0] if _MATMUL else _bind_matmul())(self, other)

    def __rmatmul__(self, other):
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if _mode_stack():
            return on_cpu(_MATMUL[0] if _MATMUL else _bind_matmul(), other, self)
        return (_MATMUL[0] if _MATMUL else _bind_matmul())(other, self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from ._dispatch import torch_function
        if _mode_stack():
            return on_cpu(torch_function, func, types, args, kwargs or {})
        return torch_function(func, types, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from ._dispatch import torch_dispatch
        if _mode_stack():
            return on_cpu(torch_dispatch, func, types, args, kwargs or {})
        return torch_dispatch(func, types, args, kwargs or {})


def _layers(t: torch.Tensor):
    """``t`` and each tensor torch.func's wrappers around it hold, outermost first."""
    f = torch._C._functorch
    yield t
    while f.is_gradtrackingtensor(t) or f.is_batchedtensor(t) or f.is_functionaltensor(t):
        t = f.get_unwrapped(t)
        yield t


def _layers_deep(t: torch.Tensor) -> bool:
    """Whether torch.func wraps ``t`` (its transforms track it)."""
    f = torch._C._functorch
    return f.is_gradtrackingtensor(t) or f.is_batchedtensor(t) or f.is_functionaltensor(t)


def _unwrapped(t: torch.Tensor) -> torch.Tensor:
    """``t`` without torch.func's wrappers (a SparseTensor's arrays: differentiating or batching
    through a SparseTensor's own values is not supported under torch.func; its products with
    dense tensors are)."""
    for t in _layers(t):
        pass
    return t


def _batched(t: torch.Tensor) -> bool:
    """Whether ``t`` carries a torch.func.vmap batch dim at some wrapper level."""
    return any(map(torch._C._functorch.is_batchedtensor, _layers(t)))


def resolved(x: torch.Tensor) -> torch.Tensor:
    """``x`` with torch's lazy negation and conjugation bits applied (``x.conj().imag``,
    ``torch._neg_view``): memory that holds its values, as kernels reading it by pointer need
    (``contiguous`` keeps the bits)."""
    return x.resolve_conj().resolve_neg() if x.is_neg() or x.is_conj() else x


def check_values(values, arg: str) -> None:
    """Values a SparseTensor is built from live on the CPU (a meta tensor's were read as zeros; the
    kernels read the array by pointer) and have a dtype torch's CPU ops compute in: uint16/32/64 and
    the float8 types have no nonzero / index_put / sums there, so such a tensor failed later, in
    whichever op first touched it."""
    if not isinstance(values, torch.Tensor):
        return
    if values.device.type != "cpu":
        raise NotSupportedError(f"{arg}: values are on {values.device}; SparseTensors live on the CPU "
                                "(scorch's kernels run there)")
    if values.dtype not in _VALUE_DTYPES:
        raise ScorchTypeError(f"{arg}: values of dtype {values.dtype} are not supported (torch's CPU ops compute "
                              "in it only partially); convert first, e.g. x.to(torch.int64) or x.float()")


_VALUE_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                           torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
                           torch.complex128})


_mode_stack = torch._C._len_torch_function_stack   # 0 unless a torch-function mode is on (~30 ns)
_UNPACKING = threading.local()


def _above_autograd() -> bool:
    """Not inside a dispatch handler (below autograd: its ADInplaceOrView key excluded --
    torch's ``unpack_dual`` must not run there)."""
    return not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.ADInplaceOrView)


def _has_tangent(x: torch.Tensor) -> bool:
    """Whether ``x`` (a SparseTensor or a dense tensor) carries a forward-mode tangent -- False below
    autograd, where torch's ``unpack_dual`` must not run, and while it runs (on a SparseTensor it
    reaches scorch's dispatch, whose view handling asks this again)."""
    if getattr(_UNPACKING, "on", False) or not _above_autograd():
        return False
    _UNPACKING.on = True
    try:
        with torch._C.DisableTorchFunctionSubclass():
            return _FORWARD_AD.unpack_dual(x).tangent is not None
    finally:
        _UNPACKING.on = False


def on_cpu(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the default device CPU when a mode made it another (under
    ``with torch.device("meta")`` scorch's own buffers went to meta, and a kernel writing through
    a meta tensor's null pointer crashed the process): SparseTensors live on the CPU, as their
    results do -- as torch computes CPU operands on the CPU under such a context."""
    if torch.get_default_device().type == "cpu":
        return fn(*args, **kwargs)
    with torch.device("cpu"):
        return fn(*args, **kwargs)


def cpu_entry(fn):
    """``fn`` (a public entry point) run by :func:`on_cpu` while a torch-function mode is on."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _mode_stack():
            return on_cpu(fn, *args, **kwargs)
        return fn(*args, **kwargs)
    return run


for _name, _fn in list(vars(SparseTensor).items()):   # the public methods (properties read fields only)
    if not _name.startswith("_") and callable(_fn) and not isinstance(_fn, (staticmethod, classmethod, type)):
        setattr(SparseTensor, _name, cpu_entry(_fn))


_MATMUL: list = []  # [the dispatch table's torch.matmul implementation], bound on first use


def _bind_matmul():
    from ._dispatch import _FUNCTIONS  # imported late: the ops register themselves after this module
    _MATMUL.append(_FUNCTIONS[torch.Tensor.__matmul__])
    return _MATMUL[0]


def _within(s: SparseTensor, x: SparseTensor) -> bool:
    """Whether every entry ``s`` stores is a position ``x`` stores (both in one format)."""
    from .ops._pattern import positions
    return s._stored <= x._stored and bool((positions(x, s.coo()[0]) >= 0).all())


def _wrap_dim(d, n: int, op: str) -> int:
    if isinstance(d, bool) or not isinstance(d, numbers.Integral):
        raise ScorchTypeError(f"{op}: dim must be an int, got {type(d).__name__}")
    d = int(d)   # (numpy's integers too)
    if not -n <= d < n:
        raise ScorchIndexError(f"{op}: dim {d} out of range for a {n}-d tensor (expected [{-n}, {n - 1}])")
    return d % n


def _from_dense_with_width(fmt, x, index_dtype):
    (pos, crd), values = convert.from_dense(fmt, x, index_dtype)
    return pos, crd, values


def _grad_in_pattern(box, grad):
    x = box[0]
    if grad is None:
        return grad
    from .ops._pattern import in_pattern, project, same_pattern
    if isinstance(grad, SparseTensor) and same_pattern(grad, x):
        return grad
    if _legacy_vmap():   # (is_grads_batched: a batch of dense gradients, 0 off the pattern, taken as they are)
        return grad
    # in the graph when the backward records one (create_graph=True: a gradient penalty reads it)
    return in_pattern(x, project(grad, x).to(x._vals.dtype))


def _legacy_vmap() -> bool:
    """Whether torch's old vmap (``torch._vmap_internals``, which ``autograd.grad(...,
    is_grads_batched=True)`` runs) is on: its batched tensors have no data to read."""
    level = torch._C._vmapmode_increment_nesting()
    torch._C._vmapmode_decrement_nesting()
    return level > 1


def _bare(arrays) -> tuple:
    """Index arrays without what scorch keeps on them (per-entry rows, remembered recompressions:
    derived data -- and a pattern with its transpose's is a cycle, which weights_only loading
    refuses): aliases of the same storage, attribute-free, for saving and deep copies."""
    return tuple(None if t is None else t.detach() for t in arrays)


def _rebuild_sparse(version, spec, shape, pos, crd, values, requires_grad, param=False, attrs=None):
    if version != _VERSION:
        raise ScorchValueError(f"cannot load a SparseTensor saved in format version {version}")
    if _inside(torch.serialization._legacy_load):   # (only written by hand: scorch refuses to save one so)
        raise NotSupportedError("cannot load a SparseTensor from torch's legacy (non-zip) format: its arrays are "
                                "read only after it is rebuilt, too late to check them")
    from .interop import validate_storage
    fmt = Format.from_spec(spec)
    validate_storage(fmt, shape, pos, crd, values, arg="loaded tensor")
    out = SparseTensor(fmt, shape, pos, crd, values, requires_grad=requires_grad)
    if param is True:
        out._is_param = True
    for name, value in (attrs or {}).items():   # a user's own attributes (none that shadow the class's)
        if isinstance(name, str) and not name.startswith("_") and not hasattr(SparseTensor, name):
            setattr(out, name, value)
    return out


def _copy(t):
    return None if t is None else t.clone()


def _inside(fn, depth: int = 30) -> bool:
    """Whether ``fn`` is running further up this thread's stack (within ``depth`` frames)."""
    import sys
    code, frame = fn.__code__, sys._getframe(1)
    while frame is not None and depth:
        if frame.f_code is code:
            return True
        frame, depth = frame.f_back, depth - 1
    return False


torch.serialization.add_safe_globals([_rebuild_sparse])
from .format import Level as _Level   # noqa: E402  (a saved Format -- {"format": A.format} -- loads too)
torch.serialization.add_safe_globals([Format, _Level])
