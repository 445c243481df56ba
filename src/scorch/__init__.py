"""scorch: sparse tensors as first-class citizens of PyTorch.

``import scorch as torch`` gives every name of ``torch``; scorch's own names
(below) add sparse tensors in any level format.

>>> import scorch as torch
>>> A = torch.as_sparse(torch.eye(3), format="csr")
>>> A.to_dense().equal(torch.eye(3))
True
"""

import torch as _torch

from . import _alias, config, formats
from .errors import InternalError, NotSupportedError, ScorchError, ScorchTypeError, ScorchValueError
from .format import Format, Level, compressed, dense, padded, singleton
from .interop import as_sparse, is_sparse, from_coo
from .tensor import SparseTensor
from . import _dispatch  # noqa: F401  (registers the dispatch table)
from .ops import einsum, explain, rearrange
from . import nn  # noqa: E402
from . import sparsify  # noqa: E402
from . import schedule  # noqa: E402

_alias.install()

# scorch's own public submodules named like torch's names (tensor, ops, compiler): importing them bound
# them as attributes of this package, hiding torch's -- `import scorch as torch; torch.tensor([1])`
# called a module.  The package's attributes are torch's; the submodules stay importable by their
# full names (``from scorch.compiler import build``).
for _name, _obj in list(globals().items()):
    if (type(_obj).__name__ == "module" and _obj.__name__ == f"{__name__}.{_name}" and _name != "nn"
            and not _name.startswith("_") and hasattr(_torch, _name)):
        globals()[_name] = getattr(_torch, _name)
del _name, _obj

# torch's own, so that a drop-in program's version checks and (TorchScript, torch-function modes)
# identity checks see torch: `matmul` with a SparseTensor operand reaches scorch through
# __torch_function__ all the same.  scorch's version: scorch._version.__version__.
__version__ = _torch.__version__
matmul = _torch.matmul

_OURS = [
    "SparseTensor", "Format", "Level", "dense", "compressed", "singleton", "padded", "formats",
    "as_sparse", "from_coo", "is_sparse", "einsum", "explain", "rearrange", "config", "nn", "sparsify", "schedule",
    "ScorchError", "ScorchValueError", "ScorchTypeError", "NotSupportedError", "InternalError",
]
__all__ = sorted(set(getattr(_torch, "__all__", ())) | set(_OURS))   # `from scorch import *` as from torch's


def __getattr__(name):
    try:
        value = getattr(_torch, name)
    except AttributeError:
        raise AttributeError(f"module 'scorch' (and torch) has no attribute {name!r}") from None
    if callable(value) or isinstance(value, type(_torch)):   # a function, class or module: kept (the
        globals()[name] = value                               # next lookup skips this hook)
    return value


def __dir__():
    return sorted(set(globals()) | set(dir(_torch)))
