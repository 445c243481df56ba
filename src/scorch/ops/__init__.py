"""Torch-level operations over SparseTensors (shapes, broadcasting, ``dim=``),
built on the compiler.  Registered in the dispatch table so plain ``torch.*``
calls and operators on a SparseTensor land here."""

from . import binary, pointwise, reduce  # noqa: F401  (register + - * /, pointwise ops, reductions)
from .einsum import einsum
from .linalg import matmul

__all__ = ["einsum", "matmul"]
