"""Train a 2-layer GAT (8 heads x 8 channels, then one head) on Cora with scorch.nn.GATConv.

All heads of a layer share one sparse softmax and one generated SpMM; inference time is
printed beside the same model written with torch.sparse, one head at a time.

    python examples/gat_cora.py [--epochs 100]
"""

import argparse
import time

import torch
import torch.nn.functional as F

from scorch.datasets import load_graph
from scorch.nn import GATConv


def torch_sparse_gat(layer, x, A):
    """The layer in plain torch.sparse: a sparse softmax and an SpMM per head."""
    n, H, C = x.shape[0], layer.heads, layer.out_channels
    row, col = A.indices()
    h = (x @ layer.lin.weight.t()).view(n, H, C)
    a_src, a_dst = (h * layer.att_src).sum(-1), (h * layer.att_dst).sum(-1)
    outs = []
    for k in range(H):
        e = F.leaky_relu(a_dst[row, k] + a_src[col, k], layer.negative_slope)
        S = torch.sparse_coo_tensor(A.indices(), e, (n, n), is_coalesced=True, check_invariants=False)
        P = torch.sparse.softmax(S, 1)
        outs.append(torch.sparse.mm(P, h[:, k]))
    out = torch.cat(outs, 1) if layer.concat else torch.stack(outs).mean(0)
    return out + layer.bias


def median_ms(f, repeat=20):
    f()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=100)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = load_graph("cora")
    A = g.adjacency("csr")
    X = g.features().to_dense()
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    y = g.labels()
    perm = torch.randperm(g.num_nodes)
    train, test = perm[:700], perm[1708:]

    conv1 = GATConv(X.shape[1], 8, heads=8, dropout=0.6, cached=True)
    conv2 = GATConv(64, int(y.max()) + 1, heads=1, cached=True)
    opt = torch.optim.Adam([*conv1.parameters(), *conv2.parameters()], lr=0.005, weight_decay=5e-4)
    for epoch in range(args.epochs):
        conv1.train()
        opt.zero_grad()
        h = F.elu(conv1(F.dropout(X, 0.6, training=True), A))
        loss = F.cross_entropy(conv2(F.dropout(h, 0.6, training=True), A)[train], y[train])
        loss.backward()
        opt.step()
        if epoch % 20 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:3d}  loss {loss.item():.3f}")

    conv1.eval()
    with torch.no_grad():
        out = conv2(F.elu(conv1(X, A)), A)
        print(f"test accuracy {(out.argmax(1)[test] == y[test]).float().mean().item():.3f}")
        # the same model in torch.sparse (self-loops added as GATConv adds them)
        loops = torch.arange(g.num_nodes)
        ei = torch.cat([g.edge_index.flip(0), torch.stack([loops, loops])], 1)   # (target, source) pairs
        T = torch.sparse_coo_tensor(ei, torch.ones(ei.shape[1]), (g.num_nodes,) * 2,
                                    check_invariants=True).coalesce()
        ref = torch_sparse_gat(conv2, F.elu(torch_sparse_gat(conv1, X, T)), T)
        print(f"agree: {torch.allclose(out, ref, atol=1e-4)}")
        ms = median_ms(lambda: conv2(F.elu(conv1(X, A)), A))
        ms_t = median_ms(lambda: torch_sparse_gat(conv2, F.elu(torch_sparse_gat(conv1, X, T)), T))
        print(f"inference: scorch {ms:.2f} ms, torch.sparse {ms_t:.2f} ms ({ms_t / ms:.2f}x)")


if __name__ == "__main__":
    main()
