"""``scorch.nn.moe.MoE`` and ``scorch.nn.sparse_attention.SparseAttention`` against dense oracles
written in plain torch in this file (the seed's one-hot MoE, dense masked attention)."""

import math

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.nn.sparse_attention import SparseAttention
from scorch.nn.moe import MoE

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


# ---------------------------------------------------------------- MoE

def seed_moe(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """The seed program's dense formulation with m's parameters: one-hot (top-k softmax)
    dense gates, every expert on every token, then ``einsum("bnd,bn->bd")``."""
    logits = x @ m.gate
    top, idx = logits.topk(m.k, dim=1)
    gates = torch.zeros_like(logits).scatter(1, idx, torch.softmax(top, dim=1))
    if m.k == 1:
        assert torch.equal(gates, torch.nn.functional.one_hot(logits.argmax(1), m.n_experts).to(x.dtype))
    x_dispatch = x.unsqueeze(1).expand(-1, m.n_experts, -1)
    y_experts = torch.einsum("bnd,ndh->bnh", x_dispatch, m.E)
    if m.bias is not None:
        y_experts = y_experts + m.bias
    return torch.einsum("bnd,bn->bd", y_experts, gates)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grad", [True, False])   # the autograd path, and the inference path
def test_moe_matches_seed_dense(k, bias, grad):
    torch.manual_seed(k)
    m = MoE(16, 12, 8, k=k, bias=bias)
    x = torch.randn(32, 16)
    want = seed_moe(m, x)
    with torch.set_grad_enabled(grad):
        torch.testing.assert_close(m(x), want)
        torch.testing.assert_close(m.dense_reference(x), want)
        x3 = x.double().view(4, 8, 16)   # leading dims, float64, and experts nobody picked
        torch.testing.assert_close(m.double()(x3), seed_moe(m, x.double()).view(4, 8, 12))


@pytest.mark.parametrize("k", [1, 2])
def test_moe_gates_are_sparse_k_per_row(k):
    torch.manual_seed(0)
    m = MoE(16, 12, 8, k=k)
    x = torch.randn(32, 16)
    G = m.gates(x)
    assert isinstance(G, scorch.SparseTensor) and G.format.name == "csr" and G.shape == (32, 8)
    assert G.nnz == 32 * k
    dense = G.to_dense()
    assert torch.equal((dense != 0).sum(1), torch.full((32,), k))
    torch.testing.assert_close(dense.sum(1), torch.ones(32))
    top = (x @ m.gate).topk(k, dim=1).indices
    assert torch.equal(dense.gather(1, top) > 0, torch.ones(32, k, dtype=torch.bool))


def test_moe_gradients_match_dense():
    torch.manual_seed(1)
    m = MoE(10, 6, 8, k=2)
    x = torch.randn(32, 10, requires_grad=True)
    params = [x, m.gate, m.E, m.bias]
    g1 = torch.autograd.grad(m(x).pow(2).sum(), params)
    g2 = torch.autograd.grad(seed_moe(m, x).pow(2).sum(), params)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("k", [1, 2])
def test_moe_gradcheck(k):
    torch.manual_seed(2)
    m = MoE(4, 3, 5, k=k).double()
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    E = m.E.detach().clone().requires_grad_()

    def f(x, E):
        return torch.func.functional_call(m, {"E": E}, (x,))

    assert torch.autograd.gradcheck(f, (x, E))


def test_moe_leading_dims_and_errors():
    m = MoE(8, 4, 3, k=2)
    x = torch.randn(2, 5, 8)
    out = m(x)
    assert out.shape == (2, 5, 4)
    torch.testing.assert_close(out, seed_moe(m, x.reshape(10, 8)).view(2, 5, 4))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., d_in\) = \(\.\.\., 8\), got \(4, 7\)"):
        m(torch.randn(4, 7))
    with pytest.raises(ValueError, match="k must be at most n_experts = 3, got 4"):
        MoE(8, 4, 3, k=4)
    with pytest.raises(ValueError, match="n_experts must be a positive int"):
        MoE(8, 4, 0)


# ---------------------------------------------------------------- SparseAttention

def dense_attention(att: SparseAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Independent oracle: multi-head attention with scores -inf outside ``mask``."""
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    B, L, E = x3.shape
    H, d = att.num_heads, E // att.num_heads
    q, k, v = att.in_proj(x3).chunk(3, dim=-1)
    q, k, v = (t.reshape(B, L, H, d).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    o = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    out = att.out_proj(o.transpose(1, 2).reshape(B, L, E))
    return out if x.dim() == 3 else out[0]


def window_mask(L, window):
    i = torch.arange(L)
    return (i[:, None] - i[None, :]).abs() <= window // 2


@pytest.mark.parametrize("L", [16, 64])
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("batched", [False, True])
def test_window_attention_matches_dense(L, heads, batched):
    torch.manual_seed(L + heads)
    att = SparseAttention(8, heads, pattern="window", window=6)
    x = torch.randn(*((3,) if batched else ()), L, 8)
    want = dense_attention(att, x, window_mask(L, 6))
    out = att(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(att.dense_reference(x), want)
    assert torch.equal(att.pattern_mask(L), window_mask(L, 6))


def test_attention_on_generated_dense_products(monkeypatch):
    """Projections of whole vectors (in_proj 48, out_proj 16 float64 lanes) forced onto the
    generated dense kernel (scorch.config.dense_kernels): forward and gradients."""
    from scorch.compiler import driver
    monkeypatch.setattr(scorch.config, "dense_kernels", "compiled")
    calls = []
    compiled = driver.compiled
    monkeypatch.setattr(driver, "compiled", lambda *a: calls.append(a[0]) or compiled(*a))
    torch.manual_seed(3)
    att = SparseAttention(16, 2, pattern="window", window=6).double()
    x = torch.randn(40, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(att(x), dense_attention(att, x, window_mask(40, 6)))
    assert calls == ["ij,jk->ik", "ij,jk->ik"]
    xg = x[:12].clone().requires_grad_()
    torch.autograd.gradcheck(lambda x: att(x), (xg,), fast_mode=True)


@pytest.mark.parametrize("L", [16, 64])
@pytest.mark.parametrize("heads", [1, 2])
def test_bigbird_attention_matches_dense(L, heads):
    torch.manual_seed(7)
    att = SparseAttention(8, heads, pattern="bigbird", window=4, global_tokens=2, random_blocks=1, block=8)
    mask = att.pattern_mask(L)
    # independent checks of the pattern: window + global rows/cols + random key blocks per query block
    g = torch.zeros(L, L, dtype=torch.bool)
    g[:2], g[:, :2] = True, True
    assert torch.equal(mask & (window_mask(L, 4) | g), window_mask(L, 4) | g)
    blocks = mask.view(L // 8, 8, L // 8, 8).all(3).all(1)   # query block x key block fully set
    assert bool((blocks.sum(1) >= 1).all())
    extra = mask & ~(window_mask(L, 4) | g)
    assert torch.equal(extra, extra & blocks.repeat_interleave(8, 0).repeat_interleave(8, 1))
    x = torch.randn(2, L, 8)
    torch.testing.assert_close(att(x), dense_attention(att, x, mask))


def test_bigbird_without_random_is_window_plus_global():
    att = SparseAttention(8, 2, pattern="bigbird", window=4, global_tokens=3)
    L = 16
    g = torch.zeros(L, L, dtype=torch.bool)
    g[:3], g[:, :3] = True, True
    assert torch.equal(att.pattern_mask(L), window_mask(L, 4) | g)
    x = torch.randn(L, 8)
    torch.testing.assert_close(att(x), dense_attention(att, x, window_mask(L, 4) | g))


def test_bigbird_pattern_is_seeded_and_cached():
    a1 = SparseAttention(8, 1, pattern="bigbird", window=2, random_blocks=2, block=4, seed=3)
    a2 = SparseAttention(8, 1, pattern="bigbird", window=2, random_blocks=2, block=4, seed=3)
    assert torch.equal(a1.pattern_mask(32), a2.pattern_mask(32))
    assert a1.pattern_coords(32) is a1.pattern_coords(32)
    x = torch.randn(32, 8)
    a1(x)
    M = a1._sparse_mask(32, 1, x.dtype, None)
    a1(x)
    assert a1._sparse_mask(32, 1, x.dtype, None) is M


@pytest.mark.parametrize("L", [16, 64])
@pytest.mark.parametrize("as_sparse", [False, True])
def test_user_mask_matches_dense(L, as_sparse):
    torch.manual_seed(L)
    mask = torch.rand(L, L) < 0.2
    mask.fill_diagonal_(True)
    att = SparseAttention(8, 2)
    x = torch.randn(2, L, 8)
    user = scorch.as_sparse(mask.float(), "csr") if as_sparse else mask
    want = dense_attention(att, x, mask)
    torch.testing.assert_close(att(x, mask=user), want)
    torch.testing.assert_close(att.dense_reference(x, mask), want)


def test_a_sparse_masks_stored_zeros_mask_as_absent_ones():
    """``mask[i, j] != 0`` is what may attend: a stored zero and a BSR block's padding mask as
    an absent entry does; oracle: the bool mask's dense attention."""
    torch.manual_seed(5)
    L = 8
    mask = torch.rand(L, L) < 0.3
    mask.fill_diagonal_(True)
    att, x = SparseAttention(8, 2), torch.randn(2, L, 8)
    want = dense_attention(att, x, mask)
    coords = torch.cat([mask.nonzero().t(), (~mask).nonzero().t()[:, :5]], 1)
    vals = torch.cat([torch.ones(int(mask.sum())), torch.zeros(5)])
    for user in (scorch.from_coo(coords, vals, (L, L), format="csr"), scorch.as_sparse(mask.float(), scorch.formats.bsr(2, 2)),
                 torch.sparse_coo_tensor(coords, vals, (L, L), check_invariants=True)):
        torch.testing.assert_close(att(x, mask=user), want)


def test_user_mask_with_empty_row_gives_zero_attention():
    mask = torch.eye(8, dtype=torch.bool)
    mask[3, 3] = False
    att = SparseAttention(4, 1)
    x = torch.randn(8, 4)
    out = att(x, mask=mask)
    torch.testing.assert_close(out, att.dense_reference(x, mask))
    torch.testing.assert_close(out[3], att.out_proj(torch.zeros(4)))


@pytest.mark.parametrize("heads", [1, 2])
def test_attention_gradcheck(heads):
    torch.manual_seed(heads)
    att = SparseAttention(4, heads, pattern="bigbird", window=2, global_tokens=1).double()
    x = torch.randn(2, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(att, (x,))


def test_attention_parameter_gradients_match_dense():
    torch.manual_seed(0)
    att = SparseAttention(8, 2, window=4)
    x = torch.randn(2, 16, 8)
    params = list(att.parameters())
    g1 = torch.autograd.grad(att(x).pow(2).sum(), params)
    g2 = torch.autograd.grad(dense_attention(att, x, window_mask(16, 4)).pow(2).sum(), params)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


def test_attention_errors():
    att = SparseAttention(8, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(L, embed_dim\) or \(B, L, embed_dim\) with "
                                         r"embed_dim = 8, got \(16, 6\)"):
        att(torch.randn(16, 6))
    with pytest.raises(ValueError, match=r"got \(2, 3, 4, 8\)"):
        att(torch.randn(2, 3, 4, 8))
    with pytest.raises(ValueError, match=r"mask must have shape \(L, L\) = \(16, 16\) .* got \(16, 15\)"):
        att(torch.randn(16, 8), mask=torch.ones(16, 15, dtype=torch.bool))
    with pytest.raises(TypeError, match="dense mask must be a torch.bool tensor"):
        att(torch.randn(16, 8), mask=torch.ones(16, 16))
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads = 3, got 8"):
        SparseAttention(8, 3)
    with pytest.raises(ValueError, match="pattern must be one of"):
        SparseAttention(8, 2, pattern="dilated")
