"""Torch-level operations over SparseTensors (shapes, broadcasting, ``dim=``),
built on the compiler.  Registered in the dispatch table so plain ``torch.*``
calls and operators on a SparseTensor land here."""

import torch as _torch

# importing each module registers its ops in the dispatch table
from . import (activations, assign, binary, composite, conv, gather, matrix, on_dense, order,  # noqa: F401
               pointwise, reduce, replicate, shape, statistics, unguarded)
from .._dispatch import autocast_lower_precision
from .einsum import explain
from .einsum import public_einsum as einsum
from .linalg import matmul
from .rearrange import rearrange

__all__ = ["einsum", "explain", "matmul", "rearrange"]

autocast_lower_precision(   # the ops torch's CPU autocast runs in its dtype: under torch.autocast, its dtype
    _torch.matmul, _torch.Tensor.matmul, _torch.Tensor.__matmul__, _torch.Tensor.__rmatmul__, _torch.mm,
    _torch.Tensor.mm, _torch.bmm, _torch.Tensor.bmm, _torch.addmm, _torch.Tensor.addmm, _torch.sparse.addmm,
    _torch.baddbmm, _torch.Tensor.baddbmm, _torch.addbmm, _torch.Tensor.addbmm, _torch.inner, _torch.Tensor.inner,
    _torch.tensordot, _torch.einsum, _torch.sparse.mm, _torch.nn.functional.linear, _torch.conv1d, _torch.conv2d,
    _torch.conv3d, _torch.conv_transpose1d, _torch.conv_transpose2d, _torch.conv_transpose3d)
