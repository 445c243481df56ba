"""The benchmark suite (``python -m scorch.bench``): the CLI end to end on a small workload,
the report formatting and the agreement check."""

import json
import subprocess
import sys

import torch

import scorch
from scorch.bench import Case, System, check_agreement, format_summary, format_table, run_case, timeit
from scorch.bench.report import write_plot

KEYS = {"workload", "case", "system", "median_ms", "speedup", "baseline", "is_baseline", "peak_rss_mb",
        "rss_delta_mb", "error"}


def test_cli_quick_mlp(tmp_path):
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "-m", "scorch.bench", "--quick", "--only", "mlp", "--json", str(out),
                        "--dense-kernels", "torch"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "dense products in layers: torch" in p.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["meta"]["dense_kernels"] == "torch"
    assert len(rows) >= 4
    for r in rows:
        assert KEYS <= set(r), set(r) ^ KEYS
        assert r["workload"] == "mlp"
        assert r["error"] is None, r
        assert r["median_ms"] > 0 and r["speedup"] > 0 and r["peak_rss_mb"] > 0
    assert any(r["system"].startswith("scorch") for r in rows)
    assert "| workload | system | median ms | speedup |" in p.stdout
    assert "|---|" in p.stdout
    full = [line for line in p.stdout.splitlines() if line.startswith("| mlp: ") and line.count("|") == 7]
    assert len(full) == len(rows)
    assert "| case | scorch ms | baseline ms | speedup |" in p.stdout   # the per-case summary


def test_cli_rejects_unknown_workload():
    p = subprocess.run([sys.executable, "-m", "scorch.bench", "--only", "nope"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "nope" in p.stderr


def _case(wrong=False, fail=False):
    A = scorch.as_sparse(torch.eye(6) + torch.diag(torch.ones(5), 1), "csr")
    T = A.to_torch()
    X = torch.randn(6, 3)
    systems = [System("scorch", lambda: A @ X),
               System("torch.sparse CSR", lambda: T @ X, baseline=True, reference=True)]
    if wrong:
        systems.append(System("wrong", lambda: T @ X + 1.0))
    if fail:
        systems.append(System("broken", lambda: 1 / 0))
    return Case("unit", "tiny SpMM", systems)


def test_run_case_rows_and_speedup():
    rows = run_case(_case(), repeat=3)
    assert [r["system"] for r in rows] == ["scorch", "torch.sparse CSR"]
    assert all(r["error"] is None and r["median_ms"] > 0 for r in rows)
    base = rows[1]
    assert base["is_baseline"] and abs(base["speedup"] - 1.0) < 1e-12
    assert abs(rows[0]["speedup"] - base["median_ms"] / rows[0]["median_ms"]) < 1e-9


def test_wrong_system_is_an_error_row_not_timed():
    rows = {r["system"]: r for r in run_case(_case(wrong=True, fail=True), repeat=3)}
    assert rows["wrong"]["error"] and "disagrees" in rows["wrong"]["error"]
    assert rows["wrong"]["median_ms"] is None and rows["wrong"]["speedup"] is None
    assert "ZeroDivisionError" in rows["broken"]["error"] and rows["broken"]["median_ms"] is None
    assert rows["scorch"]["error"] is None and rows["scorch"]["median_ms"] > 0
    table = format_table(list(rows.values()))
    assert "ERROR: disagrees with torch.sparse CSR" in table


def test_check_agreement_sparse_and_dense():
    A = scorch.as_sparse(torch.tensor([[1.0, 0, 2], [0, 3, 0]]), "csr")
    T = A.to_torch()
    outs = {"ref": T, "scorch": A, "coo": T.to_sparse_coo(), "dense": A.to_dense(),
            "off": scorch.as_sparse(torch.tensor([[1.0, 0, 2], [0, 3, 1e-2]]), "csr"),
            "shape": torch.zeros(3, 2)}
    errs = check_agreement(outs, "ref", atol=1e-6, rtol=1e-6)
    assert set(errs) == {"off", "shape"}
    assert "max abs err" in errs["off"] and "cannot compare" in errs["shape"]
    assert check_agreement({"ref": torch.ones(2), "nan": torch.tensor([1.0, float("nan")])}, "ref", 1e-3, 1e-3)


def test_format_table():
    rows = [
        {"workload": "kernels", "case": "SpMV / cora", "system": "scorch", "median_ms": 0.0321, "speedup": 2.5,
         "is_baseline": False, "peak_rss_mb": 400.4, "rss_delta_mb": 3.0, "error": None},
        {"workload": "kernels", "case": "SpMV / cora", "system": "torch.sparse CSR", "median_ms": 12.34,
         "speedup": 1.0, "is_baseline": True, "peak_rss_mb": 400.4, "rss_delta_mb": 3.0, "error": None},
        {"workload": "kernels", "case": "SpMV / cora", "system": "x", "median_ms": None, "speedup": None,
         "is_baseline": False, "peak_rss_mb": None, "error": "bad | pipe"},
    ]
    lines = format_table(rows).splitlines()
    assert lines[0].startswith("| workload | system | median ms | speedup | peak RSS MB")
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| kernels: SpMV / cora | scorch | 0.032 | 2.50x | 400 (+3) |  |"
    assert lines[3] == "| kernels: SpMV / cora | torch.sparse CSR | 12.3 | 1.00x | 400 (+3) | baseline |"
    assert lines[4] == "| kernels: SpMV / cora | x | - | - | - | ERROR: bad / pipe |"
    assert all(line.count("|") == 7 for line in lines)
    rows.append({**rows[1], "system": "PyG", "median_ms": 24.68, "speedup": 0.5, "is_baseline": False})
    summary = format_summary(rows).splitlines()
    assert summary[2] == "| kernels: SpMV / cora | 0.032 | 12.3 (torch.sparse CSR) | **2.50x** | PyG 0.50x |"


def test_plot_message_or_file(tmp_path):
    rows = [{"case": "c", "system": "scorch", "speedup": 2.0}]
    msg = write_plot(rows, tmp_path / "p.png")
    assert ("matplotlib is not importable" in msg) or (tmp_path / "p.png").exists()


def test_timeit_alternates_and_budget():
    calls = []
    t = timeit([lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")], repeat=8)
    assert len(t) == 3 and all(x >= 0 for x in t)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert rounds[0] == ["a", "b", "c"] and len(rounds) == 9            # warm-up in order, then 8 rounds
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)           # each round runs each once
    assert len({tuple(r) for r in rounds[1:]}) > 1                     # in more than one order
