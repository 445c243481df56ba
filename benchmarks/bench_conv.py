"""Pruned convolutions: a sparse weight through scorch's generated kernel vs torch's dense
convolution of the same (masked) weight -- torch.sparse has no convolution, so a torch user
with a pruned CNN runs the dense one.  Layers shaped like ResNet-18's / a small CNN's, weights
pruned at random to 80-98% sparsity; inference (forward) and training (forward + backward).
Medians, scorch and torch alternated in one process; results checked against each other first.
The "sparse kernel" column forces scorch's kernel (``dispatch="sparse"``); the "auto" column is
what ``F.conv2d`` picks by default (the dense convolution above ``scorch.ops.conv.DENSE_FROM``).

    python benchmarks/bench_conv.py [--repeat 9] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import scorch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import timeit  # noqa: E402

# (name, batch, in_channels, out_channels, size, kernel, stride)
LAYERS = [("resnet conv3x3 64", 8, 64, 64, 56, 3, 1), ("resnet conv3x3 128", 8, 128, 128, 28, 3, 1),
          ("resnet conv3x3 256, batch 1", 1, 256, 256, 14, 3, 1), ("resnet conv1x1 512", 8, 256, 512, 14, 1, 1),
          ("stem 5x5 stride 2", 16, 3, 32, 64, 5, 2)]


def _forced(mode, fn):
    def run():
        saved, scorch.config.dispatch = scorch.config.dispatch, mode
        try:
            return fn()
        finally:
            scorch.config.dispatch = saved
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    layers = LAYERS[1:3] if args.quick else LAYERS
    sparsities = [0.9, 0.95] if args.quick else [0.8, 0.9, 0.95, 0.98]
    gen = torch.Generator().manual_seed(0)
    print("\n| layer | sparsity | pass | scorch sparse kernel ms | scorch auto ms | torch dense ms | "
          "kernel speedup | auto speedup |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = {}
    for name, n, c, o, size, k, s in layers:
        x = torch.randn(n, c, size, size, generator=gen)
        for sparsity in sparsities:
            w = torch.randn(o, c, k, k, generator=gen) * (torch.rand(o, c, k, k, generator=gen) >= sparsity)
            W = scorch.as_sparse(w, "csf")
            p = k // 2
            ref = F.conv2d(x, w, stride=s, padding=p)
            got = _forced("sparse", lambda: F.conv2d(x, W, stride=s, padding=p))()
            assert torch.allclose(got, ref, atol=1e-3, rtol=1e-4)
            t = timeit([_forced("sparse", lambda: F.conv2d(x, W, stride=s, padding=p)),
                        lambda: F.conv2d(x, W, stride=s, padding=p), lambda: F.conv2d(x, w, stride=s, padding=p)],
                       args.repeat)
            _row(ratios, name, sparsity, "forward", *t)
            Wg, wg = W.detach().requires_grad_(), w.clone().requires_grad_()
            xg, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
            gy = torch.randn_like(ref)
            t = timeit([_forced("sparse", lambda: F.conv2d(xg, Wg, stride=s, padding=p).backward(gy)),
                        lambda: F.conv2d(xg, Wg, stride=s, padding=p).backward(gy),
                        lambda: F.conv2d(xd, wg, stride=s, padding=p).backward(gy)], max(3, args.repeat // 2))
            _row(ratios, name, sparsity, "fwd+bwd", *t)
    print()
    for (what, sparsity), r in sorted(ratios.items()):
        print(f"{what} at {sparsity:.0%} sparsity: geometric mean speedup of the sparse kernel "
              f"{math.exp(sum(map(math.log, r)) / len(r)):.2f}x over {len(r)} layers")


def _row(ratios, name, sparsity, what, t_kernel, t_auto, t_dense):
    ratios.setdefault((what, sparsity), []).append(t_dense / t_kernel)
    print(f"| {name} | {sparsity:.0%} | {what} | {1e3 * t_kernel:.2f} | {1e3 * t_auto:.2f} | {1e3 * t_dense:.2f} | "
          f"{t_dense / t_kernel:.2f}x | {t_dense / t_auto:.2f}x |")


if __name__ == "__main__":
    main()
