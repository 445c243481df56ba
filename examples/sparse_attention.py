"""Sliding-window attention over 2048 tokens with scorch.nn.SparseAttention vs dense masked attention.

    python examples/sparse_attention.py
"""

import time

import torch

from scorch.nn import SparseAttention

torch.manual_seed(0)
attn = SparseAttention(128, num_heads=4, pattern="window", window=128)
x = torch.randn(2048, 128)
with torch.no_grad():
    out, ref = attn(x), attn.dense_reference(x)
    print("agree with dense masked attention:", torch.allclose(out, ref, atol=1e-4))
    for name, f in (("sparse", lambda: attn(x)), ("dense masked", lambda: attn.dense_reference(x))):
        t0 = time.perf_counter()
        for _ in range(3):
            f()
        print(f"{name:13s} {1e3 * (time.perf_counter() - t0) / 3:8.1f} ms")
