import os
from pathlib import Path

import pytest

os.environ.setdefault("HYPOTHESIS_PROFILE", "ci")

try:
    from hypothesis import settings
    settings.register_profile("ci", deadline=None, print_blob=True)
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
except ImportError:  # pragma: no cover
    pass

# The real graphs live beside the repository (../shared/data) or wherever SCORCH_DATA points.
DATA_DIR = Path(os.environ.get("SCORCH_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture
def data_dir():
    if not (DATA_DIR / "cora.npz").exists():
        pytest.skip(f"real graphs not found in {DATA_DIR} (set SCORCH_DATA)")
    return DATA_DIR


@pytest.fixture(autouse=True)
def _sparse_kernels_always(monkeypatch):
    """Tests exercise scorch's own kernels: no runtime switch to dense torch (and no machine
    calibration) unless a test asks for it (tests/test_runtime.py)."""
    import scorch
    monkeypatch.setattr(scorch.config, "dispatch", "sparse")
    # test problems are small: without this they would all run single-threaded and the
    # kernels' thread partitioning would go untested (tests/test_compiler.py checks one thread)
    monkeypatch.setattr(scorch.config, "parallel_min_work", 0)
