"""Runtime dispatch: dense torch kernels for dense-enough operands, a calibrated threshold
cached per machine, auto-sparsification of mostly-zero dense operands; explain says why."""

import json

import pytest
import torch

import scorch
from scorch import runtime
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density) + 0.0


@pytest.fixture(autouse=True)
def auto(monkeypatch):
    monkeypatch.setattr(scorch.config, "dispatch", "auto")


@pytest.fixture
def threshold(monkeypatch):
    monkeypatch.setattr(scorch.config, "dense_threshold", 0.25)


def test_dense_enough_operand_runs_dense(threshold):
    a, x = rnd(40, 30, density=0.6), rnd(30, 8, density=1)
    A = scorch.as_sparse(a, "csr")
    plan = scorch.explain("ij,jk->ik", A, x)
    assert plan.dispatch.startswith("dense (density") and ">= 0.25" in plan.dispatch
    torch.testing.assert_close(A @ x, a @ x)


def test_sparse_operand_runs_sparse_kernels(threshold):
    A, x = scorch.as_sparse(rnd(40, 30, density=0.1), "csr"), rnd(30, 8, density=1)
    assert scorch.explain("ij,jk->ik", A, x).dispatch.startswith("sparse (density")
    assert scorch.explain("ij,jk->ik", scorch.as_sparse(rnd(400, 300, density=0.005), "csr"),
                          rnd(300, 2, density=1)).dispatch.startswith("sparse (density")


def _kernel_runs(monkeypatch) -> list:
    """A list that every einsum running a kernel appends to: the general path (driver.run) or the
    front door's bound call of a repeated signature (ops.einsum._cached)."""
    import importlib
    from scorch.compiler import driver
    front = importlib.import_module("scorch.ops.einsum")
    runs = []
    real, cached = driver.run, front._cached
    monkeypatch.setattr(driver, "run", lambda *a: runs.append(a) or real(*a))
    monkeypatch.setattr(front, "_cached", lambda *a: (lambda out: out if out is None else runs.append(a) or out)(
        cached(*a)))
    return runs


def test_the_path_follows_each_calls_density(threshold, monkeypatch):
    """Operands of one signature (format, shape, dtype) but different densities: the decision is
    taken per call, never cached with the signature."""
    runs = _kernel_runs(monkeypatch)
    x = rnd(30, 8, density=1)
    for density, kernel in [(0.6, False), (0.05, True), (0.6, False), (0.05, True)]:
        a = rnd(40, 30, density=density, seed=len(runs))
        runs.clear()
        torch.testing.assert_close(scorch.einsum("ij,jk->ik", scorch.as_sparse(a, "csr"), x), a @ x)
        assert bool(runs) == kernel


def test_the_path_follows_the_settings_between_calls(monkeypatch):
    """One signature and density, the dispatch settings changed between calls: each call's path
    follows the settings of its moment (the per-signature memo of decisions keys on them)."""
    runs = _kernel_runs(monkeypatch)
    a, x = rnd(40, 30, density=0.3), rnd(30, 8, density=1)
    A = scorch.as_sparse(a, "csr")
    for dispatch, threshold, kernel in [("auto", 0.25, False), ("auto", 0.5, True), ("auto", 0.25, False),
                                        ("sparse", 0.25, True), ("dense", 0.5, False), ("auto", 0.5, True)]:
        monkeypatch.setattr(scorch.config, "dispatch", dispatch)
        monkeypatch.setattr(scorch.config, "dense_threshold", threshold)
        runs.clear()
        torch.testing.assert_close(scorch.einsum("ij,jk->ik", A, x), a @ x)
        assert bool(runs) == kernel, (dispatch, threshold)


def test_sparse_results_stay_on_the_sparse_path(threshold):
    A = scorch.as_sparse(rnd(10, 12, density=0.9), "csr")
    plan = scorch.explain("ij,ik,jk->ij", A, rnd(10, 3, density=1), rnd(12, 3, density=1))
    assert plan.dispatch.startswith("sparse (the result is sparse")


def test_dense_path_is_differentiable(threshold):
    P = scorch.as_sparse(rnd(6, 5, density=0.8), "csr")
    v, x = P.values().clone().requires_grad_(), rnd(5, 3, density=1).requires_grad_()
    assert scorch.explain("ij,jk->ik", P, x).dispatch.startswith("dense")
    assert torch.autograd.gradcheck(lambda v, x: P.with_values(v) @ x, (v, x))


def test_forced_paths_and_bad_settings(monkeypatch):
    A, x = scorch.as_sparse(rnd(20, 10, density=0.9), "csr"), rnd(10, 4, density=1)
    monkeypatch.setattr(scorch.config, "dispatch", "sparse")
    assert scorch.explain("ij,jk->ik", A, x).dispatch == "sparse (scorch.config.dispatch = 'sparse')"
    monkeypatch.setattr(scorch.config, "dispatch", "dense")
    torch.testing.assert_close(A @ x, A.to_dense() @ x)
    with pytest.raises(ValueError, match="dispatch must be"):   # checked when set
        scorch.config.dispatch = "fast"
    monkeypatch.setattr(scorch.config, "dispatch", "auto")
    with pytest.raises(ValueError, match="dense_threshold must be in"):
        scorch.config.dense_threshold = 2.0


def test_calibration_measures_and_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_memo", {})
    monkeypatch.setattr(runtime, "calibrate", lambda: 0.125)  # the measurement itself: below
    assert runtime.dense_threshold() == 0.125
    cached = json.loads((tmp_path / "calibration.json").read_text())
    assert list(cached.values()) == [0.125] and "threads" in next(iter(cached))
    monkeypatch.setattr(runtime, "_memo", {})
    monkeypatch.setattr(runtime, "calibrate", lambda: pytest.fail("should come from the cache"))
    assert runtime.dense_threshold() == 0.125


@pytest.mark.parametrize("content", ["null", "[1, 2]", "5", '"text"', "{KEY: null}", "{KEY: true}", "{KEY: 7}",
                                     "not json"])
def test_a_calibration_file_of_another_shape_is_recalibrated(monkeypatch, tmp_path, content):
    """Valid JSON that is not {machine: density} broke every product (it was read as that); it is
    read as nothing now: measured again and overwritten."""
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "_memo", {})
    (tmp_path / "calibration.json").write_text(content.replace("KEY", json.dumps(runtime._machine_key())))
    monkeypatch.setattr(runtime, "calibrate", lambda: 0.25)
    assert runtime.dense_threshold() == 0.25
    assert json.loads((tmp_path / "calibration.json").read_text()) == {runtime._machine_key(): 0.25}


def test_no_disk_cache_writes_no_calibration(monkeypatch, tmp_path):
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SCORCH_NO_CACHE", "1")
    monkeypatch.setattr(runtime, "_memo", {})
    monkeypatch.setattr(runtime, "calibrate", lambda: 0.5)
    assert runtime.dense_threshold() == 0.5
    assert not (tmp_path / "cache").exists()


def test_calibrate_returns_a_density():
    d = runtime.calibrate(n=128, k=16, densities=(0.05, 0.5, 0.9), repeat=2)
    assert d in (0.05, 0.5, 0.9, 1.0)


def test_auto_sparsify(monkeypatch, threshold):
    monkeypatch.setattr(scorch.config, "auto_sparsify", True)
    relu_out = torch.relu(rnd(100, 80, density=1) - 2.0)  # ~2% nonzero after a shifted ReLU
    w = rnd(80, 16, density=1)
    plan = scorch.explain("ij,jk->ik", relu_out, w)
    assert plan.dispatch.startswith("sparse") and plan.schedule.operands[0].sparse
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", relu_out, w), relu_out @ w)


_MMAPPED_BLOCKS = """
import ctypes, sys, torch
from scorch import runtime
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "keep":
    assert runtime.keep_freed_memory()
before = libc.mallinfo2().hblks
x = torch.empty(64 << 20, dtype=torch.uint8)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc only")
@pytest.mark.parametrize("mode", ["keep", "default"])
def test_keep_freed_memory_takes_large_blocks_off_mmap(mode):
    """A 64 MiB tensor is its own mmap (unmapped when freed, its pages fault in again next time)
    under glibc's defaults, and an ordinary heap block once keep_freed_memory() has run."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    new_blocks = int(out.stdout.split()[-1])
    assert new_blocks == (0 if mode == "keep" else 1)


def test_keep_freed_memory_off_glibc(monkeypatch):
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("", ""))
    assert runtime.keep_freed_memory() is False
