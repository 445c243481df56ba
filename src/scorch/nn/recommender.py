"""A LightFM-style recommender on sparse multi-hot features: ``Recommender``.

Users and items are rows of sparse feature matrices (multi-hot: ids, tags,
categories).  A user's representation is the sum of its features' embeddings and
biases, ``x_u @ E_user`` and ``x_u . b_user`` (an SpMM and an SpMV over the
feature matrix), likewise for items; the score of a pair is
``<user_repr, item_repr> + user_bias + item_bias``.  Scores are computed either for
every (user, item) pair (a dense ``U x I`` matrix) or only for the pairs stored in a
sparse ``pairs`` pattern (candidates to rank, observed interactions): an SDDMM that
never forms the dense matrix.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ScorchTypeError, ScorchValueError
from ..interop import as_sparse, is_sparse
from ..ops.einsum import einsum
from ..tensor import SparseTensor

__all__ = ["Recommender"]


class Recommender(nn.Module):
    """``score(u, i) = <x_u E_user, y_i E_item> + x_u . b_user + y_i . b_item``.

    ``forward(user_features, item_features, pairs=None)``: feature matrices ``U x
    n_user_features`` and ``I x n_item_features`` (SparseTensor or torch.sparse, or dense);
    ``pairs`` (``U x I``, its stored entries are the pairs to score) gives a SparseTensor of
    scores in its pattern; without it the result is the dense ``U x I`` score matrix.
    Parameters: ``user_embedding``, ``item_embedding`` (``n x dim``, normal(0, 1/dim)
    initialised) and ``user_bias``, ``item_bias`` (zeros).
    """

    def __init__(self, n_user_features: int, n_item_features: int, dim: int, bias: bool = True):
        super().__init__()
        for name, v in (("n_user_features", n_user_features), ("n_item_features", n_item_features), ("dim", dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ScorchValueError(f"Recommender: {name} must be a positive int, got {v!r}")
        self.dim = dim
        self.user_embedding = nn.Parameter(torch.empty(n_user_features, dim))
        self.item_embedding = nn.Parameter(torch.empty(n_item_features, dim))
        self.user_bias = nn.Parameter(torch.zeros(n_user_features)) if bias else None
        self.item_bias = nn.Parameter(torch.zeros(n_item_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.user_embedding.normal_(0.0, 1.0 / self.dim)
            self.item_embedding.normal_(0.0, 1.0 / self.dim)
            for b in (self.user_bias, self.item_bias):
                if b is not None:
                    b.zero_()

    def extra_repr(self) -> str:
        return (f"n_user_features={self.user_embedding.shape[0]}, n_item_features={self.item_embedding.shape[0]}, "
                f"dim={self.dim}, bias={self.user_bias is not None}")

    def representations(self, features, table: torch.Tensor, bias, side: str):
        """``(features @ table, features @ bias or None)`` for one side (``side`` names it in errors)."""
        if not isinstance(features, torch.Tensor):
            raise ScorchTypeError(f"Recommender: {side}_features must be a tensor (SparseTensor, torch.sparse or "
                                  f"dense), got {type(features).__name__}")
        if features.dim() != 2 or features.shape[1] != table.shape[0]:
            raise ScorchValueError(f"Recommender: {side}_features must have shape (n, {table.shape[0]}), "
                                   f"got {tuple(features.shape)}")
        feats = features if isinstance(features, SparseTensor) or not is_sparse(features) else as_sparse(features)
        if not features.dtype.is_floating_point:   # multi-hot 0/1 or count features: the model's float dtype
            feats = feats.to(table.dtype)          # (the table cast to an integer type truncated it to zeros)
        dtype = feats.dtype
        rep = feats @ table.to(dtype)
        return rep, (None if bias is None else feats @ bias.to(dtype))

    def forward(self, user_features, item_features, pairs=None):
        U, ub = self.representations(user_features, self.user_embedding, self.user_bias, "user")
        V, ib = self.representations(item_features, self.item_embedding, self.item_bias, "item")
        if pairs is None:
            scores = U @ V.t()
            return scores if ub is None else scores + ub.unsqueeze(1) + ib.unsqueeze(0)
        if not isinstance(pairs, SparseTensor):
            if not is_sparse(pairs):
                raise ScorchTypeError(f"Recommender: pairs must be a SparseTensor or torch.sparse tensor, "
                                      f"got {type(pairs).__name__}")
            pairs = as_sparse(pairs)
        if tuple(pairs.shape) != (U.shape[0], V.shape[0]):
            raise ScorchValueError(f"Recommender: pairs must have shape (users, items) = ({U.shape[0]}, "
                                   f"{V.shape[0]}), got {tuple(pairs.shape)}")
        mask = pairs._like(values=torch.ones(pairs._vals.shape, dtype=U.dtype), nnz=pairs._stored)
        if ub is not None:
            # [U, ub, 1] . [V, 1, ib] = <U, V> + ub + ib: the biases ride in the same SDDMM; zero
            # columns pad the width to whole vectors (16 floats)
            pad = (-(self.dim + 2)) % (16 if U.dtype == torch.float32 else 8)
            U = torch.cat([U, ub.unsqueeze(1), U.new_ones(U.shape[0], 1), U.new_zeros(U.shape[0], pad)], 1)
            V = torch.cat([V, V.new_ones(V.shape[0], 1), ib.unsqueeze(1), V.new_zeros(V.shape[0], pad)], 1)
        return einsum("ui,uk,ik->ui", mask, U, V)                  # SDDMM: only the stored pairs
