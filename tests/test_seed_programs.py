"""Programs from the seed documents, run verbatim with ``import scorch as torch``
(the seed's ``torch_einsum`` typo read as ``torch.einsum``), against plain torch."""

import textwrap

import pytest
import torch as real_torch

from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

MOE = textwrap.dedent("""
    import scorch as torch
    from scorch.nn import functional as F

    # Inputs, (B, D_in)
    x = torch.randn(B, D_in)
    # Expert embeddings, (N_experts, D_in, D_out)
    E = torch.randn(N_experts, D_in, D_out)
    # Sparse gating function, (B, N_experts)
    gates = torch.rand(B, N_experts)
    # Select one expert per input
    gates = F.one_hot(gates.argmax(1), N_experts).to_sparse()
    # Dispatch inputs to experts, (B, N_experts, D_in)
    x_dispatch = torch.rearrange(x, "bd->bnd", n=N_experts)
    # Apply experts, (B, N_experts, D_out)
    y_experts = torch.einsum("bnd,ndh->bnh", x_dispatch, E)
    # Combine expert outputs, (B, D_out)
    y = torch.einsum("bnd,bn->bd", y_experts, gates)
""")


@pytest.mark.parametrize("B,D_in,D_out,N_experts", [(16, 8, 4, 4), (64, 32, 16, 8), (5, 3, 2, 1)])
def test_mixture_of_experts_seed(B, D_in, D_out, N_experts):
    real_torch.manual_seed(0)
    env = {"B": B, "D_in": D_in, "D_out": D_out, "N_experts": N_experts}
    exec(MOE, env)
    x, E, gates = env["x"], env["E"], env["gates"]
    # the dense version, in plain torch
    g = gates.to_dense().to(x.dtype)
    want = real_torch.einsum("bnh,bn->bh", real_torch.einsum("bd,ndh->bnh", x, E), g)
    assert env["y"].shape == (B, D_out) and env["y"].dtype == real_torch.float32
    real_torch.testing.assert_close(env["y"], want, rtol=1e-5, atol=1e-5)
    # each row picks exactly its expert
    chosen = g.argmax(1)
    real_torch.testing.assert_close(env["y"], real_torch.stack([x[b] @ E[chosen[b]] for b in range(B)]),
                                    rtol=1e-5, atol=1e-5)
