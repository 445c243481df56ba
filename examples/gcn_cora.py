"""Train a 2-layer GCN on Cora (shipped with scorch) with scorch.nn.GCNConv.

    python examples/gcn_cora.py [--epochs 200]
"""

import argparse

import torch

from scorch.datasets import load_graph
from scorch.nn import GCNConv


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=200)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = load_graph("cora")
    n = g.num_nodes
    A = g.adjacency("csr")                                   # a SparseTensor adjacency
    X = g.features().to_dense()                              # bag-of-words, 2708 x 1433
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    y = g.labels()
    perm = torch.randperm(n)
    train, test = perm[:700], perm[1708:]

    conv1, conv2 = GCNConv(X.shape[1], 16, cached=True), GCNConv(16, int(y.max()) + 1, cached=True)
    opt = torch.optim.Adam([*conv1.parameters(), *conv2.parameters()], lr=0.02, weight_decay=5e-4)
    for epoch in range(args.epochs):
        opt.zero_grad()
        h = torch.nn.functional.dropout(torch.relu(conv1(X, A)), 0.5, training=True)
        loss = torch.nn.functional.cross_entropy(conv2(h, A)[train], y[train])
        loss.backward()
        opt.step()
        if epoch % 20 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:3d}  loss {loss.item():.3f}")
    with torch.no_grad():
        acc = (conv2(torch.relu(conv1(X, A)), A).argmax(1)[test] == y[test]).float().mean().item()
    print(f"test accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
