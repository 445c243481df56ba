"""Torch-level operations over SparseTensors (shapes, broadcasting, ``dim=``),
built on the compiler.  Registered in the dispatch table so plain ``torch.*``
calls and operators on a SparseTensor land here."""

from .linalg import matmul

__all__ = ["matmul"]
