"""Torch-level operations over SparseTensors (shapes, broadcasting, ``dim=``),
built on the compiler.  Registered in the dispatch table so plain ``torch.*``
calls and operators on a SparseTensor land here."""

from . import binary, order, pointwise, reduce, replicate, shape  # noqa: F401  (register + - * /, pointwise, reductions, order, shape ops)
from .einsum import einsum, explain
from .linalg import matmul
from .rearrange import rearrange

__all__ = ["einsum", "explain", "matmul", "rearrange"]
