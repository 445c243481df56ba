"""Graphs for demos, tests and benchmarks: the real ones as ``.npz`` edge lists
(format of ``shared/data/README.md``: ``edge_index`` 2 x nnz, ``num_nodes``), and
deterministic synthetic ones (R-MAT power-law, uniform random).

Cora ships with the package (``load_graph("cora")``); the others are looked up
in a directory (``data_dir=`` or ``$SCORCH_DATA``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from .errors import ScorchValueError
from .interop import sparse_coo
from .tensor import SparseTensor

__all__ = ["Graph", "load_graph", "rmat", "uniform_random"]


@dataclass
class Graph:
    name: str
    edge_index: torch.Tensor  # int64, 2 x nnz
    num_nodes: int
    extras: dict = field(default_factory=dict)

    def adjacency(self, format="csr", dtype=torch.float32) -> SparseTensor:
        """The 0/1 adjacency matrix (num_nodes x num_nodes)."""
        ones = torch.ones(self.edge_index.shape[1], dtype=dtype)
        return sparse_coo(self.edge_index, ones, (self.num_nodes, self.num_nodes), format=format)


def load_graph(name_or_path: str | os.PathLike = "cora", data_dir: str | os.PathLike | None = None) -> Graph:
    """Load ``cora`` (shipped), another named graph from ``data_dir``/``$SCORCH_DATA``, or an ``.npz`` path."""
    path = Path(name_or_path)
    if path.suffix != ".npz":
        name = str(name_or_path).lower()
        if name == "cora" and data_dir is None:
            with resources.as_file(resources.files("scorch") / "data" / "cora.npz") as p:
                return _read_npz(p, name)
        base = data_dir or os.environ.get("SCORCH_DATA")
        if base is None:
            raise ScorchValueError(f"load_graph: {name!r} is not shipped; pass data_dir= or set $SCORCH_DATA")
        path = Path(base) / f"{name}.npz"
    if not path.exists():
        raise ScorchValueError(f"load_graph: no file {path}")
    return _read_npz(path, path.stem)


def _read_npz(path, name) -> Graph:
    with np.load(path) as z:
        if "edge_index" not in z or "num_nodes" not in z:
            raise ScorchValueError(f"load_graph: {path} lacks 'edge_index' / 'num_nodes'")
        ei = torch.from_numpy(np.asarray(z["edge_index"], dtype=np.int64))
        extras = {k: z[k] for k in z.files if k not in ("edge_index", "num_nodes")}
        return Graph(name, ei, int(z["num_nodes"]), extras)


def rmat(scale: int, nnz: int, *, a=0.57, b=0.19, c=0.19, seed: int = 0) -> Graph:
    """R-MAT power-law graph on ``2**scale`` nodes with about ``nnz`` distinct directed
    edges (duplicates and self-loops dropped), deterministic for a seed."""
    g = torch.Generator().manual_seed(seed)
    n = 2 ** scale
    want = int(nnz * 1.15) + 16  # oversample: duplicates are dropped
    r = torch.rand(want, scale, generator=g)
    right = (r >= a) & (r < a + b) | (r >= a + b + c)   # quadrants b, d: column bit set
    down = r >= a + b                                   # quadrants c, d: row bit set
    weights = 2 ** torch.arange(scale - 1, -1, -1)
    rows, cols = (down.long() * weights).sum(1), (right.long() * weights).sum(1)
    # permute node ids so the heavy rows are not all at the top
    perm = torch.randperm(n, generator=g)
    rows, cols = perm[rows], perm[cols]
    keep = rows != cols
    key = torch.unique(rows[keep] * n + cols[keep])
    key = key[torch.randperm(key.numel(), generator=g)[:nnz]]
    return Graph(f"rmat{scale}", torch.stack([key // n, key % n]), n)


def uniform_random(n: int, nnz: int, *, seed: int = 0) -> Graph:
    """Erdos-Renyi-like graph: about ``nnz`` distinct uniformly random edges on ``n`` nodes."""
    g = torch.Generator().manual_seed(seed)
    key = torch.unique(torch.randint(0, n * n, (int(nnz * 1.05) + 16,), generator=g))
    key = key[torch.randperm(key.numel(), generator=g)[:nnz]]
    return Graph(f"uniform{n}", torch.stack([key // n, key % n]), n)
