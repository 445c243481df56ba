"""The sparse tensor-algebra compiler: einsum -> schedule -> loop IR -> C -> kernel.

Stages (each a function from one IR to the next): :mod:`.notation` (parse),
:mod:`.schedule` (loop order, output format, parallel strategy),
:mod:`.lower` (loop IR), :mod:`.codegen` (C text), :mod:`.build` (compile,
cache, load); :mod:`.driver` runs them top to bottom.
"""

from .driver import Plan, einsum, explain

__all__ = ["einsum", "explain", "Plan"]
