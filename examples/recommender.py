"""A LightFM-style recommender: sparse multi-hot user/item features times embedding tables.

Trains ``scorch.nn.Recommender`` on observed (user, item) pairs plus sampled negatives,
scoring only those pairs (an SDDMM over the pair pattern, never the dense matrix).

    python examples/recommender.py
"""

import torch

import scorch
from scorch.datasets import multi_hot
from scorch.nn import Recommender

torch.manual_seed(0)
n_users, n_items = 2048, 512
users = multi_hot(n_users, 50_000, 24, seed=1)        # SparseTensor, 24 features per user
items = multi_hot(n_items, 20_000, 12, seed=2)
liked = torch.rand(n_users, n_items) < 0.01           # observed interactions
negative = torch.rand(n_users, n_items) < 0.03        # sampled negatives
scored = liked | negative
pairs = scorch.as_sparse(scored.float(), "csr")       # the pairs to score
label = liked[scored].float()                         # one label per stored pair, in CSR (row-major) order

model = Recommender(50_000, 20_000, 32)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
for step in range(30):
    opt.zero_grad()
    scores = model(users, items, pairs)               # SparseTensor in the pattern of pairs
    loss = torch.nn.functional.binary_cross_entropy_with_logits(scores.values(), label)
    loss.backward()
    opt.step()
    if step % 10 == 0 or step == 29:
        print(f"step {step:2d}  loss {loss.item():.4f}  ({pairs.nnz} pairs scored)")
