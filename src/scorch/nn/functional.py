"""``scorch.nn.functional``: every name of ``torch.nn.functional``; scorch overrides
the ones it implements sparsely (the ops issue fills these in)."""

import torch.nn.functional as _tF


def __getattr__(name):
    try:
        return getattr(_tF, name)
    except AttributeError:
        raise AttributeError(
            f"module 'scorch.nn.functional' (and torch.nn.functional) has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(_tF)))
