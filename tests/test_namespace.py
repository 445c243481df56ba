"""`import scorch as torch`: every torch name still works; scorch's own names win."""

import importlib
import subprocess
import sys

import pytest
import torch

import scorch


@pytest.mark.parametrize("name", ["float32", "int64", "Tensor", "randn", "zeros", "stack", "optim",
                                  "sparse", "autograd", "no_grad", "Size", "manual_seed", "cat", "linalg",
                                  "tensor", "ops", "compiler"])   # (scorch has submodules of these names)
def test_torch_names_pass_through(name):
    assert getattr(scorch, name) is getattr(torch, name)


def test_scorch_overrides_win():
    assert scorch.nn is not torch.nn and scorch.nn.Linear is torch.nn.Linear
    assert scorch.einsum is not torch.einsum and scorch.einsum.__module__ == "scorch.ops.einsum"
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(scorch.einsum("ij,jk->ik", x, y), x @ y)  # dense operands work too
    assert scorch.as_sparse.__module__.startswith("scorch")
    assert "as_sparse" in dir(scorch) and "randn" in dir(scorch)


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="module 'scorch' \\(and torch\\) has no attribute 'nope'"):
        scorch.nope


def test_functional_namespace():
    import scorch.nn.functional as F
    import torch.nn.functional as tF
    assert F.relu is tF.relu and F.one_hot is tF.one_hot
    assert "relu" in dir(F)
    with pytest.raises(AttributeError):
        F.not_a_function


def test_torch_submodules_import_through_scorch():
    optim = importlib.import_module("scorch.optim")
    assert optim.SGD is torch.optim.SGD
    data = importlib.import_module("scorch.utils.data")
    assert data.DataLoader is torch.utils.data.DataLoader
    init = importlib.import_module("scorch.nn.init")
    assert init.xavier_uniform_ is torch.nn.init.xavier_uniform_
    assert torch.optim.__spec__.name == "torch.optim"  # torch's own modules stay untouched
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("scorch.definitely_not_a_module")


def test_drop_in_program_runs():
    # A plain torch program with the import swapped, as a user would write it.
    code = """
import scorch as torch
import scorch.nn.functional as F
from scorch import nn
m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x = torch.randn(5, 4)
loss = F.mse_loss(m(x), torch.zeros(5, 3))
loss.backward(); opt.step()
A = torch.as_sparse(torch.eye(4), format="csr")
assert isinstance(A, torch.Tensor) and A.nnz == 4
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_every_torch_name_scorch_does_not_mean_to_change_is_torchs():
    """`import scorch as torch; torch.tensor([1, 2])` called scorch's `tensor` module: a submodule
    named like a torch name hid it.  Every public torch name is torch's object here unless scorch
    overrides it on purpose (its functions on sparse operands, nn with its sparse layers)."""
    on_purpose = {"nn", "einsum"}
    from scorch._alias import _TorchAlias
    for name in dir(torch):
        if name.startswith("_") or name in on_purpose:
            continue
        ours = getattr(scorch, name)
        if isinstance(ours, _TorchAlias):   # `import scorch.optim` ran first: its forwarding module
            ours = ours.__dict__["_target"]
        assert ours is getattr(torch, name), (name, ours)
    assert scorch.tensor([1, 2]).tolist() == [1, 2]
    assert scorch.sparse_coo is torch.sparse_coo   # the layout (scorch's COO builder is scorch.from_coo)


def test_drop_in_details_a_program_can_see():
    """torch's __version__ (version checks take the right branch), torch.matmul itself (TorchScript,
    torch-function modes), TorchScript compiling scorch.einsum as aten::einsum, torch.nn.attention,
    `from scorch import *` giving torch's names, and torch.sparse operands alone computed by torch
    (its result types, gradients and speed)."""
    assert scorch.__version__ == torch.__version__ and scorch.__version__ >= (2, 0)
    assert scorch.matmul is torch.matmul and scorch.nn.attention is torch.nn.attention

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return scorch.matmul(x, y) + scorch.einsum("ij,jk->ik", x, y)

    scripted = torch.jit.script(f)
    x = torch.randn(3, 3)
    torch.testing.assert_close(scripted(x, x), 2 * x @ x)
    names: dict = {}
    exec("from scorch import *", names)
    assert names["randn"] is torch.randn and names["SparseTensor"] is scorch.SparseTensor
    d = torch.randn(5, 6) * (torch.rand(5, 6) < 0.4)
    coo = d.to_sparse()
    assert scorch.einsum("ij->ji", coo).layout == torch.sparse_coo          # torch's own result
    got = scorch.einsum("ij,jk->ik", coo, torch.ones(6, 2))                # torch refuses: scorch's kernels
    torch.testing.assert_close(got, d @ torch.ones(6, 2))
