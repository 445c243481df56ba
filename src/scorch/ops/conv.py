"""Convolutions with a sparse weight (a pruned CNN): one generated einsum over a window view.

``conv2d(x, W)`` is ``y[n, o, h, w] = sum_{c, i, j} W[o, c, i, j] * xp[n, c, h*s + i*d, w*s + j*d]``
(``xp``: ``x`` zero-padded).  ``Tensor.unfold`` gives that second operand as a strided view of
``xp`` -- no im2col copy -- indexed ``[n, c, i, j, h, w]`` so the output's last dim has unit
stride and the kernel's innermost loop vectorises: for each stored weight, a shifted plane of
the input is added into the output plane.  The input's gradient is another such convolution
(of the output's gradient with the flipped weight), the weight's is taken in its pattern.
Above a measured density the dense convolution of the densified weight runs instead.
``conv_transpose1d/2d/3d`` with a sparse weight are that input gradient (the adjoint), their
gradients the convolution and its weight gradient.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .. import config
from .._dispatch import as_torch_runs, implements
from ..errors import ScorchValueError
from ..interop import is_sparse
from ..tensor import SparseTensor
from ._pattern import project
from ..compiler.notation import parse
from .einsum import _functorch_level, _grad_of, einsum
from .shape import take_positions

# Densities of the weight above which torch's dense convolution (oneDNN) of the densified weight
# runs instead of the sparse kernels, forward alone and forward + backward (a training step: the
# input's gradient is a second sparse convolution, the weight's an SDDMM).  Measured by
# benchmarks/bench_conv.py on ResNet-shaped 3x3 / 1x1 layers and a 5x5 stem (2 cores, AVX-512):
# the forward's geometric-mean speedup over the dense convolution was 0.5x at 20% density, 0.9x
# at 10%, 1.6x at 5%; the training step's 0.7x at 10%, 1.1x at 5%, 1.8x at 2%.  The dense
# path also pays for densifying the weight on every call (0.16 ms for a 256 x 256 x 3 x 3 one),
# so the lines sit a little above the crossovers.  ``scorch.config.dense_threshold`` overrides both.
DENSE_FROM, DENSE_FROM_TRAINING = 0.12, 0.06

_KERNEL, _OUT = "ijk", "xyz"   # letters of the kernel's and the output's spatial dims


def _tuple(value, nd: int, what: str, name: str) -> tuple:
    vals = (value,) * nd if isinstance(value, int) else tuple(value)
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd or not all(isinstance(v, int) for v in vals):
        raise ScorchValueError(f"{name}: {what} must be an int or {nd} ints, got {value!r}")
    return vals


def _sparse_path(weight: SparseTensor, training: bool, scale: float = 1.0) -> bool:
    """Whether the sparse kernel runs (``scale``: of the measured density lines, for a kernel
    doing more work per stored weight than the convolution's)."""
    if config.dispatch in ("sparse", "dense"):
        return config.dispatch == "sparse"
    limit = config.dense_threshold
    limit = (DENSE_FROM_TRAINING if training else DENSE_FROM) * scale if limit is None else float(limit)
    return weight.nnz < limit * max(weight.numel(), 1)


def _conv(nd: int, func):
    name = func.__name__

    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if not isinstance(weight, SparseTensor) or is_sparse(bias):
            return as_torch_runs(func, input, weight, bias, stride, padding, dilation, groups)
        input = _checked(name, nd, input, weight)
        training = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad)
        if not _sparse_path(weight, training) or _functorch_level() is not None:   # (torch.func: torch's conv
            return func(input, weight.to_dense(), bias, stride, padding, dilation, groups)   # of the dense weight)
        batched = input.dim() == nd + 2
        x = input if batched else input.unsqueeze(0)
        out_c, group_c, *ks = weight.shape
        c = x.shape[1]
        if not isinstance(groups, int) or groups < 1 or c != group_c * groups or out_c % groups:
            raise ScorchValueError(f"{name}: groups={groups!r} does not split input channels {c} into weight's "
                                   f"{group_c} per group and out_channels {out_c} evenly")
        s = _tuple(stride, nd, "stride", name)
        d = _tuple(dilation, nd, "dilation", name)
        if min(s) < 1 or min(d) < 1:
            raise ScorchValueError(f"{name}: stride and dilation must be positive, got {s} and {d}")
        pads = _padding(padding, nd, ks, s, d, name)
        for k in range(nd):
            if x.shape[2 + k] + sum(pads[k]) < d[k] * (ks[k] - 1) + 1:
                raise ScorchValueError(f"{name}: the padded input's size {x.shape[2 + k] + sum(pads[k])} at spatial "
                                       f"dim {k} is smaller than the dilated kernel's {d[k] * (ks[k] - 1) + 1}")
        geometry = (s, tuple(pads), d, groups)
        if training:
            y = _SparseConv.apply(x, weight, geometry)
        else:
            y = _forward(x, weight, geometry)
        if bias is not None:
            y = y + bias.reshape(out_c, *([1] * nd))
        return y if batched else y.squeeze(0)

    conv.__name__ = conv.__qualname__ = name
    conv.__doc__ = f"``torch.{name}`` with a sparse weight: one generated einsum over a window view of the input."
    return conv


def _checked(name: str, nd: int, input, weight: SparseTensor):
    """``input`` (dense: the window view needs strided memory) after the checks both kinds of
    convolution make of a sparse weight."""
    if is_sparse(input):
        input = input.to_dense()
    if weight.dim() != nd + 2:
        raise ScorchValueError(f"{name}: weight must be {nd + 2}-d (channels, channels / groups, kernel...), "
                               f"got {weight.dim()}-d")
    if input.dim() not in (nd + 1, nd + 2):
        raise ScorchValueError(f"{name}: input must be {nd + 1}-d (unbatched) or {nd + 2}-d (batched), "
                               f"got {input.dim()}-d")
    if input.dtype != weight.dtype:
        raise ScorchValueError(f"{name}: input ({input.dtype}) and weight ({weight.dtype}) must have one dtype")
    return input


def _conv_transpose(nd: int, func):
    name = func.__name__

    def conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        if not isinstance(weight, SparseTensor) or is_sparse(bias):
            return as_torch_runs(func, input, weight, bias, stride, padding, output_padding, groups, dilation)
        input = _checked(name, nd, input, weight)
        batched = input.dim() == nd + 2
        x = input if batched else input.unsqueeze(0)
        in_c, group_out, *ks = weight.shape
        if not isinstance(groups, int) or groups < 1 or x.shape[1] != in_c or in_c % groups:
            raise ScorchValueError(f"{name}: input's {x.shape[1]} channels and groups={groups!r} do not match "
                                   f"weight's {in_c} input channels split evenly into groups")
        s, d = _tuple(stride, nd, "stride", name), _tuple(dilation, nd, "dilation", name)
        p, op = _tuple(padding, nd, "padding", name), _tuple(output_padding, nd, "output_padding", name)
        if min(s) < 1 or min(d) < 1 or min(p) < 0 or min(op) < 0:
            raise ScorchValueError(f"{name}: stride and dilation must be positive, padding and output_padding "
                                   f"non-negative, got {s}, {d}, {p} and {op}")
        if any(o >= max(sk, dk) for o, sk, dk in zip(op, s, d)):
            raise ScorchValueError(f"{name}: output_padding {op} must be smaller than either stride {s} or "
                                   f"dilation {d} (as in torch)")
        training = torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad)
        # a stride spreads the input apart by zeros the kernel walks: prod(stride) times the work
        if not _sparse_path(weight, training, 1 / math.prod(s)) or _functorch_level() is not None:
            return func(input, weight.to_dense(), bias, stride, padding, output_padding, groups, dilation)
        out = [(n - 1) * sk - 2 * pk + dk * (k - 1) + o + 1 for n, sk, pk, dk, k, o in zip(x.shape[2:], s, p, d, ks, op)]
        if min(out, default=1) < 1:
            raise ScorchValueError(f"{name}: the output's spatial size {tuple(out)} is not positive")
        geometry = (s, tuple((pk, pk) for pk in p), d, groups)
        shape = (x.shape[0], group_out * groups, *out)
        if training:
            y = _SparseConvTranspose.apply(x, weight, geometry, shape)
        else:
            y = _input_grad(x, weight, shape, geometry)
        if bias is not None:
            y = y + bias.reshape(group_out * groups, *([1] * nd))
        return y if batched else y.squeeze(0)

    conv_transpose.__name__ = conv_transpose.__qualname__ = name
    conv_transpose.__doc__ = (f"``torch.{name}`` with a sparse weight: the adjoint of the sparse convolution (its "
                              "input's gradient), one generated einsum.")
    return conv_transpose


class _SparseConvTranspose(torch.autograd.Function):
    """The transposed convolution, the adjoint of :class:`_SparseConv`'s: its input's gradient is
    the convolution of the output's gradient, its weight's the convolution's weight gradient
    with the roles of input and output's gradient swapped."""

    @staticmethod
    def forward(ctx, x, weight, geometry, shape):
        ctx.geometry = geometry
        ctx.save_for_backward(x, weight)
        return _input_grad(x, weight, shape, geometry)

    @staticmethod
    @once_differentiable   # (a double backward raises rather than reading zeros)
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:   # (output_padding's last positions reach no input position)
            gx = _forward(gy, weight, ctx.geometry)[(Ellipsis,) + tuple(slice(0, n) for n in x.shape[2:])]
        if ctx.needs_input_grad[1]:
            gw = _weight_grad(x, gy, weight, ctx.geometry)
        return gx, gw, None, None


def _forward(x, weight: SparseTensor, geometry) -> torch.Tensor:
    """The convolution of the batched ``x`` with ``weight`` (``geometry``: strides, ``(before,
    after)`` padding per spatial dim, dilations, groups), no autograd."""
    return _windowed_product(_windows(x, weight.shape[2:], geometry), weight, geometry[3], len(geometry[0]))


def _windows(x, ks, geometry) -> torch.Tensor:
    """The padded ``x``'s windows as a strided view ``(n, c, kernel..., out...)``, no copy
    (beyond the padding's)."""
    s, pads, d, _ = geometry
    nd = len(s)
    if any(map(any, pads)):
        x = torch.nn.functional.pad(x, [p for lo_hi in reversed(pads) for p in lo_hi])
    for k in range(nd):     # windows along each spatial dim: (n, c, out..., span...)
        x = x.unfold(2 + k, d[k] * (ks[k] - 1) + 1, s[k])
    if max(d) > 1:
        x = x[(Ellipsis,) + tuple(slice(None, None, dk) for dk in d)]
    return x.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))


class _SparseConv(torch.autograd.Function):
    """The convolution, differentiable: the input's gradient is itself a sparse convolution (of
    the output's gradient, strided apart by zeros, with the weight flipped and its channel dims
    swapped), not the einsum's dense gradient of the window view (kernel-size times the input);
    the weight's gradient is one dot product per stored entry (an SDDMM-like einsum)."""

    @staticmethod
    def forward(ctx, x, weight, geometry):
        ctx.geometry = geometry
        ctx.save_for_backward(x, weight)
        return _forward(x, weight, geometry)

    @staticmethod
    @once_differentiable   # (a double backward raises rather than reading zeros)
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = _input_grad(gy, weight, tuple(x.shape), ctx.geometry) if ctx.needs_input_grad[0] else None
        gw = _weight_grad(gy, x, weight, ctx.geometry) if ctx.needs_input_grad[1] else None
        return gx, gw, None


def _input_grad(gy, weight: SparseTensor, x_shape, geometry) -> torch.Tensor:
    """The convolution's input gradient for the output's gradient ``gy`` (batched; ``x_shape``:
    the input's shape) -- also the transposed convolution of ``gy``."""
    s, pads, d, groups = geometry
    nd, ks = len(s), weight.shape[2:]
    spans = [dk * (k - 1) + 1 for dk, k in zip(d, ks)]
    if max(s) > 1:   # the output's gradient at its windows' starts in the padded input, zeros between
        gz = gy.new_zeros(*gy.shape[:2], *[(n - 1) * sk + 1 for n, sk in zip(gy.shape[2:], s)])
        gz[(Ellipsis,) + tuple(slice(None, None, sk) for sk in s)] = gy
        gy = gz
    flipped = _flipped(weight, groups)
    full = _forward(gy, flipped, ((1,) * nd, tuple((sp - 1, sp - 1) for sp in spans), d, groups))
    # ``full`` covers the padded input up to the last window's end: zeros after it, the padding cut
    crop = []
    for k in reversed(range(nd)):
        lo, hi = pads[k]
        padded = x_shape[2 + k] + lo + hi
        crop += [-lo, padded - full.shape[2 + k] - hi]
    return torch.nn.functional.pad(full, crop)


def _flipped(weight: SparseTensor, groups: int) -> SparseTensor:
    """``weight`` with each group's channel dims swapped and its kernel reversed (the weight of
    the input's gradient).  The pattern, holding each entry's position in ``weight.values()``,
    is built once per weight pattern and kept on its index array (as convert's derived arrays
    are); each call gathers the current values into it (training changes values, not patterns)."""
    holder = next((c for c in reversed(weight._crd) if c is not None), weight._vals)   # (all-dense format)
    others = [a for a in (*weight._pos, *weight._crd) if a is not None and a is not holder]
    key = (groups, weight._format, weight._shape)   # an index array can be shared by a reshaped view
    cached = getattr(holder, "_scorch_conv_flipped", None)
    if cached is None or cached[0] != key or len(cached[1]) != len(others) \
            or any(a is not b for a, b in zip(cached[1], others)):
        out_c, group_c, *ks = weight.shape
        ids = weight._like(values=torch.arange(1, weight._vals.numel() + 1, dtype=torch.float64),
                           nnz=weight._stored)
        if groups > 1:
            ids = ids.reshape(groups, out_c // groups, group_c, *ks).transpose(1, 2) \
                .reshape(groups * group_c, out_c // groups, *ks)
        else:
            ids = ids.transpose(0, 1)
        cached = (key, others, ids.flip(list(range(2, weight.dim()))))
        holder._scorch_conv_flipped = cached
    return take_positions(cached[2], weight._vals)


def _weight_grad(gy, x, weight: SparseTensor, geometry) -> SparseTensor:
    """The weight's gradient in its pattern: the einsum's (one dot product per stored entry) for
    the output's gradient ``gy`` over the windows of ``x``."""
    s, _, _, groups = geometry
    view = _windows(x, weight.shape[2:], geometry)   # cut to gy's positions (a transposed convolution's
    view = view[(Ellipsis,) + tuple(slice(0, n) for n in gy.shape[2:])]   # output_padding)
    equation, w, view = _grouped(view, weight, groups, len(s))
    g = _grad_of(parse(equation, [tuple(w.shape), tuple(view.shape)]), (w, view), 0,
                 gy.unflatten(1, (groups, -1)) if groups > 1 else gy)
    if groups == 1:
        return g
    return weight._like(values=project(g.reshape(weight.shape), weight).to(weight.dtype), nnz=weight._stored)


def _grouped(view, weight: SparseTensor, groups: int, nd: int, batch_inside: bool = False):
    """``(equation, weight, view)`` of ``y[n, o, out...] = sum W[o, c, kernel...] * view[n, c,
    kernel..., out...]``, per group (a group dim split off the channels) when ``groups > 1``;
    ``batch_inside``: the batch dim moved after the channels, in the view and the result."""
    kern, outs = _KERNEL[:nd], _OUT[:nd]
    g = "g" if groups > 1 else ""
    if groups > 1:
        out_c, group_c, *ks = weight.shape
        weight = weight.reshape(groups, out_c // groups, group_c, *ks)
        view = view.unflatten(1, (groups, group_c))
    if batch_inside:
        view = view.movedim(0, len(g) + 1)
    v, o = (f"{g}cn", f"{g}on") if batch_inside else (f"n{g}c", f"n{g}o")
    return f"{g}oc{kern},{v}{kern}{outs}->{o}{outs}", weight, view


def _windowed_product(view, weight: SparseTensor, groups: int, nd: int) -> torch.Tensor:
    """:func:`_grouped`'s product.  The kernel's outer loop runs over the batch, split across
    threads; with fewer samples than threads the batch goes inside the weight's loops instead
    (the output channels are split)."""
    inside = view.shape[0] < torch.get_num_threads()
    equation, weight, view = _grouped(view, weight, groups, nd, inside)
    y = einsum(equation, weight, view)
    if inside:
        y = y.movedim(2 if groups > 1 else 1, 0).contiguous()
    return y.flatten(1, 2) if groups > 1 else y


def _padding(padding, nd, ks, s, d, name) -> list:
    """``(before, after)`` zeros per spatial dim, as torch pads for ``padding`` (ints, ``"valid"``,
    ``"same"``: the dilated kernel's extent less one, the odd one after)."""
    if padding == "valid":
        return [(0, 0)] * nd
    if padding == "same":
        if max(s) > 1:
            raise ScorchValueError(f"{name}: padding='same' is not supported for strided convolutions (as in torch)")
        total = [dk * (k - 1) for dk, k in zip(d, ks)]
        return [(t // 2, t - t // 2) for t in total]
    if isinstance(padding, str):
        raise ScorchValueError(f"{name}: padding must be 'valid', 'same', an int or {nd} ints, got {padding!r}")
    p = _tuple(padding, nd, "padding", name)
    if min(p) < 0:
        raise ScorchValueError(f"{name}: padding must be non-negative, got {p}")
    return [(v, v) for v in p]


for _nd, _func in ((1, torch.conv1d), (2, torch.conv2d), (3, torch.conv3d)):
    implements(_func)(_conv(_nd, _func))
for _nd, _func in ((1, torch.conv_transpose1d), (2, torch.conv_transpose2d), (3, torch.conv_transpose3d)):
    implements(_func)(_conv_transpose(_nd, _func))
