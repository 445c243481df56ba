"""Process-wide settings.  Set them as attributes: ``scorch.config.dense_fallback = "raise"``.

dense_fallback
    What happens when a torch op without a sparse implementation meets a
    SparseTensor: ``"warn"`` (default: densify, run torch's op, warn once per
    op name), ``"silent"`` (densify without a warning) or ``"raise"``.

dense_fallback_max_bytes
    The largest dense copy (bytes, all of an op's sparse operands together) that
    ``dense_fallback`` makes: beyond it the op raises instead (2 GiB by default; a
    graph of a million nodes is 4 TB dense, and an allocation that large can get the
    process killed rather than fail).  None: no limit.

dispatch
    ``"auto"`` (default): an einsum / matmul whose result is dense runs on dense
    torch kernels when a sparse operand is denser than the crossover measured on
    this machine (:mod:`scorch.runtime`), else on scorch's sparse kernels;
    ``"sparse"`` / ``"dense"`` force one path.

dense_threshold
    None (default: calibrate once per machine, cached) or a density in [0, 1].

auto_sparsify
    False (default); True runs 2-d dense operands that are mostly zeros (after a
    ReLU, say) through the sparse kernels.

dense_kernels
    ``"auto"`` (default): the dense linear maps inside scorch's layers (``x @ W^T`` in
    GCN, GraphSAGE, GAT, attention) run on a generated kernel where it measured faster
    than torch's for that shape on this machine (:mod:`scorch.ops.dense`), else on
    torch's; ``"compiled"`` / ``"torch"`` force one.

parallel_min_work
    Kernels whose loop nest does fewer inner iterations than this (stored
    entries times the sizes of the dense loops around them) run on one thread:
    waking a sleeping OpenMP thread costs tens of microseconds. 0 always uses
    ``torch.get_num_threads()`` threads.
"""

dense_fallback = "warn"
dense_fallback_max_bytes = 2 << 30
dispatch = "auto"
dense_threshold = None
auto_sparsify = False
parallel_min_work = 16384
dense_kernels = "auto"

_FALLBACK_CHOICES = ("warn", "silent", "raise")
