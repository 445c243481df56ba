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
    ``"sparse"`` / ``"dense"`` force one path (a result that is sparse -- SDDMM's, SpGEMM's,
    one ``format=`` asks for -- is always computed sparse).

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

import sys
import types

from .errors import ScorchTypeError, ScorchValueError

dense_fallback = "warn"
dense_fallback_max_bytes = 2 << 30
dispatch = "auto"
dense_threshold = None
auto_sparsify = False
parallel_min_work = 16384
dense_kernels = "auto"

_FALLBACK_CHOICES = ("warn", "silent", "raise")
_DISPATCH_CHOICES = ("auto", "sparse", "dense")
_KERNEL_CHOICES = ("auto", "compiled", "torch")


def _one_of(name: str, choices: tuple):
    def check(value):
        if not isinstance(value, str) or value not in choices:
            raise ScorchValueError(f"scorch.config.{name} must be one of {choices}, got {value!r}")
    return check


def _count(name: str, none_ok: bool):
    def check(value):
        if value is None and none_ok:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ScorchValueError(f"scorch.config.{name} must be a non-negative int{' or None' if none_ok else ''}, "
                                   f"got {value!r}")
    return check


def _threshold(value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1):
        raise ScorchValueError(f"scorch.config.dense_threshold must be in [0, 1] or None, got {value!r}")


def _flag(value):
    if not isinstance(value, bool):
        raise ScorchTypeError(f"scorch.config.auto_sparsify must be True or False, got {value!r}")


_CHECKS = {"dense_fallback": _one_of("dense_fallback", _FALLBACK_CHOICES),
           "dense_fallback_max_bytes": _count("dense_fallback_max_bytes", True),
           "dispatch": _one_of("dispatch", _DISPATCH_CHOICES), "dense_threshold": _threshold,
           "auto_sparsify": _flag, "parallel_min_work": _count("parallel_min_work", False),
           "dense_kernels": _one_of("dense_kernels", _KERNEL_CHOICES)}


class _Settings(types.ModuleType):
    """This module, whose settings are checked when set (a bad value raised only at its first
    use, or never: ``auto_sparsify = "yes"``); an unknown name (a typo) raises too."""

    def __setattr__(self, name, value):
        check = _CHECKS.get(name)
        if check is None and not name.startswith("_"):
            raise AttributeError(f"scorch.config has no setting {name!r}; the settings: {', '.join(_CHECKS)}")
        if check is not None:
            check(value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Settings
