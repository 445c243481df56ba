"""Convolutions with a sparse weight (scorch.ops.conv), against torch's dense convolutions."""

import itertools
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scorch
from scorch import _dispatch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def rnd(*shape, density=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density)


@pytest.fixture
def sparse_kernels():
    """Every call on the generated kernel (and none through the dense fallback)."""
    saved = scorch.config.dispatch, scorch.config.dense_fallback
    scorch.config.dispatch, scorch.config.dense_fallback = "sparse", "raise"
    yield
    scorch.config.dispatch, scorch.config.dense_fallback = saved


# (batch, in_channels, out_channels, size, kernel, stride, padding, dilation, groups)
LAYERS = [(2, 4, 6, 9, 3, 1, 1, 1, 1), (1, 4, 6, 8, 2, 2, 0, 1, 2), (3, 6, 4, 10, 3, 1, "same", 2, 2),
          (1, 3, 5, 7, 1, 1, 0, 1, 1), (2, 2, 2, 6, 3, 3, 2, 1, 1), (1, 4, 4, 9, 4, 1, "same", 1, 1),
          (2, 3, 3, 5, 3, 1, "valid", 1, 1), (4, 4, 8, 6, 3, (1, 2, 1), (0, 1, 2), (2, 1, 1), 4)]


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("nd,layer", list(itertools.product([1, 2, 3], LAYERS)))
@pytest.mark.parametrize("fmt", ["coo", "csf"])
def test_conv_with_a_sparse_weight_matches_dense(sparse_kernels, nd, layer, fmt):
    """conv1d/2d/3d of a dense input with a sparse weight (strides, padding ints / 'same' /
    'valid', dilation, groups, bias, unbatched input); oracle: the same call with the dense weight."""
    n, c, o, size, k, s, p, d, g = layer
    s, p, d = ((v[:nd] if isinstance(v, tuple) else v) for v in (s, p, d))
    x = rnd(n, c, *([size] * nd), seed=1)
    w = rnd(o, c // g, *([k] * nd), density=0.3, seed=2)
    b = rnd(o, seed=3)
    W = scorch.as_sparse(w, fmt)
    conv = CONV[nd]
    got = conv(x, W, b, stride=s, padding=p, dilation=d, groups=g)
    want = conv(x, w, b, stride=s, padding=p, dilation=d, groups=g)
    assert type(got) is torch.Tensor and got.is_contiguous()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(conv(x[0], W, None, s, p, d, g), conv(x[0], w, None, s, p, d, g))


@pytest.mark.parametrize("batch", [1, 3])
def test_conv2d_gradients_reach_input_bias_and_the_weight_pattern(sparse_kernels, batch):
    """Backward through the window view and the einsum: the input's and bias's gradients as
    torch's, the weight's in its pattern (torch's masked); gradcheck on the stored values."""
    x, w, b = rnd(batch, 3, 7, 7, seed=1), rnd(4, 3, 3, 3, density=0.4, seed=2), rnd(4, seed=3)
    W = scorch.as_sparse(w, "csf").requires_grad_()
    xs, bs = x.clone().requires_grad_(), b.clone().requires_grad_()
    xd, wd, bd = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    weight_out = rnd(batch, 4, 4, 4, seed=4)
    (F.conv2d(xs, W, bs, stride=2, padding=2, dilation=2) * weight_out).sum().backward()
    (F.conv2d(xd, wd, bd, stride=2, padding=2, dilation=2) * weight_out).sum().backward()
    torch.testing.assert_close(xs.grad, xd.grad)
    torch.testing.assert_close(bs.grad, bd.grad)
    torch.testing.assert_close(W.grad.to_dense(), wd.grad * (w != 0))
    with torch.no_grad():        # new values in the same pattern (an optimizer step): the input's
        W.mul_(-2)               # gradient reads them, not the ones of the first backward
    xs.grad = xd.grad = None
    (F.conv2d(xs, W, bs, stride=2, padding=2, dilation=2) * weight_out).sum().backward()
    (F.conv2d(xd, -2 * w, bd, stride=2, padding=2, dilation=2) * weight_out).sum().backward()
    torch.testing.assert_close(xs.grad, xd.grad)
    P = scorch.as_sparse(w, "coo")
    v = P.values().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda v, x: F.conv2d(x, P.with_values(v), padding=1, groups=1),
                                    (v, x[:1, :, :4, :4].clone().requires_grad_()))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("nd,layer", list(itertools.product([1, 2, 3], LAYERS[1:4] + LAYERS[-1:])))
def test_conv_gradients_across_strides_groups_and_padding(sparse_kernels, nd, layer):
    """The input's gradient (a transposed sparse convolution) and the weight's (in its pattern)
    for strided, grouped, dilated, 'same'-padded layers; oracle: torch's dense gradients."""
    n, c, o, size, k, s, p, d, g = layer
    s, p, d = ((v[:nd] if isinstance(v, tuple) else v) for v in (s, p, d))
    x, w = rnd(n, c, *([size] * nd), seed=1), rnd(o, c // g, *([k] * nd), density=0.4, seed=2)
    W = scorch.as_sparse(w, "csf").requires_grad_()
    xs, xd, wd = x.clone().requires_grad_(), x.clone().requires_grad_(), w.clone().requires_grad_()
    got, want = CONV[nd](xs, W, None, s, p, d, g), CONV[nd](xd, wd, None, s, p, d, g)
    gy = rnd(*want.shape, seed=3)
    got.backward(gy)
    want.backward(gy)
    torch.testing.assert_close(xs.grad, xd.grad)
    torch.testing.assert_close(W.grad.to_dense(), wd.grad * (w != 0))


def test_pruned_conv_layer_trains_and_keeps_its_pattern(sparse_kernels):
    """nn.Conv2d with a sparse weight Parameter trains with SGD: the loss falls, the weight stays
    a SparseTensor of the same pattern; the same steps on the masked dense layer agree."""
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(3, 4, 3, padding=1).double()
    mask = rnd(4, 3, 3, 3, density=0.3, seed=5) != 0
    ref = torch.nn.Conv2d(3, 4, 3, padding=1).double()
    ref.load_state_dict({"weight": layer.weight.detach() * mask, "bias": layer.bias.detach()})
    layer.weight = torch.nn.Parameter(scorch.as_sparse(layer.weight.detach() * mask, "csf"))
    x, target = rnd(8, 3, 6, 6, seed=6), rnd(8, 4, 6, 6, seed=7)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (layer, ref)]
    losses = []
    for _ in range(20):
        for m, opt in zip((layer, ref), opts):
            opt.zero_grad()
            loss = F.mse_loss(m(x), target)
            loss.backward()
            if m is ref:
                m.weight.grad *= mask
            opt.step()
            losses.append(loss.item())
    assert losses[-2] < losses[0]
    assert isinstance(layer.weight, scorch.SparseTensor) and layer.weight.nnz == int(mask.sum())
    torch.testing.assert_close(layer.weight.to_dense(), ref.weight.detach())


def test_conv_dispatch_errors_and_dense_paths(monkeypatch):
    """Above the density crossover (dispatch 'auto') the dense convolution runs on the
    densified weight; a dense weight with a sparse input takes the (warned) fallback; bad
    arguments raise ValueErrors naming them."""
    x, w = rnd(2, 4, 6, 6, seed=1), rnd(5, 4, 3, 3, density=0.6, seed=2)
    W = scorch.as_sparse(w, "coo")
    torch.testing.assert_close(F.conv2d(x, W, padding=1), F.conv2d(x, w, padding=1))   # auto: dense
    monkeypatch.setattr(scorch.config, "dense_fallback", "warn")
    monkeypatch.setattr(_dispatch, "_warned", set())
    with pytest.warns(UserWarning, match="convolution has no sparse implementation"):
        got = F.conv2d(scorch.as_sparse(x, "coo"), w)
    torch.testing.assert_close(got, F.conv2d(x, w))
    with pytest.raises(ValueError, match="conv2d: weight must be 4-d"):
        F.conv2d(x, scorch.as_sparse(w[0], "coo"))
    with pytest.raises(ValueError, match="conv2d: input must be 3-d .unbatched. or 4-d .batched., got 2-d"):
        F.conv2d(x[0, 0], W)
    with pytest.raises(ValueError, match=r"conv2d: input \(torch.float32\) and weight \(torch.float64\)"):
        F.conv2d(x.float(), W)
    with pytest.raises(ValueError, match="groups=3 does not split input channels 4"):
        F.conv2d(x, W, groups=3)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        F.conv2d(x, W, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding must be 'valid', 'same', an int or 2 ints, got 'full'"):
        F.conv2d(x, W, padding="full")
    with pytest.raises(ValueError, match="smaller than the dilated kernel's 5"):
        F.conv2d(x[:, :, :4, :4], W, dilation=2)
    with pytest.raises(ValueError, match=r"stride must be an int or 2 ints, got \(1, 2, 3\)"):
        F.conv2d(x, W, stride=(1, 2, 3))


TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
# (batch, in_channels, out_channels, size, kernel, stride, padding, output_padding, groups, dilation)
TRANSPOSED = [(2, 4, 6, 5, 3, 1, 1, 0, 1, 1), (1, 4, 6, 4, 2, 2, 0, 1, 2, 1), (3, 6, 4, 4, 3, 2, 1, 1, 2, 2),
              (2, 3, 2, 3, 4, 3, 2, 2, 1, 1), (1, 4, 4, 4, 3, 1, 0, 1, 4, 2)]


@pytest.mark.parametrize("nd,layer", list(itertools.product([1, 2, 3], TRANSPOSED)))
def test_conv_transpose_with_a_sparse_weight_and_its_gradients(sparse_kernels, nd, layer):
    """conv_transpose1d/2d/3d (strides, padding, output_padding, groups, dilation, bias,
    unbatched input) as the adjoint of the sparse convolution, and its input's and weight's
    gradients; oracle: the same calls with the dense weight."""
    n, c, o, size, k, s, p, op, g, d = layer
    x, w, b = rnd(n, c, *([size] * nd), seed=1), rnd(c, o // g, *([k] * nd), density=0.4, seed=2), rnd(o, seed=3)
    W = scorch.as_sparse(w, "csf").requires_grad_()
    xs, xd, wd = x.clone().requires_grad_(), x.clone().requires_grad_(), w.clone().requires_grad_()
    conv = TRANSPOSE[nd]
    got, want = conv(xs, W, b, s, p, op, g, d), conv(xd, wd, b, s, p, op, g, d)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
    gy = rnd(*want.shape, seed=4)
    got.backward(gy)
    want.backward(gy)
    torch.testing.assert_close(xs.grad, xd.grad)
    torch.testing.assert_close(W.grad.to_dense(), wd.grad * (w != 0))
    with torch.no_grad():
        torch.testing.assert_close(conv(x[0], W, None, s, p, op, g, d), conv(x[0], w, None, s, p, op, g, d))


def test_conv_transpose_errors(sparse_kernels):
    x, W = rnd(2, 4, 5, 5), scorch.as_sparse(rnd(4, 3, 3, 3, density=0.4), "coo")
    with pytest.raises(ValueError, match="output_padding .2, 2. must be smaller than either stride"):
        F.conv_transpose2d(x, W, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="input's 5 channels and groups=1 do not match weight's 4"):
        F.conv_transpose2d(rnd(2, 5, 5, 5), W)
    with pytest.raises(ValueError, match=r"output's spatial size \(-1, -1\) is not positive"):
        F.conv_transpose2d(x[:, :, :1, :1], W, padding=2)


@st.composite
def layers(draw):
    """A random convolution (or transposed one): dims, sizes, stride, padding, dilation,
    groups, output_padding, the weight's format and density, batched or not."""
    nd = draw(st.integers(1, 3))
    g = draw(st.integers(1, 3))
    c, o = g * draw(st.integers(1, 3)), g * draw(st.integers(1, 3))
    k = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    s = tuple(draw(st.integers(1, 3)) for _ in range(nd))
    d = tuple(draw(st.integers(1, 2)) for _ in range(nd))
    p = tuple(draw(st.integers(0, 2)) for _ in range(nd))
    size = tuple(draw(st.integers(1, 7)) for _ in range(nd))
    n = draw(st.integers(0, 2))
    transposed = draw(st.booleans())
    op = tuple(draw(st.integers(0, max(sk, dk) - 1)) for sk, dk in zip(s, d)) if transposed else None
    fmt = draw(st.sampled_from(["coo", "csf", "dense", "ell"]))
    return nd, n, c, o, k, s, d, p, g, size, op, fmt, draw(st.sampled_from([0.0, 0.3, 1.0])), draw(st.integers(0, 999))


@settings(max_examples=int(60 * float(os.environ.get("CONV_EXAMPLES_SCALE", "1"))), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(layer=layers())
def test_random_convolutions_and_their_gradients_match_dense(layer):
    """Random conv / conv_transpose layers (1-3 spatial dims, strides, dilation, padding,
    groups, output_padding, empty batches and weights) with a sparse weight: forward and both
    gradients against the same layer with the dense weight; shapes torch rejects must raise."""
    nd, n, c, o, k, s, d, p, g, size, op, fmt, density, seed = layer
    transposed = op is not None
    wshape = (c, o // g, *k) if transposed else (o, c // g, *k)
    x, w = rnd(n, c, *size, seed=seed), rnd(*wshape, density=density, seed=seed + 1)
    conv = (TRANSPOSE if transposed else CONV)[nd]
    extra = (s, p, op, g, d) if transposed else (s, p, d, g)
    xd, wd = x.clone().requires_grad_(), w.clone().requires_grad_()
    try:
        want = conv(xd, wd, None, *extra)
    except RuntimeError:
        with pytest.raises((ValueError, RuntimeError)):
            conv(x, scorch.as_sparse(w, fmt), None, *extra)
        return
    if transposed and min(want.shape[2:]) == 0:   # torch returns an empty batch's empty output; scorch refuses
        with pytest.raises(ValueError, match="spatial size .* is not positive"):
            conv(x, scorch.as_sparse(w, fmt), None, *extra)
        return
    saved = scorch.config.dispatch, scorch.config.dense_fallback
    scorch.config.dispatch, scorch.config.dense_fallback = "sparse", "raise"
    try:
        W, xs = scorch.as_sparse(w, fmt).requires_grad_(), x.clone().requires_grad_()
        got = conv(xs, W, None, *extra)
        torch.testing.assert_close(got, want)
        gy = rnd(*want.shape, seed=seed + 2)
        got.backward(gy)
    finally:
        scorch.config.dispatch, scorch.config.dense_fallback = saved
    want.backward(gy)
    torch.testing.assert_close(xs.grad, xd.grad)
    stored = W.detach().with_values(torch.ones_like(W.detach().values())).to_dense() != 0   # dense formats store all
    torch.testing.assert_close(W.grad.to_dense(), wd.grad * stored)
