"""Error types: one base class, split by who has to act.

* ``ScorchValueError`` / ``ScorchTypeError``: the caller passed something wrong;
  the message names the argument, what was expected and what came.  They are
  subclasses of the builtin ``ValueError`` / ``TypeError`` so plain ``except``
  clauses keep working.
* ``NotSupportedError``: valid input that scorch cannot handle yet; the message
  names the operation, the formats and a workaround.
* ``CompilerError``: the configured C compiler or flags fail (the message names them).
* ``InternalError``: a scorch bug ("please report").
"""

from __future__ import annotations


class ScorchError(Exception):
    """Base class of every error scorch raises on purpose."""


class ScorchValueError(ScorchError, ValueError):
    """A bad value: out-of-range index, wrong shape, unknown format name..."""


class ScorchIndexError(ScorchValueError, IndexError):
    """An index or dim out of range (an ``IndexError`` too, as torch raises)."""


class ScorchTypeError(ScorchError, TypeError):
    """A bad type: float indices, a non-tensor where a tensor is needed..."""


class NotSupportedError(ScorchError, NotImplementedError):
    """Valid input that scorch does not handle yet."""


class CompilerError(ScorchError, RuntimeError):
    """The C compiler scorch was told to use (``SCORCH_CC`` / ``SCORCH_CFLAGS``) fails to build a
    kernel: the message names the settings and shows the compiler's errors."""


class InternalError(ScorchError, RuntimeError):
    """An invariant broke inside scorch; please report it with the traceback."""

    def __init__(self, msg: str):
        super().__init__(f"{msg} (this is a scorch bug; please report it)")
