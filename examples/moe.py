"""Mixture of experts: the seed program with `import scorch as torch`, then scorch.nn.MoE.

    python examples/moe.py
"""

import time

import scorch as torch
from scorch.nn import MoE
from scorch.nn import functional as F

B, D_in, D_out, N_experts = 1024, 256, 256, 8

# The Scorch seed, verbatim: sparse one-hot gates flow straight into einsum.
x = torch.randn(B, D_in)
E = torch.randn(N_experts, D_in, D_out)
gates = torch.rand(B, N_experts)
gates = F.one_hot(gates.argmax(1), N_experts).to_sparse()
x_dispatch = torch.rearrange(x, "bd->bnd", n=N_experts)
y_experts = torch.einsum("bnd,ndh->bnh", x_dispatch, E)
y = torch.einsum("bnd,bn->bd", y_experts, gates)
print("seed program:", tuple(y.shape))

# The layer: top-k sparse gating, only the selected experts computed.
moe = MoE(D_in, D_out, N_experts, k=1)
with torch.no_grad():
    for name, f in (("scorch MoE", lambda: moe(x)), ("dense one-hot", lambda: moe.dense_reference(x))):
        f()
        t0 = time.perf_counter()
        for _ in range(10):
            f()
        print(f"{name:14s} {1e3 * (time.perf_counter() - t0) / 10:7.2f} ms")
    print("agree:", torch.allclose(moe(x), moe.dense_reference(x), atol=1e-4))
