"""``scorch.nn``: every name of ``torch.nn``, plus scorch's sparse layers (as they land)."""

import torch.nn as _tnn

from . import functional  # noqa: F401  (scorch.nn.functional is scorch's, not torch's)


def __getattr__(name):
    try:
        return getattr(_tnn, name)
    except AttributeError:
        raise AttributeError(f"module 'scorch.nn' (and torch.nn) has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(_tnn)))
