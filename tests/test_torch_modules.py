"""torch.nn modules holding sparse parameters (pruned attention and transformer layers): the
forward and the masked gradients against the same modules with masked dense weights, every
product through scorch (no dense fallback)."""

import copy

import pytest
import torch
from torch import nn

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def sparsified(module, density=0.3, seed=0):
    """``module`` with every 2-d weight pruned at random into a CSR parameter, and a copy of it
    with the same weights masked densely; the masks by parameter name."""
    g = torch.Generator().manual_seed(seed)
    ref, masks = copy.deepcopy(module), {}
    for name, p in list(module.named_parameters()):
        if p.dim() == 2 and p.shape[0] > 1:
            masks[name] = torch.rand(p.shape, generator=g) < density
            owner, attr = (module.get_submodule(name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]) if "." in name \
                else (module, name)
            setattr(owner, attr, nn.Parameter(scorch.as_sparse(p.detach() * masks[name], "csr")))
            with torch.no_grad():
                ref.get_parameter(name).mul_(masks[name])
    return module, ref, masks


CASES = {
    "mha, packed projections": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                                lambda m, x: m(x, x, x, need_weights=False)[0], (2, 5, 8)),
    "mha, mask and weights": (lambda: nn.MultiheadAttention(8, 2),
                              lambda m, x: m(x, x, x, attn_mask=torch.eye(5, dtype=torch.bool))[0], (5, 2, 8)),
    "mha, kdim / vdim": (lambda: nn.MultiheadAttention(8, 2, kdim=6, vdim=5),
                         lambda m, x: m(x, x[:, :, :6], x[:, :, :5])[0], (5, 2, 8)),
    "mha, bias_kv, zero_attn": (lambda: nn.MultiheadAttention(8, 4, add_bias_kv=True, add_zero_attn=True),
                                lambda m, x: m(x, x, x)[0], (5, 2, 8)),
    "transformer encoder layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                  lambda m, x: m(x), (2, 5, 8)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pruned_attention_modules_match_masked_dense(case, monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")
    make, run, shape = CASES[case]
    torch.manual_seed(0)
    model, ref, masks = sparsified(make().double())
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got, want = run(model, x), run(ref, x)
    torch.testing.assert_close(got, want)
    (got * torch.arange(got.numel(), dtype=got.dtype).view(got.shape)).sum().backward()
    (want * torch.arange(want.numel(), dtype=want.dtype).view(want.shape)).sum().backward()
    for name, mask in masks.items():
        grad = model.get_parameter(name).grad
        assert isinstance(grad, scorch.SparseTensor)
        torch.testing.assert_close(grad.to_dense(), ref.get_parameter(name).grad * mask)


def test_linear_with_a_sparse_weight_gives_a_batch_torch_can_view(monkeypatch):
    """F.linear over a 3-d batch returns a contiguous result (``.view`` merging dims works, as after
    a dense linear); over a 2-d batch the transposed view the next layer reads without a copy."""
    monkeypatch.setattr(scorch.config, "dense_fallback", "raise")
    w = torch.randn(6, 8, dtype=torch.float64) * (torch.rand(6, 8) < 0.4)
    W, x = scorch.as_sparse(w, "csr"), torch.randn(3, 4, 8, dtype=torch.float64)
    y = torch.nn.functional.linear(x, W)
    assert y.is_contiguous()
    torch.testing.assert_close(y.view(12, 6), (x @ w.t()).view(12, 6))
    torch.testing.assert_close(torch.nn.functional.linear(x[0], W), x[0] @ w.t())


def test_only_functions_with_a_guard_get_an_unguarded_copy():
    import sys
    unguarded = sys.modules["scorch.ops.unguarded"]
    body = unguarded._without_guard(torch.nn.functional.multi_head_attention_forward)
    assert body is not None and body.__defaults__ == torch.nn.functional.multi_head_attention_forward.__defaults__
    assert unguarded._without_guard(torch.nn.functional._verify_batch_size) is None   # no guard
    assert unguarded._without_guard(sparsified) is None
