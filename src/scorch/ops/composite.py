"""aten ops that torch's composite functions decompose into, on SparseTensors.

``A.H``, ``torch.moveaxis``, ``torch.hstack``, ``torch.diff``, ``torch.linalg.matmul``,
``torch.nanmean``... are written in terms of other ops (``transpose``, ``permute``, ``cat``,
``slice``, ``mm``, ``sum``) that reach :func:`scorch._dispatch.torch_dispatch` with
the SparseTensor rather than its torch function.  Each handler here runs the torch-level sparse
implementation of that op instead of the dense fallback.  These calls sit below autograd, which
has recorded the aten op already: the implementations run under ``no_grad`` (no second graph),
and torch's derivative formulas -- again these ops -- take care of the backward.
"""

from __future__ import annotations

import functools

import torch

from .._dispatch import implements_aten
from ..errors import NotSupportedError
from ..tensor import SparseTensor
from . import linalg, reduce, shape

aten = torch.ops.aten


def _below_autograd(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return run


def _on(*ops):
    return lambda fn: implements_aten(*ops)(_below_autograd(fn))


@_on(aten.transpose.int)
def _transpose(self, dim0, dim1):
    return self.transpose(dim0, dim1)


@_on(aten.t.default)
def _t(self):
    return self.t()


@_on(aten.permute.default)
def _permute(self, dims):
    return self.permute(*dims)


@_on(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(self, size):
    return shape.reshape(self, tuple(size))


@_on(aten.unsqueeze.default)
def _unsqueeze(self, dim):
    return shape.unsqueeze(self, dim)


@_on(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(self, dim=None):
    return shape.squeeze(self, tuple(dim) if isinstance(dim, (list, tuple)) else dim)


@_on(aten.cat.default)
def _cat(tensors, dim=0):
    return shape.cat(list(tensors), dim)


@_on(aten.stack.default)
def _stack(tensors, dim=0):
    return shape.stack(list(tensors), dim)


@_on(aten.slice.Tensor)
def _slice(self, dim=0, start=None, end=None, step=1):
    d = shape._dim(dim, self.dim(), "slice")
    return shape.getitem(self, (slice(None),) * d + (slice(start, end, step),))


@_on(aten.select.int)
def _select(self, dim, index):
    return shape.select(self, dim, index)


@_on(aten.index_select.default)
def _index_select(self, dim, index):
    return shape.index_select(self, dim, index)


@_on(aten.flip.default)
def _flip(self, dims):
    return shape.flip(self, list(dims))


@_on(aten.mm.default)
def _mm(self, mat2):
    return linalg.matmul(self, mat2)   # (aten checked the ranks)


@_on(aten.sum.default)
def _sum_all(self, dtype=None):
    return reduce.sum_(self, dtype=dtype)


@_on(aten.sum.dim_IntList)
def _sum(self, dim, keepdim=False, dtype=None):
    return reduce.sum_(self, None if dim is None or len(dim) == 0 else tuple(dim), keepdim, dtype=dtype)


@_on(aten.mean.default)
def _mean_all(self, dtype=None):
    return reduce.mean(self, dtype=dtype)


@_on(aten.mean.dim)
def _mean(self, dim, keepdim=False, dtype=None):
    return reduce.mean(self, None if dim is None or len(dim) == 0 else tuple(dim), keepdim, dtype=dtype)


@_on(aten.linalg_vector_norm.default)
def _vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    return reduce.vector_norm(self, ord, dim, keepdim, dtype=dtype)


# ---------------------------------------------------------------- in-place views: t_, transpose_, squeeze_, unsqueeze_

def _in_place_view(out_of_place):
    """An in-place view op (``A.t_()``): ``A`` takes the out-of-place result's storage (the
    same arrays, re-described) and the wrapper's sizes and strides change as torch's own
    ``inplace_view`` ops change a tensor's -- by running the op's meta kernel on it, with
    dispatch off (what ``torch.utils._python_dispatch.return_and_correct_aliasing`` does for
    wrapper subclasses, without its storage aliasing: a SparseTensor has no storage)."""
    def register(*ops):
        for op in ops:
            def impl(self, *args, _op=op):
                with torch.no_grad():
                    new = out_of_place(self, *args)
                if not isinstance(new, SparseTensor):   # squeeze_ of a single element: 0-d, dense
                    raise NotSupportedError(f"{_op.overloadpacket.__name__}: the result would be 0-d, which a "
                                            "SparseTensor cannot be; use the out-of-place op (a dense scalar)")
                with torch.utils._mode_utils.no_dispatch():
                    meta = torch._C._meta_in_tls_dispatch_include()
                    torch._C._set_meta_in_tls_dispatch_include(True)
                    try:
                        _op(self, *args)
                    finally:
                        torch._C._set_meta_in_tls_dispatch_include(meta)
                self._become(new)
                return self
            implements_aten(op)(impl)
    return register


_in_place_view(lambda x: x.t())(aten.t_.default)
_in_place_view(lambda x, d0, d1: x.transpose(d0, d1))(aten.transpose_.default)
_in_place_view(lambda x, d: shape.unsqueeze(x, d))(aten.unsqueeze_.default)
_in_place_view(lambda x, d=None: shape.squeeze(x, tuple(d) if isinstance(d, (list, tuple)) else d))(
    aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims)


# ---------------------------------------------------------------- the backward of slicing a SparseTensor

@_on(aten.slice_backward.default)
def _slice_backward(grad, input_sizes, dim, start, end, step):
    """A sparse gradient of ``x[..., start:end:step]`` placed back at its positions in ``x``."""
    d = dim % len(input_sizes)
    size = input_sizes[d]
    start = min(max(start + size if start < 0 else start, 0), size)
    coords, ids = shape.entries(grad)
    coords[d] = start + coords[d] * step
    return shape.assemble(grad._format, list(input_sizes), coords, ids, grad.values(), grad.index_dtype)


@_on(aten.select_backward.default)
def _select_backward(grad, input_sizes, dim, index):
    """A sparse gradient of ``x.select(dim, index)``, with ``dim`` put back."""
    d = dim % len(input_sizes)
    index = index + input_sizes[d] if index < 0 else index
    coords, ids = shape.entries(grad)
    coords = torch.cat([coords[:d], torch.full((1, ids.numel()), index, dtype=torch.int64), coords[d:]])
    return shape.assemble(grad._format, list(input_sizes), coords, ids, grad.values(), grad.index_dtype)
