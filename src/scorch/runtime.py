"""Runtime dispatch between sparse kernels and dense torch (seed 001: a runtime
that adapts to dense and sparse data).

Per einsum call whose result is dense, a sparse operand that is dense enough
runs through torch's dense (BLAS) kernels instead; where the line lies is
measured on this machine once -- the density at which dense ``torch.mm``
catches up with scorch's SpMM -- and cached on disk beside the kernel cache
(keyed by CPU, thread count and torch version), not hard-coded.  With
``scorch.config.auto_sparsify`` a 2-d dense operand that is mostly zeros
(e.g. after ReLU) takes the sparse path.  ``scorch.explain`` reports the path
and why.

Settings (``scorch.config``): ``dispatch = "auto" | "sparse" | "dense"``;
``dense_threshold`` (None: calibrated) ; ``auto_sparsify`` (bool).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from . import config
from .tensor import SparseTensor

_CAL_VERSION = 1
SURELY_SPARSE = 0.01  # below this density the sparse kernels run without asking the calibration
_memo: dict = {}


@dataclass(frozen=True)
class Decision:
    path: str        # "sparse" or "dense"
    why: tuple       # (format string, *arguments): formatted only when ``reason`` is read (hot path)

    @property
    def reason(self) -> str:
        return self.why[0].format(*self.why[1:])


def _machine_key() -> str:
    return _machine_key_for(torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _machine_key_for(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"v{_CAL_VERSION}|{cpu}|{threads} threads|torch {torch.__version__}"


def _cache_file():
    from .compiler import build
    return build.cache_dir() / "calibration.json"


def calibrate(n: int = 1024, k: int = 64, densities=(0.01, 0.03, 0.1, 0.2, 0.35, 0.5), repeat: int = 5) -> float:
    """Measure the density at which dense ``torch.mm`` is as fast as scorch's SpMM (n x n
    times n x k); 1.0 if the sparse kernel wins everywhere measured."""
    from .compiler.driver import einsum  # the sparse kernel itself, not the dispatching einsum
    from .interop import as_sparse
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, k, generator=g)
    for d in densities:
        dense = torch.randn(n, n, generator=g) * (torch.rand(n, n, generator=g) < d)
        S = as_sparse(dense, "csr")
        einsum("ij,jk->ik", S, X), dense @ X  # warm up (compile once)
        ts, td = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            einsum("ij,jk->ik", S, X)
            t1 = time.perf_counter()
            dense @ X
            t2 = time.perf_counter()
            ts.append(t1 - t0)
            td.append(t2 - t1)
        if statistics.median(td) <= statistics.median(ts):
            return d
    return 1.0


def dense_threshold() -> float:
    """The density from which dense kernels are used (``config.dense_threshold``, else calibrated)."""
    if config.dense_threshold is not None:   # (in [0, 1]: scorch.config checks it when set)
        return float(config.dense_threshold)
    key = _machine_key()
    if key in _memo:
        return _memo[key]
    from .compiler import build
    path = None if os.environ.get("SCORCH_NO_CACHE") == "1" else _cache_file()   # (no disk cache: memo only)
    cached = _read_calibration(path) if path is not None else {}
    if isinstance(cached.get(key), (int, float)) and 0.0 <= cached[key] <= 1.0:
        _memo[key] = float(cached[key])
        return _memo[key]
    value = calibrate()
    _memo[key] = value
    if path is not None:
        try:  # best effort: an unwritable cache dir just means calibrating again next process
            path.parent.mkdir(parents=True, exist_ok=True)
            cached[key] = value
            build.write_atomic(path.parent, path.name, json.dumps(cached).encode())
        except OSError:
            pass
    return value


def _read_calibration(path) -> dict:
    """The calibration file's ``{machine key: density}`` entries; anything else in it (a file
    another program wrote, a broken one) reads as nothing: calibrated again and overwritten."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cached, dict):
        return {}
    return {k: v for k, v in cached.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def densest(ops) -> float:
    """The densest sparse operand's density, which :func:`decide` goes by; -1 with none (a
    loop, not generators: this runs on every call)."""
    density = -1.0
    for x in ops:
        if isinstance(x, SparseTensor):
            d = x._density
            if d > density:
                density = d
    return density


def decide(ops, dense_result) -> Decision:
    """Sparse or dense execution for one call (``ops``: the operands as given;
    ``dense_result``: whether the sparse plan's result is dense, a bool or a callable
    asked only when the answer matters -- it may need a plan)."""
    mode = config.dispatch   # (one of auto / sparse / dense: scorch.config checks it when set)
    density = densest(ops)
    if density < 0:
        return Decision("dense", ("no sparse operand",))
    if mode == "dense" and not (dense_result() if callable(dense_result) else dense_result):
        return Decision("sparse", ("the result is sparse (it keeps or builds a pattern, or format= asks for one): "
                                   "scorch.config.dispatch = 'dense' applies to dense results",))
    if mode != "auto":
        return Decision(mode, ("scorch.config.dispatch = {!r}", mode))
    if density < SURELY_SPARSE:
        return Decision("sparse", ("density {:.3g} < {}", density, SURELY_SPARSE))
    if not (dense_result() if callable(dense_result) else dense_result):
        return Decision("sparse", ("the result is sparse (it keeps or builds a pattern)",))
    t = dense_threshold()
    if density >= t:
        return Decision("dense", ("density {:.3g} >= {:.3g}, where dense BLAS wins on this machine", density, t))
    return Decision("sparse", ("density {:.3g} < {:.3g} (the calibrated crossover)", density, t))


def maybe_sparsify(ops):
    """With ``config.auto_sparsify``: 2-d dense float operands that are mostly zeros become CSR."""
    if not config.auto_sparsify:
        return ops
    from .interop import as_sparse
    out = []
    for x in ops:
        if (type(x) is torch.Tensor and x.dim() == 2 and x.layout == torch.strided and x.dtype.is_floating_point
                and not x.requires_grad and x.numel() >= 4096):
            density = float((x != 0).sum()) / x.numel()
            if density < min(0.5 * dense_threshold(), 0.1):
                x = as_sparse(x, "csr")
        out.append(x)
    return out


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep freed large blocks for reuse instead of returning them to the
    system (``mallopt``: mmap and trim thresholds at 2 GiB).  Returns whether it applied (False
    where the C library is not glibc).  Process-wide and never undone; not applied on import.

    Without it every tensor over 32 MiB is a fresh ``mmap`` whose pages fault in when first
    written (a 131072 x 256 float32 SpMM output: about 50 ms of page faults against an 8 ms
    fill here), for scorch's and torch's outputs alike.  The environment variables
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, or jemalloc / tcmalloc (as
    PyTorch's CPU tuning guide recommends), do the same from outside the process.  The price:
    the process keeps its peak heap -- up to 2 GiB free at its top; freeing more returns it in
    one go, on the next allocation (after an 8 GB dense computation here: a 0.2-0.7 s stall
    for whatever runs next)."""
    import ctypes
    import ctypes.util
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        big = ctypes.c_int(2**31 - 1)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, big)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, big))
    except (OSError, AttributeError):
        return False
