"""Chains of ops on SparseTensors against the same chains on dense tensors.

Each example draws a SparseTensor and applies up to four ops from a table of torch calls
that keep a tensor sparse (shape ops, pointwise ops, products, replication, reductions along
a dim...), feeding each result, in whatever format the op chose, into the next.  Oracle: the
same chain on the dense tensor with plain torch.  The dense fallback is set to raise, so a
step that silently densified would fail here; a final dense reduction checks values too.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import scorch
from scorch import SparseTensor

from test_shape_ops import SETTINGS, sparse_tensors


@pytest.fixture(autouse=True)
def no_dense_fallback(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")


def dense(y):
    return y.to_dense() if isinstance(y, SparseTensor) else y


# name -> (applies to this dense value?, the op: same call on the sparse and the dense tensor)
STEPS = {
    "t": (lambda x: x.dim() == 2, lambda t, x: t.t()),
    "transpose": (lambda x: x.dim() >= 2, lambda t, x: t.transpose(0, -1)),
    "permute": (lambda x: x.dim() >= 2, lambda t, x: t.permute(*reversed(range(x.dim())))),
    "flatten": (lambda x: True, lambda t, x: t.flatten()),
    "unsqueeze": (lambda x: x.dim() < 4, lambda t, x: t.unsqueeze(0)),
    "reshape": (lambda x: x.numel() % 2 == 0 and x.numel() > 0, lambda t, x: t.reshape(2, -1)),
    "slice": (lambda x: x.shape[0] > 1, lambda t, x: t[1:]),
    "select": (lambda x: x.dim() >= 2 and x.shape[0] > 0, lambda t, x: t[0]),
    "flip": (lambda x: True, lambda t, x: t.flip(0)),
    "roll": (lambda x: True, lambda t, x: t.roll(1, 0)),
    "tril": (lambda x: x.dim() >= 2, lambda t, x: t.tril()),
    "mul scalar": (lambda x: True, lambda t, x: t * 3),
    "neg": (lambda x: True, lambda t, x: -t),
    "relu": (lambda x: True, lambda t, x: torch.relu(t)),
    "square": (lambda x: True, lambda t, x: t * t),
    "add self": (lambda x: True, lambda t, x: t + t),
    "sub flipped": (lambda x: True, lambda t, x: t - t.flip(0)),
    "mul flipped": (lambda x: True, lambda t, x: t * t.flip(0)),
    "mul dense row": (lambda x: True, lambda t, x: t * torch.linspace(-1, 1, x.shape[-1], dtype=x.dtype)),
    "maximum flipped": (lambda x: True, lambda t, x: torch.maximum(t, t.flip(0))),
    "where flipped": (lambda x: True, lambda t, x: torch.where(t > 0, t, t.flip(0))),
    # + 0.0: atan2 tells -0.0 (what neg gives a dense zero) from +0.0 (an absent entry, as in torch.sparse)
    "atan2 rolled": (lambda x: True, lambda t, x: torch.atan2(t + 0.0, t.roll(1, 0) + 0.0)),
    "pad": (lambda x: x.shape[-1] > 0, lambda t, x: torch.nn.functional.pad(t, (1, -1))),  # (dense torch refuses 0)
    "mul_ mask": (lambda x: True, lambda t, x: t.clone().mul_((torch.arange(x.shape[-1]) % 2).to(x.dtype))),
    "cat": (lambda x: True, lambda t, x: torch.cat([t, t], 0)),
    "stack": (lambda x: x.dim() < 4, lambda t, x: torch.stack([t, t], 1)),
    "repeat": (lambda x: x.dim() < 4, lambda t, x: t.repeat(*([1] * (x.dim() - 1)), 2)),
    "expand": (lambda x: x.dim() < 4, lambda t, x: t.unsqueeze(0).expand(2, *x.shape)),
    "repeat_interleave": (lambda x: True, lambda t, x: t.repeat_interleave(2, dim=0)),
    "sum dim": (lambda x: x.dim() >= 2, lambda t, x: t.sum(dim=0)),
    "matmul self^T": (lambda x: x.dim() == 2, lambda t, x: t @ t.t()),
    "matmul dense": (lambda x: x.dim() == 2, lambda t, x: t @ torch.ones(x.shape[1], 3, dtype=x.dtype)),
    "index_select": (lambda x: x.shape[0] > 0, lambda t, x: t.index_select(0, torch.tensor([x.shape[0] - 1, 0]))),
    "diag_embed": (lambda x: x.dim() < 3, lambda t, x: torch.diag_embed(t)),
    "kron": (lambda x: x.dim() <= 2 and x.numel() <= 64, lambda t, x: torch.kron(t, t)),
    "asformat coo": (lambda x: True, lambda t, x: t.asformat("coo") if isinstance(t, SparseTensor) else t),
    "asformat csr": (lambda x: x.dim() >= 1, lambda t, x: t.asformat("csr") if isinstance(t, SparseTensor) else t),
}

FINALS = {
    "to_dense": lambda t: dense(t),
    "sum": lambda t: t.sum(),
    "amax dim 0": lambda t: t.amax(dim=0) if t.dim() and t.shape[0] else dense(t),
    "norm": lambda t: torch.linalg.vector_norm(t),
    "topk": lambda t: torch.topk(t, min(2, t.shape[-1]), dim=-1).values if t.dim() else dense(t),
    "median": lambda t: torch.median(t, dim=-1).values if t.dim() and t.shape[-1] else dense(t),
    "points": lambda t: t[(torch.arange(min(t.shape) if t.numel() else 0),) * t.dim()] if t.dim() else dense(t),
    "logsumexp": lambda t: torch.logsumexp(t, dim=-1) if t.dim() else dense(t),
}


@SETTINGS
@given(st.data())
def test_op_chains_match_dense(data):
    A, x = data.draw(sparse_tensors(max_dims=3))
    if not x.dtype.is_floating_point:
        return
    names = []
    for _ in range(data.draw(st.integers(1, 4))):
        if not isinstance(A, SparseTensor) or x.numel() > 4096:
            break
        usable = [n for n, (ok, _) in STEPS.items() if ok(x)]
        name = data.draw(st.sampled_from(usable))
        names.append(name)
        f = STEPS[name][1]
        # the oracle contiguous: torch.median of an expanded (stride-0) view, transposed, reads
        # the wrong elements (torch 2.13: median([1.54, 1.54]) gave -0.29)
        A, x = f(A, x), f(x, x).contiguous()
        assert tuple(A.shape) == tuple(x.shape), (names, A.shape, x.shape)
        torch.testing.assert_close(dense(A), x, msg=lambda m: f"{names}: {m}")
    final = data.draw(st.sampled_from(list(FINALS)))
    torch.testing.assert_close(dense(FINALS[final](A)), FINALS[final](x), msg=lambda m: f"{names} + {final}: {m}")


@SETTINGS
@given(st.data())
def test_op_chain_gradients_match_dense(data):
    """The same chains under autograd: the gradient w.r.t. the stored values equals the dense
    gradient read at the stored positions."""
    A0, x0 = data.draw(sparse_tensors(max_dims=3))
    if x0.dtype != torch.float64:
        return
    A = A0.detach().clone().requires_grad_()
    xg = x0.clone().requires_grad_()
    a, x = A, xg
    names = []
    for _ in range(data.draw(st.integers(1, 3))):
        if not isinstance(a, SparseTensor) or x.numel() > 4096:
            break
        usable = [n for n, (ok, _) in STEPS.items() if ok(x.detach())]
        name = data.draw(st.sampled_from(usable))
        names.append(name)
        f = STEPS[name][1]
        a, x = f(a, x), f(x, x)
    weights = torch.linspace(-1, 2, x.numel(), dtype=torch.float64).reshape(x.shape)
    (dense(a) * weights).sum().backward()
    (x * weights).sum().backward()
    assert isinstance(A.grad, SparseTensor) and A.grad.nnz == A.nnz, names
    stored = A0.with_values(torch.ones_like(A0.values())).to_dense() != 0   # the pattern, explicit zeros too
    torch.testing.assert_close(A.grad.to_dense(), xg.grad * stored, msg=lambda m: f"{names}: {m}")
