"""scorch.schedule (seed 003): a schedule's formats are the levels it names, and the built model
computes and trains like the dense model with the same entries masked (the oracle: plain torch
with masks), its intermediate outputs sparsified on every call."""

import numpy as np
import pytest
import torch
from torch import nn

import scorch
from scorch import Format, compressed, dense, padded, singleton
from scorch.compiler import build
from scorch.schedule import create_schedule
from scorch.sparsify import BlockFractionSparsifier, ScalarFractionSparsifier, ScalarThresholdSparsifier

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


class Block(nn.Module):
    """Seed 003's names: a module with ``linear1`` (its ``.weight`` scheduled) and ``attn``."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(12, 16)
        self.attn = nn.Tanh()
        self.linear2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.linear2(self.attn(self.linear1(x)))


def model(seed=0):
    torch.manual_seed(seed)
    return Block().double()


def test_formats_compose_per_axis_and_blocks_split_the_axes():
    """``set_format`` alone: the whole tensor; with ``axis=``: those axes' levels, in the order given;
    after ``block``: axes 0..n-1 are the block grid and n..2n-1 inside a block (seed 003's blocked
    ELL over COO blocks)."""
    s = create_schedule(model())
    assert s["linear1.weight"].set_format("csc").format() == scorch.formats.csc
    hybrid = s["linear2.weight"].block(4, 4).set_format("ell", axis=[0, 1]).set_format("coo", axis=[2, 3])
    assert hybrid.format() == Format([dense, padded, compressed(unique=False), singleton], (0, 1, 2, 3), (4, 4))
    s2 = create_schedule(model())
    mixed = s2["linear1.weight"].set_format("dense", axis=[1]).set_format("csr", axis=[0])   # columns outside
    assert mixed.format() == Format([dense, compressed], (1, 0))
    assert s2["linear2.weight"].block(2, 4).set_format("csf").format() == \
        Format([compressed] * 4, (0, 1, 2, 3), (2, 4))   # one format over all four axes of the split


def test_built_model_matches_the_masked_dense_model_and_trains_like_it():
    """Weights pruned by their sparsifiers, in the scheduled formats; forward, gradients and an
    optimizer step against the dense model whose weights are masked the same way."""
    dense_model = model()
    s = create_schedule(dense_model)
    s["linear1.weight"].sparsify(ScalarFractionSparsifier(0.75)).set_format("csc")
    s["linear2.weight"].sparsify(BlockFractionSparsifier(0.5, (4, 4))).block(4, 4) \
        .set_format("ell", axis=[0, 1]).set_format("coo", axis=[2, 3])
    sparse_model = s.build()
    assert isinstance(dense_model.linear1.weight, nn.Parameter) and type(dense_model.linear1.weight.data) is \
        torch.Tensor   # the model itself is left as it was
    W1, W2 = sparse_model.linear1.weight, sparse_model.linear2.weight
    assert W1.format == scorch.formats.csc and W1.nnz == 48 and W2.format.block == (4, 4)
    masks = [ScalarFractionSparsifier(0.75).mask(dense_model.linear1.weight.detach()),
             BlockFractionSparsifier(0.5, (4, 4)).mask(dense_model.linear2.weight.detach())]
    ref = model()
    x = torch.randn(5, 12, dtype=torch.float64)
    target = torch.randn(5, 8, dtype=torch.float64)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (sparse_model, ref))
    for _ in range(3):
        with torch.no_grad():
            ref.linear1.weight.mul_(masks[0])
            ref.linear2.weight.mul_(masks[1])
        for m, o in ((sparse_model, opt), (ref, ref_opt)):
            o.zero_grad()
            ((m(x) - target) ** 2).sum().backward()
        ref.linear1.weight.grad.mul_(masks[0])
        ref.linear2.weight.grad.mul_(masks[1])
        torch.testing.assert_close(W1.grad.to_dense(), ref.linear1.weight.grad)
        torch.testing.assert_close(sparse_model.linear1.bias.grad, ref.linear1.bias.grad)
        opt.step()
        ref_opt.step()
    torch.testing.assert_close(sparse_model(x), ref(x))
    torch.testing.assert_close(W2.to_dense(), ref.linear2.weight.detach() * masks[1])


def test_an_outputs_sparsifier_runs_on_every_call_and_passes_gradients_back():
    """A submodule's output sparsified per forward (dynamic sparsity): the next layer takes the
    SparseTensor; gradients reach the input at the kept entries only.  Oracle: the dense model
    with the same threshold applied as a mask."""
    dense_model = model(1)
    s = create_schedule(dense_model)
    s["attn"].sparsify(ScalarThresholdSparsifier(0.5)).set_format("csr")
    sparse_model = s.build()
    seen = []
    sparse_model.linear2.register_forward_pre_hook(lambda m, inp: seen.append(type(inp[0])))
    for seed in (0, 1):   # two calls: two patterns
        x = torch.randn(6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        xs, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = sparse_model(xs)
        h = dense_model.attn(dense_model.linear1(xd))
        want = dense_model.linear2(h * (h.abs() >= 0.5))
        torch.testing.assert_close(out, want)
        (out ** 2).sum().backward()
        (want ** 2).sum().backward()
        torch.testing.assert_close(xs.grad, xd.grad)
    assert seen == [scorch.SparseTensor, scorch.SparseTensor]


def test_schedule_errors_name_the_entry():
    s = create_schedule(model())
    with pytest.raises(ValueError, match=r"no parameter or submodule 'linear1.weigth'; did you mean 'linear1.weight'"):
        s["linear1.weigth"]
    w = s["linear1.weight"]
    with pytest.raises(ValueError, match=r"axis must list distinct axes in \[0, 2\)"):
        w.set_format("csr", axis=[0, 2])
    with pytest.raises(ValueError, match=r"block: expects 2 positive ints"):
        w.block(4)
    w.set_format("dense", axis=[0])
    with pytest.raises(ValueError, match="call block before set_format"):
        w.block(4, 4)
    with pytest.raises(ValueError, match=r"that no earlier set_format took \(\[0\]\)"):
        w.set_format("dense", axis=[0])
    with pytest.raises(ValueError, match=r"axes \[1\] have no format"):
        w.format()
    with pytest.raises(TypeError, match="expects a scorch.sparsify Sparsifier"):
        w.sparsify(0.5)
    with pytest.raises(ValueError, match="blocked itself"):
        s["linear2.weight"].block(4, 4).set_format(scorch.formats.bsr(2, 2), axis=[0, 1])
    s = create_schedule(model())
    s["attn"].set_format("csr")
    with pytest.raises(ValueError, match="needs a sparsifier"):
        s.build()
    with pytest.raises(ValueError, match="is a submodule's output"):
        s["attn"].block(2, 2)


def test_reading_an_entry_changes_nothing_build_does():
    """``s[name].format()`` or ``repr(s[name])`` only read: they registered a KeepAll/csr entry that
    build() then made sparse (a weight) or refused (an output without a sparsifier, a tied weight's
    other name).  Oracle: the dense model with the one scheduled weight masked."""
    torch.manual_seed(0)
    dense_model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    s = create_schedule(dense_model)
    s["0.weight"].sparsify(ScalarFractionSparsifier(0.5))
    assert str(s["2.weight"].format()) == "csr"
    assert "not scheduled" in repr(s["1"]) and "not scheduled" in repr(s["2.weight"])
    assert [e.name for e in s] == ["0.weight"]
    built = s.build()
    assert not isinstance(built[2].weight, scorch.SparseTensor)
    W = dense_model[0].weight.detach()
    keep = W.abs() > W.abs().flatten().kthvalue(32).values
    torch.testing.assert_close(built[0].weight.to_dense(), W * keep)
    x = torch.randn(5, 8)
    ref = dense_model[2](torch.relu(x @ (W * keep).T + dense_model[0].bias))
    torch.testing.assert_close(built(x), ref)
    s["1"].set_format("csr")   # scheduled now: its repr says what build() needs
    assert "sparsifier=None (set one with .sparsify)" in repr(s["1"])

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.h = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
            self.h.weight = self.e.weight
    tied = Tied()
    s = create_schedule(tied)
    s["e.weight"].sparsify(ScalarFractionSparsifier(0.5))
    s["h.weight"].format()
    E = tied.e.weight.detach()
    keep = E.abs() > E.abs().flatten().kthvalue(40).values
    torch.testing.assert_close(s.build().h.weight.to_dense(), E * keep)


def test_schedule_errors_name_the_argument_and_block_takes_numpy_ints():
    """A preset name that does not fit the axes named no entry; np.int64 block sizes are ints; a
    parametrized weight's name points at the parameter holding it (it suggested an unrelated one)."""
    import torch.nn.utils.parametrize as P
    m = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    P.register_parametrization(m[0], "weight", nn.Identity())
    with pytest.raises(ValueError, match=r"'0.weight' is parametrized, held by the parameter "
                                         r"'0.parametrizations.weight.original'"):
        create_schedule(m)["0.weight"]
    s = create_schedule(model())
    with pytest.raises(ValueError, match=r"schedule\['linear1.weight'\].set_format: format 'csc' needs a tensor "
                                         r"of at least 2 dims"):
        s["linear1.weight"].block(2, 2).set_format("csc", axis=[0])
    assert s["linear2.weight"].block(np.int64(4), 4).set_format("csr").format().block == (4, 4)
