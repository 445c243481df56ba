"""Prune a 3-layer MLP to 95% sparsity with SparseLinear.from_dense and compare it to the dense one.

    python examples/pruned_mlp.py
"""

import time

import torch

from scorch.nn import SparseLinear

torch.manual_seed(0)
dense = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                            torch.nn.ReLU(), torch.nn.Linear(1024, 10))
sparse = torch.nn.Sequential(*[SparseLinear.from_dense(m, sparsity=0.95) if isinstance(m, torch.nn.Linear) else m
                               for m in dense])
print(sparse)
x = torch.randn(256, 1024)
with torch.no_grad():
    for name, model in (("dense", dense), ("95% pruned", sparse)):
        model(x)
        t0 = time.perf_counter()
        for _ in range(10):
            model(x)
        print(f"{name:11s} {1e3 * (time.perf_counter() - t0) / 10:6.2f} ms")
