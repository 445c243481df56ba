"""Torch-level operations over SparseTensors (shapes, broadcasting, ``dim=``),
built on the compiler.  Registered in the dispatch table so plain ``torch.*``
calls and operators on a SparseTensor land here."""

# importing each module registers its ops in the dispatch table
from . import (activations, binary, composite, conv, gather, matrix, order, pointwise, reduce, replicate,  # noqa: F401
               shape, statistics, unguarded)
from .einsum import einsum, explain
from .linalg import matmul
from .rearrange import rearrange

__all__ = ["einsum", "explain", "matmul", "rearrange"]
