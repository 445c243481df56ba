"""Every script in examples/ runs on a fresh install and finishes cleanly."""

import subprocess
import sys
from pathlib import Path

import pytest

from scorch.compiler import build

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script):
    args = ["--epochs", "5"] if script.name in ("gcn_cora.py", "gat_cora.py") else []
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()
    if "agree" in out.stdout:
        assert "agree: True" in out.stdout or "attention: True" in out.stdout
