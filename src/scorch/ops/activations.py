"""``torch.nn.functional`` activations written in Python over other ops (``glu``, ``softsign``,
``rrelu``, the alpha dropouts, channel dropout, ``gumbel_softmax``) on a SparseTensor.  torch runs
such a function's body with subclass handling off once it has been handed over, so its inner ops would reach the dense
fallback; here they are spelled with scorch's sparse ops instead."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._dispatch import implements
from ..errors import NotSupportedError, ScorchValueError
from ._pattern import project


@implements(F.glu)
def glu(input, dim=-1):
    """``a * sigmoid(b)`` for the halves ``a, b`` of ``input`` along ``dim``: sparse in ``a``'s
    pattern (``sigmoid(b)`` is dense: sigmoid(0) = 1/2)."""
    n = input.dim()
    if not -n <= dim < n or input.shape[dim] % 2:
        raise ScorchValueError(f"glu: the size {tuple(input.shape)[dim] if -n <= dim < n else None} of dim {dim} "
                               f"of input {tuple(input.shape)} must exist and be even")
    a, b = input.chunk(2, dim)
    return a * torch.sigmoid(b)


@implements(F.softsign)
def softsign(input):
    """``x / (1 + |x|)``: zero where ``x`` is, so a SparseTensor keeps its pattern."""
    return input.with_values(F.softsign(input.values()))


@implements(F.rrelu)
def rrelu(input, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """Randomised leaky ReLU on the stored values (a random slope per stored negative entry in
    training): zero where ``input`` is, the pattern kept; ``inplace`` updates the stored values."""
    if inplace:
        if torch.is_grad_enabled() and input.requires_grad:   # the values' update would escape autograd
            raise ScorchValueError("rrelu: inplace=True on a SparseTensor that requires grad is not supported; "
                                   "use inplace=False")
        F.rrelu(input._vals, lower, upper, training, inplace=True)
        torch.autograd.graph.increment_version(input)
        return input
    return input.with_values(F.rrelu(input.values(), lower, upper, training))


def _alpha(name, dense_op):
    def alpha_dropout(input, p=0.5, training=False, inplace=False):
        """Identity out of training; in training dropped entries become a nonzero constant and
        the rest an affine map of themselves: dense by definition, computed on the dense tensor."""
        if not 0 <= p <= 1:
            raise ScorchValueError(f"{name}: dropout probability has to be between 0 and 1, but got {p}")
        if not training or p == 0:
            return input
        if inplace:
            raise NotSupportedError(f"{name}: in place on a SparseTensor is not supported (the result is dense); "
                                    "use inplace=False")
        return dense_op(input.to_dense(), p, training)
    alpha_dropout.__name__ = name
    return alpha_dropout


implements(F.alpha_dropout)(_alpha("alpha_dropout", F.alpha_dropout))
implements(F.feature_alpha_dropout)(_alpha("feature_alpha_dropout", F.feature_alpha_dropout))


def _feature_dropout(inplace: bool):
    def feature_dropout(input, p, train):
        """Channel dropout (``F.dropout1d/2d/3d`` run it): each ``input[n, c]`` kept whole, scaled by
        ``1 / (1 - p)``, or dropped -- ``input`` times a dense ``(N, C, 1, ...)`` noise drawn as torch
        draws it, so the result stays in ``input``'s pattern (``inplace``: the stored values)."""
        if not 0 <= p <= 1:
            raise ScorchValueError(f"feature_dropout: dropout probability has to be between 0 and 1, but got {p}")
        if not train or p == 0 or input.numel() == 0:
            return input
        if input.dim() < 2:
            raise ScorchValueError(f"feature_dropout: input must have a batch and a channel dim, got "
                                   f"{tuple(input.shape)}")
        if p == 1:
            noise = torch.zeros((), dtype=input.dtype)
        else:
            noise = torch.empty(*input.shape[:2], *[1] * (input.dim() - 2), dtype=input.dtype)
            noise.bernoulli_(1 - p).div_(1 - p)
        return input.mul_(noise) if inplace else input * noise
    feature_dropout.__name__ = "feature_dropout_" if inplace else "feature_dropout"
    return feature_dropout


implements(torch.feature_dropout)(_feature_dropout(False))
implements(torch.feature_dropout_)(_feature_dropout(True))


@implements(F.gumbel_softmax)
def gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
    """``F.gumbel_softmax`` of sparse logits: Gumbel noise on the stored entries, then the sparse
    softmax (absent entries are -inf, as torch.sparse's softmax: they never win), in the logits'
    pattern; ``hard``: the straight-through one-hot of each slice's winner.  (torch's body drew
    noise for the stored entries only, then took log(0) at the absent ones: NaN.)"""
    noise = -torch.empty_like(logits._vals).exponential_().log()   # (logits: the call's only tensor, sparse)
    y_soft = torch.softmax(logits.with_values((logits.values() + noise) / tau), dim)
    if not hard:
        return y_soft
    soft = y_soft.detach().to_dense()
    y_hard = torch.zeros_like(soft).scatter_(dim, soft.argmax(dim, keepdim=True), 1.0)
    return y_soft.with_values(project(y_hard, y_soft) - y_soft.values().detach() + y_soft.values())
