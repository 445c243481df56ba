"""``scorch.bench``: the benchmark suite.

``python -m scorch.bench [--quick] [--json FILE] [--plot FILE.png] [--data DIR] [--only NAME...]``

Workloads (``workloads.WORKLOADS``): ``kernels`` (SpMM, SDDMM, SpMV, SpGEMM, sparse
softmax), ``gnn`` (2-layer GCN / GraphSAGE / GAT inference), ``moe`` (top-k mixture of
experts), ``attention`` (windowed sparse attention), ``mlp`` (pruned MLP) and ``recsys``
(multi-hot embedding-bag lookup, LightFM-style scoring of candidate pairs).  Each
case builds its inputs once, runs every system, checks that their outputs agree
(a disagreeing or failing system becomes an error row and is not timed), then
times the systems alternated in one process and reports medians, the speedup
against the case's baseline (the faster of the baseline systems, e.g. the torch.sparse
CSR and COO routes), and the process's peak RSS after the case.
"""

from .report import format_summary, format_table, write_json, write_plot  # noqa: F401
from .workloads import WORKLOADS, Case, System, check_agreement, run_case, timeit  # noqa: F401
