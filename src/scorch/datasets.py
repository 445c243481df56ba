"""Graphs and sparse operands for demos, tests and benchmarks: the real graphs as
``.npz`` edge lists (format of ``shared/data/README.md``: ``edge_index`` 2 x nnz,
``num_nodes``), SNAP edge-list text and Matrix Market files, and deterministic
synthetic ones (R-MAT power-law graphs sized like the named data sets, uniform
random graphs, attention masks, multi-hot feature matrices, pruned weights).

Cora ships with the package (``load_graph("cora")``); the others are looked up
in a directory (``data_dir=`` or ``$SCORCH_DATA``).
"""

from __future__ import annotations

import gzip
import math
import os
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from .errors import ScorchTypeError, ScorchValueError
from .interop import from_coo
from .tensor import SparseTensor

__all__ = ["GRAPH_SIZES", "Graph", "attention_mask", "graph_like", "load_graph", "load_matrix_market",
           "load_snap", "multi_hot", "power_law_graph", "pruned_weight", "rmat", "save_matrix_market",
           "uniform_random"]


@dataclass
class Graph:
    name: str
    edge_index: torch.Tensor  # int64, 2 x nnz
    num_nodes: int
    extras: dict = field(default_factory=dict)

    def adjacency(self, format="csr", dtype=torch.float32) -> SparseTensor:
        """The 0/1 adjacency matrix (num_nodes x num_nodes)."""
        ones = torch.ones(self.edge_index.shape[1], dtype=dtype)
        return from_coo(self.edge_index, ones, (self.num_nodes, self.num_nodes), format=format)

    def features(self, dtype=torch.float32) -> SparseTensor | None:
        """The node features stored with the graph (``x_indptr`` / ``x_indices`` / ``x_data`` /
        ``x_shape``: Cora's and CiteSeer's bag-of-words) as a CSR SparseTensor, or None."""
        keys = ("x_indptr", "x_indices", "x_data", "x_shape")
        if not all(k in self.extras for k in keys):
            return None
        indptr, indices, data, shape = (np.asarray(self.extras[k]) for k in keys)
        return SparseTensor.from_levels("csr", tuple(int(v) for v in shape),
                                        [None, torch.from_numpy(indptr.astype(np.int64))],
                                        [None, torch.from_numpy(indices.astype(np.int64))],
                                        torch.from_numpy(data).to(dtype))

    def labels(self) -> torch.Tensor | None:
        """The node labels stored with the graph (``y``) as int64, or None."""
        return torch.from_numpy(np.asarray(self.extras["y"], dtype=np.int64)) if "y" in self.extras else None


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
    # (scale <= 31: the edge keys row * n + col are int64)
    scale, nnz = _check_int("rmat", "scale", scale, 1, 31), _check_int("rmat", "nnz", nnz)
    seed = check_seed("rmat", seed)
    for name, p in (("a", a), ("b", b), ("c", c)):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ScorchValueError(f"rmat: {name} must be a probability in [0, 1], got {p!r}")
    if a + b + c > 1:
        raise ScorchValueError(f"rmat: a + b + c must be at most 1 (d = 1 - a - b - c), got {a + b + c}")
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
    n, nnz = _check_int("uniform_random", "n", n, 1, 3_037_000_499), _check_int("uniform_random", "nnz", nnz)
    seed = check_seed("uniform_random", seed)   # (n <= sqrt(2**63): the edge keys n * n are int64)
    g = torch.Generator().manual_seed(seed)
    key = torch.unique(torch.randint(0, n * n, (int(nnz * 1.05) + 16,), generator=g))
    key = key[torch.randperm(key.numel(), generator=g)[:nnz]]
    return Graph(f"uniform{n}", torch.stack([key // n, key % n]), n)


# ------------------------------------------------------------------ file readers
def _open_text(path: Path, mode="rt"):
    """A text handle on ``path``, through gzip when the name ends in ``.gz``."""
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="ascii" if "r" in mode else None)
    return open(path, mode)


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".txt", ".tsv", ".csv", ".edges", ".mtx"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


def load_snap(path: str | os.PathLike, *, directed: bool = False, num_nodes: int | None = None) -> Graph:
    """A SNAP edge list (text lines ``src<whitespace>dst``, ``#`` comments, optionally
    gzipped as ``*.gz``) as a :class:`Graph`.

    Node ids may be any non-negative integers, not contiguous: they are relabelled
    ``0..n-1`` in sorted order of the original ids (kept in ``extras["node_ids"]``).
    ``directed=False`` stores every edge in both directions. Self-loops and duplicate
    edges are dropped; edges come out sorted by (source, target). Columns after the
    second (weights, timestamps) are ignored. ``num_nodes`` (at least the number of
    distinct ids in the file) adds isolated nodes after the relabelled ones.
    """
    path = Path(path)
    if not path.exists():
        raise ScorchValueError(f"load_snap: no file {path}")
    try:
        with _open_text(path) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns on an empty file
            e = np.loadtxt(f, comments="#", dtype=np.int64, usecols=(0, 1), ndmin=2)
    except (ValueError, IndexError, OSError, EOFError, UnicodeDecodeError) as err:
        raise ScorchValueError(
            f"load_snap: {path} is not a SNAP edge list (expected lines 'src dst' of integer "
            f"node ids and '#' comments): {err}") from None
    if e.size and e.min() < 0:
        raise ScorchValueError(f"load_snap: {path}: node ids must be >= 0, got {int(e.min())}")
    ids, inv = np.unique(e, return_inverse=True)
    inv = inv.reshape(e.shape)
    n = len(ids)
    if num_nodes is not None:
        if not isinstance(num_nodes, (int, np.integer)) or num_nodes < n:
            raise ScorchValueError(
                f"load_snap: num_nodes must be an int >= the {n} distinct node ids in {path}, got {num_nodes!r}")
        n = int(num_nodes)
    src, dst = inv[:, 0], inv[:, 1]
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = src != dst
    key = np.unique(src[keep] * max(n, 1) + dst[keep])
    ei = torch.from_numpy(np.stack([key // max(n, 1), key % max(n, 1)]).astype(np.int64))
    return Graph(_stem(path), ei, n, {"node_ids": ids})


_MM_FIELDS = ("real", "integer", "pattern")
_MM_SYMMETRIES = ("general", "symmetric", "skew-symmetric")


def _mm_header(path: Path):
    """``(field, symmetry, (rows, cols, nnz))`` of a coordinate Matrix Market file."""
    with _open_text(path) as f:
        banner = f.readline().split()
        if len(banner) != 5 or banner[0].lower() != "%%matrixmarket" or banner[1].lower() != "matrix":
            raise ScorchValueError(
                f"load_matrix_market: {path} does not start with a '%%MatrixMarket matrix ...' banner, "
                f"got {' '.join(banner)!r}")
        layout, field_, symmetry = (w.lower() for w in banner[2:])
        if layout != "coordinate":
            raise ScorchValueError(
                f"load_matrix_market: {path}: expected a 'coordinate' (sparse) matrix, got {layout!r}")
        if field_ not in _MM_FIELDS:
            raise ScorchValueError(
                f"load_matrix_market: {path}: field must be one of {_MM_FIELDS}, got {field_!r}")
        if symmetry not in _MM_SYMMETRIES:
            raise ScorchValueError(
                f"load_matrix_market: {path}: symmetry must be one of {_MM_SYMMETRIES}, got {symmetry!r}")
        line = f.readline()
        while line.startswith("%") or (line and not line.strip()):
            line = f.readline()
        try:
            m, n, nnz = (int(w) for w in line.split())
        except ValueError:
            raise ScorchValueError(
                f"load_matrix_market: {path}: expected a size line 'rows cols nnz', got {line.strip()!r}") from None
    return field_, symmetry, (m, n, nnz)


def _mm_parse(path: Path, field_, symmetry, size):
    """Own coordinate parser: ``(rows, cols, vals)`` 0-based, symmetric parts expanded."""
    m, n, nnz = size
    ncol = 2 if field_ == "pattern" else 3
    with _open_text(path) as f:
        line = f.readline()  # banner
        line = f.readline()
        while line.startswith("%") or not line.strip():
            line = f.readline()  # up to and including the size line
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                body = np.loadtxt(f, comments="%", dtype=np.float64 if field_ == "real" else np.int64, ndmin=2)
            except ValueError as err:
                raise ScorchValueError(f"load_matrix_market: {path}: bad entry line: {err}") from None
    if body.size == 0:
        body = body.reshape(0, ncol)
    if body.shape[0] != nnz or body.shape[1] < ncol:
        raise ScorchValueError(
            f"load_matrix_market: {path}: expected {nnz} entries of {ncol} columns, "
            f"got {body.shape[0]} of {body.shape[1]}")
    r, c = body[:, 0].astype(np.int64) - 1, body[:, 1].astype(np.int64) - 1
    if nnz and (r.min() < 0 or c.min() < 0 or r.max() >= m or c.max() >= n):
        raise ScorchValueError(
            f"load_matrix_market: {path}: 1-based indices must lie in [1, {m}] x [1, {n}], "
            f"got rows [{r.min() + 1}, {r.max() + 1}], cols [{c.min() + 1}, {c.max() + 1}]")
    v = np.ones(nnz, np.float64) if field_ == "pattern" else body[:, 2]
    if symmetry != "general":
        off = r != c
        sign = -1 if symmetry == "skew-symmetric" else 1
        r, c, v = np.concatenate([r, c[off]]), np.concatenate([c, r[off]]), np.concatenate([v, sign * v[off]])
    return r, c, v


def _scipy_mmread():
    try:
        from scipy.io import mmread
    except ImportError:  # pragma: no cover - scipy is optional
        return None
    return mmread


def load_matrix_market(path: str | os.PathLike, format="csr", *, dtype: torch.dtype | None = None) -> SparseTensor:
    """A Matrix Market coordinate file (``real``, ``integer`` or ``pattern``;
    ``general``, ``symmetric`` or ``skew-symmetric``; ``*.gz`` allowed) as a
    SparseTensor in ``format``.

    Symmetric files are expanded (the diagonal is not doubled). Values are float64
    (real), int64 (integer) or 1.0 float64 (pattern) unless ``dtype`` is given.
    Uses ``scipy.io.mmread`` when scipy is installed, else a small parser.
    """
    path = Path(path)
    if not path.exists():
        raise ScorchValueError(f"load_matrix_market: no file {path}")
    field_, symmetry, size = _mm_header(path)
    mmread = _scipy_mmread()
    if mmread is not None:
        try:
            coo = mmread(str(path))
        except (ValueError, RuntimeError, OverflowError, IndexError, OSError) as err:  # scipy's varied errors
            raise ScorchValueError(f"load_matrix_market: {path}: {err}") from None
        coo = coo.tocoo()
        r, c, v = np.asarray(coo.row, np.int64), np.asarray(coo.col, np.int64), np.asarray(coo.data)
    else:
        r, c, v = _mm_parse(path, field_, symmetry, size)
    want = dtype or (torch.int64 if field_ == "integer" else torch.float64)
    vals = torch.from_numpy(np.ascontiguousarray(v)).to(want)
    return from_coo(torch.from_numpy(np.stack([r, c])), vals, size[:2], format=format)


def save_matrix_market(A, path: str | os.PathLike, *, comment: str | None = None) -> None:
    """Write a 2-d SparseTensor (or dense / ``torch.sparse`` tensor: its nonzeros) as a
    ``coordinate general`` Matrix Market file: field ``pattern`` for bool, ``integer``
    for integer dtypes, ``real`` otherwise (17 significant digits: float64 round-trips).
    A ``*.gz`` path is gzipped."""
    from .interop import as_sparse
    if comment is not None and not isinstance(comment, str):
        raise ScorchTypeError(f"save_matrix_market: comment must be a str or None, got {type(comment).__name__}")
    if not isinstance(A, SparseTensor):
        if not isinstance(A, torch.Tensor):
            raise ScorchValueError(f"save_matrix_market: A must be a tensor, got {type(A).__name__}")
        A = as_sparse(A, "coo")
    if A.dim() != 2:
        raise ScorchValueError(f"save_matrix_market: A must be 2-d, got shape {tuple(A.shape)}")
    idx, vals = A.detach().coo()
    idx = idx.numpy() + 1
    vals = vals.detach()
    if vals.dtype == torch.bool:
        field_, fmt = "pattern", "%d %d"
        cols = idx[:, vals.numpy()].T  # explicitly stored False entries are not written
    elif vals.is_complex():
        raise ScorchValueError(f"save_matrix_market: complex dtype {vals.dtype} is not supported")
    elif not vals.is_floating_point():
        field_, fmt = "integer", "%d %d %d"
        cols = np.column_stack([idx.T, vals.to(torch.int64).numpy()])
    else:
        field_, fmt = "real", "%d %d %.17g"
        cols = np.column_stack([idx.T.astype(np.float64), vals.to(torch.float64).numpy()])
    path = Path(path)
    with _open_text(path, "wt") as f:
        f.write(f"%%MatrixMarket matrix coordinate {field_} general\n")
        for line in (comment or "").splitlines():
            f.write(f"% {line}\n")
        f.write(f"{A.shape[0]} {A.shape[1]} {len(cols)}\n")
        np.savetxt(f, cols, fmt=fmt)


# ------------------------------------------------------------------ generators
# name -> (nodes, directed edges stored, symmetric). The real graphs (shared/data)
# are undirected with both directions stored; ogbn-arxiv is a directed citation
# graph; Reddit (114.6M edges) is capped at 2M edges.
GRAPH_SIZES = {
    "cora": (2_708, 10_556, True),
    "citeseer": (3_327, 9_104, True),
    "pubmed": (19_717, 88_648, True),
    "ca-astroph": (18_772, 396_100, True),
    "ogbn-arxiv": (169_343, 1_166_243, False),
    "reddit-like": (232_965, 2_000_000, True),
}


def _check_int(fn, name, x, lo=0, hi=None):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo or (hi is not None and x > hi):
        raise ScorchValueError(f"{fn}: {name} must be an int >= {lo}{f' and <= {hi}' if hi is not None else ''}"
                               f", got {x!r}")
    return int(x)


def check_seed(fn: str, seed) -> int:
    """``seed`` as a generator seed (an int in int64's range or uint64's, as torch.Generator takes),
    or an error naming ``fn``'s argument."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not -2**63 <= seed < 2**64:
        raise ScorchTypeError(f"{fn}: seed must be an int, got {seed!r}")
    return int(seed)


def power_law_graph(num_nodes: int, num_edges: int, seed: int = 0, *, symmetric: bool = False) -> Graph:
    """An R-MAT power-law graph on exactly ``num_nodes`` nodes with exactly
    ``num_edges`` distinct directed edges (no self-loops), deterministic for a seed.

    R-MAT runs at ``scale = ceil(log2(num_nodes))``; edges touching ids ``>= num_nodes``
    are dropped (R-MAT's node ids are randomly permuted, so this is an unbiased cut).
    ``symmetric=True`` stores every edge in both directions (``num_edges`` counts both,
    so it must be even), like the real undirected graphs.
    """
    n = _check_int("power_law_graph", "num_nodes", num_nodes, 1, 2**31)   # (rmat's scale <= 31)
    m = _check_int("power_law_graph", "num_edges", num_edges, 0)
    seed = check_seed("power_law_graph", seed)
    if symmetric and m % 2:
        raise ScorchValueError(f"power_law_graph: symmetric=True stores both directions, so num_edges "
                               f"must be even, got {m}")
    want = m // 2 if symmetric else m
    most = n * (n - 1) // (2 if symmetric else 1)
    if want > most:
        raise ScorchValueError(f"power_law_graph: at most {most} {'undirected' if symmetric else 'directed'} "
                               f"edges fit on {n} nodes without self-loops, got num_edges={m}")
    if m == 0:
        return Graph(f"powerlaw{n}", torch.zeros(2, 0, dtype=torch.int64), n)
    scale = max(1, math.ceil(math.log2(n)))
    big = 2 ** scale
    factor = (big / n) ** 2 * (2.0 if symmetric else 1.0) * 1.1
    for attempt in range(8):  # oversample more until enough distinct edges survive the cut
        g = rmat(scale, int(want * factor) + 64, seed=seed + 7919 * attempt)
        r, c = g.edge_index
        keep = (r < n) & (c < n)
        r, c = r[keep], c[keep]  # already in rmat's random order
        if symmetric:
            r, c = torch.minimum(r, c), torch.maximum(r, c)
        key = r * n + c
        uniq, inv = torch.unique(key, return_inverse=True)
        first = torch.full((uniq.numel(),), key.numel(), dtype=torch.int64)
        first.scatter_reduce_(0, inv, torch.arange(key.numel()), "amin")
        if uniq.numel() >= want:
            key = key[first.sort().values[:want]]  # the first `want` distinct, in random order
            break
        factor *= 2
    else:
        raise ScorchValueError(f"power_law_graph: could not draw {m} distinct R-MAT edges on {n} nodes "
                               f"(the graph is too dense for R-MAT); use uniform_random")
    r, c = key // n, key % n
    if symmetric:
        r, c = torch.cat([r, c]), torch.cat([c, r])
    key = torch.sort(r * n + c).values
    return Graph(f"powerlaw{n}", torch.stack([key // n, key % n]), n)


def graph_like(name: str, seed: int = 0) -> Graph:
    """A synthetic R-MAT graph with the node and edge counts of a named data set
    (``GRAPH_SIZES``: cora, citeseer, pubmed, ca-astroph, ogbn-arxiv, reddit-like),
    symmetric where the data set is undirected."""
    key = str(name).lower()
    seed = check_seed("graph_like", seed)
    if key not in GRAPH_SIZES:
        raise ScorchValueError(f"graph_like: name must be one of {sorted(GRAPH_SIZES)}, got {name!r}")
    n, m, sym = GRAPH_SIZES[key]
    g = power_law_graph(n, m, seed, symmetric=sym)
    g.name = f"{key}-like" if not key.endswith("-like") else key
    return g


def attention_mask(seq_len: int, kind: str = "window", *, window: int = 128, global_tokens: int | None = None,
                   random_blocks: int | None = None, block: int = 64, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> SparseTensor:
    """A sparse attention pattern (``seq_len x seq_len`` "csr", stored values 1).

    ``kind="window"``: token i attends j when ``|i - j| <= window // 2`` (plus
    ``global_tokens``, default 0). ``kind="bigbird"``: that window, plus the first
    ``global_tokens`` tokens (default ``block``) attending and attended by all, plus
    ``random_blocks`` (default 3) random ``block x block`` key blocks per query block
    (seeded). ``dtype=torch.bool`` gives a bool pattern.
    """
    L = _check_int("attention_mask", "seq_len", seq_len, 1)
    if kind not in ("window", "bigbird"):
        raise ScorchValueError(f"attention_mask: kind must be 'window' or 'bigbird', got {kind!r}")
    w = _check_int("attention_mask", "window", window, 0)
    b = _check_int("attention_mask", "block", block, 1)
    gt = _check_int("attention_mask", "global_tokens",
                    (b if kind == "bigbird" else 0) if global_tokens is None else global_tokens, 0)
    rb = _check_int("attention_mask", "random_blocks",
                    (3 if kind == "bigbird" else 0) if random_blocks is None else random_blocks, 0)
    seed = check_seed("attention_mask", seed)
    h = w // 2
    i = torch.arange(L).repeat_interleave(2 * h + 1)
    j = i + torch.arange(-h, h + 1).repeat(L)
    ok = (j >= 0) & (j < L)
    keys = [i[ok] * L + j[ok]]
    gt = min(gt, L)
    if gt:
        gi = torch.arange(gt).repeat_interleave(L)
        al = torch.arange(L).repeat(gt)
        keys += [gi * L + al, al * L + gi]
    if rb:
        nb = -(-L // b)
        rb = min(rb, nb)
        g = torch.Generator().manual_seed(seed)
        bj = torch.rand(nb, nb, generator=g).argsort(1)[:, :rb]          # nb x rb key blocks
        bi = torch.arange(nb).repeat_interleave(rb)
        bj = bj.reshape(-1)
        off = torch.arange(b)
        ti = (bi[:, None, None] * b + off[None, :, None]).expand(-1, b, b).reshape(-1)
        tj = (bj[:, None, None] * b + off[None, None, :]).expand(-1, b, b).reshape(-1)
        ok = (ti < L) & (tj < L)
        keys.append(ti[ok] * L + tj[ok])
    key = torch.unique(torch.cat(keys))
    return from_coo(torch.stack([key // L, key % L]), torch.ones(key.numel(), dtype=dtype), (L, L), format="csr")


def multi_hot(num_rows: int, num_features: int, nnz_per_row: int, seed: int = 0, power_law: bool = True, *,
              alpha: float = 1.1, dtype: torch.dtype = torch.float32) -> SparseTensor:
    """A ``num_rows x num_features`` "csr" matrix of 1s with exactly ``nnz_per_row``
    distinct features per row (recommender-style multi-hot input).

    ``power_law=True`` draws the features of each row without replacement with
    Zipf-like weights ``1 / (f + 1) ** alpha`` (feature 0 most popular); otherwise
    uniformly. Deterministic for a seed. Cost: ``num_rows * num_features`` random draws
    (Gumbel top-k, in row chunks).
    """
    R = _check_int("multi_hot", "num_rows", num_rows, 0)
    F = _check_int("multi_hot", "num_features", num_features, 1)
    k = _check_int("multi_hot", "nnz_per_row", nnz_per_row, 0)
    if k > F:
        raise ScorchValueError(f"multi_hot: nnz_per_row must be <= num_features ({F}), got {k}")
    g = torch.Generator().manual_seed(check_seed("multi_hot", seed))
    logw = (-alpha * torch.log(torch.arange(1, F + 1, dtype=torch.float64))) if power_law else None
    chunk = max(1, (1 << 22) // F)
    cols = []
    for start in range(0, R, chunk):  # loop over row chunks (memory), not entries
        rows = min(chunk, R - start)
        u = torch.rand(rows, F, generator=g, dtype=torch.float64).clamp_min_(1e-300)
        key = -torch.log(-torch.log(u))          # Gumbel noise
        if logw is not None:
            key += logw
        cols.append(torch.topk(key, k, dim=1, sorted=False).indices.sort(1).values)
    c = torch.cat(cols).reshape(-1) if cols else torch.zeros(0, dtype=torch.int64)
    r = torch.arange(R).repeat_interleave(k)
    return from_coo(torch.stack([r, c]), torch.ones(R * k, dtype=dtype), (R, F), format="csr")


def pruned_weight(out_features: int, in_features: int, sparsity: float, seed: int = 0, *,
                  dtype: torch.dtype = torch.float32) -> SparseTensor:
    """A magnitude-pruned ``out_features x in_features`` weight as a "csr" SparseTensor.

    The dense weight is ``randn / sqrt(in_features)`` (seeded); the
    ``round((1 - sparsity) * numel)`` entries of largest magnitude are kept.
    The dense weight is ``pruned_weight(...).to_dense()`` where kept, 0 elsewhere.
    """
    o = _check_int("pruned_weight", "out_features", out_features, 1)
    i = _check_int("pruned_weight", "in_features", in_features, 1)
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity <= 1.0:
        raise ScorchValueError(f"pruned_weight: sparsity must be a number in [0, 1], got {sparsity!r}")
    g = torch.Generator().manual_seed(check_seed("pruned_weight", seed))
    W = torch.randn(o, i, generator=g, dtype=torch.float64) / math.sqrt(i)
    keep = round((1.0 - sparsity) * o * i)
    flat = torch.topk(W.abs().reshape(-1), keep, sorted=False).indices.sort().values
    return from_coo(torch.stack([flat // i, flat % i]), W.reshape(-1)[flat].to(dtype), (o, i), format="csr")
