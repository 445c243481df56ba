"""Complex SparseTensors seen as real ones: ``torch.view_as_real`` shares the stored values (a
trailing dense level of size 2 holds each value's real and imaginary parts), so the in-place
updates torch's optimizers make through it reach the complex parameter; ``view_as_complex`` is
its inverse; ``A.real`` / ``A.imag`` are copies, whose in-place writes raise instead of being
lost.  The oracle is the same computation on dense tensors with plain torch."""

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.errors import NotSupportedError

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

W = torch.tensor([[1 + 1j, 0, 0.5 - 2j], [0, 2 - 1j, 0], [0, 0, 0]], dtype=torch.complex64)
G = torch.tensor([[0.3 - 1j, 0, 2 + 0.5j], [0, -1 + 1j, 0], [0, 0, 0]], dtype=torch.complex64)
OPTIMIZERS = ["Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD", "SGD"]


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "dcsr", "ell"])
def test_view_as_real_shares_the_values(fmt):
    """A write into the view reaches the complex tensor (the dense fallback gave a copy)."""
    A = scorch.as_sparse(W.clone(), fmt)
    V = torch.view_as_real(A)
    assert isinstance(V, scorch.SparseTensor) and V.shape == (3, 3, 2) and V.dtype == torch.float32
    assert torch.equal(V.to_dense(), torch.view_as_real(W))
    V.mul_(2)
    V.add_(torch.view_as_real(G) * (W != 0)[..., None])   # a dense operand read at the stored entries
    want = W * 2 + G
    assert torch.equal(A.to_dense(), want) and A.nnz == 3
    C = torch.view_as_complex(V)
    assert torch.equal(C.to_dense(), want) and C.format == A.format
    C.sub_(1j)
    assert torch.equal(A.to_dense(), (want - 1j) * (W != 0))


def test_view_as_real_is_differentiable():
    """Gradients flow through the view to the stored values; a write through the view of a tensor
    that requires grad is refused in grad mode (as through ``A.t()``) and runs under no_grad."""
    A = scorch.as_sparse(W.clone(), "csr").requires_grad_()
    D = W.clone().requires_grad_()
    w = torch.randn(3, 3, 2, generator=torch.Generator().manual_seed(0))
    (torch.view_as_real(A) * w).sum().backward()
    (torch.view_as_real(D) * w).sum().backward()
    assert torch.allclose(A.grad.to_dense(), D.grad * (W != 0))
    with pytest.raises(RuntimeError, match="in-place"):
        torch.view_as_real(A).mul_(2)
    with torch.no_grad():
        torch.view_as_real(A).mul_(2)
    assert torch.equal(A.detach().to_dense(), W * 2)


def test_view_as_real_refusals():
    with pytest.raises(scorch.errors.ScorchValueError, match="view_as_real: only supported for complex"):
        torch.view_as_real(scorch.as_sparse(W.real.clone(), "csr"))
    B = scorch.as_sparse(torch.ones(4, 4, dtype=torch.complex64)).asformat(scorch.formats.bsr(2, 2))
    with pytest.raises(NotSupportedError, match="view_as_real: a SparseTensor in a blocked format"):
        torch.view_as_real(B)
    with pytest.raises(NotSupportedError, match="view_as_complex: needs the last dim"):
        torch.view_as_complex(scorch.as_sparse(torch.ones(3, 2), "csr"))   # its last dim compressed


@pytest.mark.parametrize("part", ["real", "imag"])
def test_real_imag_are_copies_whose_writes_raise(part):
    """``A.real.mul_(3)`` left ``A`` as it was, silently: now it raises, naming view_as_real; the
    out-of-place use keeps working.  Oracle: dense torch."""
    A = scorch.as_sparse(W.clone(), "csr")
    assert torch.equal(getattr(A, part).to_dense(), getattr(W, part))
    assert torch.equal((getattr(A, part) * 3).to_dense(), getattr(W, part) * 3)
    for write in (lambda t: t.mul_(3), lambda t: t.zero_(), lambda t: t.copy_(t * 2)):
        with pytest.raises(NotSupportedError, match=f"x.{part} of a complex SparseTensor is a copy.*view_as_real"):
            write(getattr(A, part))
    assert torch.equal(A.to_dense(), W)
    assert torch.equal(getattr(A, part).clone().mul_(3).to_dense(), getattr(W, part) * 3)   # a clone is its own


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("fmt", ["csr", "coo"])
def test_optimizers_update_a_complex_sparse_parameter(name, foreach, fmt):
    """torch's optimizers update a complex parameter through ``torch.view_as_real`` (its gradient
    and state too): the step reached a dense copy and the parameter stayed as it was.  Oracle: the
    dense parameter with the same gradients, compared at the stored positions."""
    p = torch.nn.Parameter(scorch.as_sparse(W.clone(), fmt))
    q = torch.nn.Parameter(W.clone())
    opts = [getattr(torch.optim, name)([t], lr=0.1, foreach=foreach) for t in (p, q)]
    for step in range(3):
        p.grad = scorch.as_sparse(G * (step + 1), fmt)
        q.grad = G * (step + 1)
        for opt in opts:
            opt.step()
    assert not torch.equal(p.detach().to_dense(), W)
    assert torch.allclose(p.detach().to_dense(), q.detach() * (W != 0), atol=1e-6)


def test_writes_adding_entries_through_view_as_real_reach_the_tensor():
    # a pattern-growing write through the view gave the view new storage: x never saw it, and Adam /
    # RMSprop with a dense gradient left a complex sparse parameter unchanged
    D = torch.tensor([[1., 0, 2], [0, 3, 0], [4, 0, 5]])
    C = torch.complex(D, 2 * D)
    A, Cd = scorch.as_sparse(C.clone(), "csr"), C.clone()
    torch.view_as_real(A)[0, 1, 0] = 5.
    torch.view_as_real(Cd)[0, 1, 0] = 5.
    assert torch.equal(A.to_dense(), Cd)
    G = torch.complex(torch.ones(3, 3), torch.ones(3, 3))
    for name in ("Adam", "RMSprop"):
        p, pd = torch.nn.Parameter(scorch.as_sparse(C.clone(), "csr")), torch.nn.Parameter(C.clone())
        p.grad, pd.grad = G.clone(), G.clone()
        getattr(torch.optim, name)([p], lr=0.1).step()
        getattr(torch.optim, name)([pd], lr=0.1).step()
        torch.testing.assert_close(p.detach().to_dense(), pd.detach())


def test_aliases_of_a_part_copy_refuse_writes_too():
    D = torch.tensor([[1., 0, 2], [0, 3, 0], [4, 0, 5]])
    A = scorch.as_sparse(torch.complex(D, 2 * D), "csr")
    for alias in (lambda r: r.detach(), lambda r: r.data, lambda r: r.t()):
        with pytest.raises(scorch.NotSupportedError, match="is a copy, not a view"):
            alias(A.real).mul_(2)
    assert torch.equal(A.real.clone().mul_(2).to_dense(), 2 * D)   # a copy of the copy is the caller's
