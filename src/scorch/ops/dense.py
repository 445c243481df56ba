"""Dense ``x @ W^T (+ b)`` on a generated kernel where it beats torch's on this machine.

scorch's layers (GCN, GraphSAGE, GAT, attention) spend much of a forward pass in dense
linear maps.  The compiler lowers that einsum like any other -- output rows split across
threads, each row in vector registers, rows register-blocked by :mod:`scorch.compiler.jam`
-- and on some machines the result is faster than torch's BLAS (on the AMD CPU with AVX-512
this was measured on, MKL's sgemm runs at what 256-bit FMAs allow: 2.4-4.8x slower).  Whether it is, is measured per shape the first time the
shape comes up in the process, against torch's own call, and the faster one runs from then
on.  ``scorch.config.dense_kernels`` forces either (``"torch"``, ``"compiled"``).

The generated kernel serves the forward pass; gradients are torch's matmuls.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .. import config
from .._memo import remember
from ..compiler import build, driver, permute

__all__ = ["linear", "choice"]

_CHOICES: dict = {}     # (M, K, N, dtype, threads, bias) -> "compiled" | "torch"
_MIN_WORK = 1 << 18     # smaller products are not worth a measurement (M * K * N)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` on dense tensors, on the kernel that is faster here.

    >>> import torch
    >>> from scorch.ops.dense import linear
    >>> x, w, b = torch.randn(5, 3), torch.randn(4, 3), torch.randn(4)
    >>> torch.allclose(linear(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-6)
    True
    """
    if not _eligible(x, weight, bias):
        return F.linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if choice(x2.shape[0], x2.shape[1], weight.shape[0], x.dtype, bias is not None, x2, weight, bias) == "torch":
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        out = _Linear.apply(x2, weight, bias)
    else:
        out = _forward(x2, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _eligible(x, weight, bias) -> bool:
    mode = config.dense_kernels   # (auto / compiled / torch: scorch.config checks it when set)
    if mode == "torch":
        return False
    dense = (torch.Tensor, torch.nn.Parameter)
    if type(x) not in dense or type(weight) not in dense or (bias is not None and type(bias) not in dense):
        return False
    if x.dtype not in (torch.float32, torch.float64) or weight.dtype != x.dtype \
            or (bias is not None and (bias.dtype != x.dtype or bias.shape != weight.shape[:1])):
        return False
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or x.numel() == 0 \
            or x.layout != torch.strided or not x.is_cpu or not weight.is_cpu:
        return False
    # the kernel keeps each output row in vector registers: whole 64-byte lines (whole vectors
    # of any width), up to 1 KiB or whole 256-byte column tiles, driver._MAX_STATIC_ROW at most
    n, size = weight.shape[0], x.element_size()
    return n * size % 64 == 0 and n <= driver._MAX_STATIC_ROW and (n * size <= 1024 or n * size % 256 == 0) \
        and build.have_compiler()


def choice(m: int, k: int, n: int, dtype, has_bias: bool, x=None, weight=None, bias=None) -> str:
    """``"compiled"`` or ``"torch"`` for an ``m x k`` times ``k x n`` product: the forced mode,
    torch for small products, else the faster of the two measured once per process
    (``x``, ``weight``, ``bias``: the operands to measure with, needed on a first call)."""
    if config.dense_kernels != "auto":
        return config.dense_kernels
    if m * k * n < _MIN_WORK:
        return "torch"
    key = (m, k, n, dtype, torch.get_num_threads(), has_bias)
    found = _CHOICES.get(key)
    if found is None:
        found = remember(_CHOICES, key, _measure(x, weight, bias))
    return found


def _measure(x2, weight, bias) -> str:
    """Time the generated kernel and torch's alternately (median of a few calls, at most ~50 ms
    of timed calls each) and name the faster."""
    with torch.no_grad():
        fns = (lambda: _forward(x2, weight, bias), lambda: F.linear(x2, weight, bias))
        times = ([], [])
        for f in fns:  # first calls: compile, page in
            f()
        t_start = time.perf_counter()
        while len(times[0]) < 7 and (len(times[0]) < 3 or time.perf_counter() - t_start < 0.1):
            for f, ts in zip(fns, times):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
    return "compiled" if statistics.median(times[0]) < statistics.median(times[1]) else "torch"


def _forward(x2, weight, bias):
    # W^T contiguous: the kernel's rows (a copy of in x out values per call, small against the
    # product; cached copies would go stale when a weight changes through .data)
    operands = (x2.detach(), permute.transposed(weight.detach()))
    init = () if bias is None else (bias.detach(),)
    return driver.compiled("ij,jk->ik", operands, init)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias):
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return _forward(x2, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        gx = grad @ weight if ctx.needs_input_grad[0] else None
        gw = grad.t() @ x2 if ctx.needs_input_grad[1] else None
        gb = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb
