"""A LightFM-style recommender: sparse multi-hot user/item features times embedding tables.

    python examples/recommender.py
"""

import torch

from scorch.datasets import multi_hot

torch.manual_seed(0)
users = multi_hot(2048, 50_000, 24, seed=1)        # SparseTensor, 24 features per user
items = multi_hot(512, 20_000, 12, seed=2)
U = torch.nn.Parameter(torch.randn(50_000, 32) * 0.01)
V = torch.nn.Parameter(torch.randn(20_000, 32) * 0.01)
target = (torch.rand(2048, 512) < 0.01).float()
opt = torch.optim.Adam([U, V], lr=0.05)
for step in range(30):
    opt.zero_grad()
    scores = (users @ U) @ (items @ V).t()          # SpMM, SpMM, dense product
    loss = torch.nn.functional.binary_cross_entropy_with_logits(scores, target)
    loss.backward()
    opt.step()
    if step % 10 == 0 or step == 29:
        print(f"step {step:2d}  loss {loss.item():.4f}")
