"""``scorch.nn``: every name of ``torch.nn``, plus scorch's sparse layers: ``GCNConv``,
``SAGEConv``, ``GATConv`` (graph layers on a SparseTensor / torch.sparse / edge_index
adjacency), ``SparseLinear`` (a pruned linear layer with a sparse weight), ``MoE``
(top-k gated mixture of experts computing only the selected experts),
``SparseAttention`` (multi-head attention over a sparse score pattern) and
``Recommender`` (LightFM-style scores from sparse multi-hot user / item features)."""

import torch.nn as _tnn

from . import functional  # noqa: F401  (scorch.nn.functional is scorch's, not torch's)
from .sparse_attention import SparseAttention, bigbird_pattern, window_pattern  # noqa: F401
from .gnn import GATConv, GCNConv, SAGEConv, gcn_norm  # noqa: F401
from .moe import MoE  # noqa: F401
from .recommender import Recommender  # noqa: F401
from .sparse_linear import SparseLinear  # noqa: F401


def __getattr__(name):
    try:
        return getattr(_tnn, name)
    except AttributeError:
        raise AttributeError(f"module 'scorch.nn' (and torch.nn) has no attribute {name!r}") from None


def __dir__():
    return sorted(set(globals()) | set(dir(_tnn)))
