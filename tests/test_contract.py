"""Where scorch meets torch's contract -- argument forms, result dtypes, checks and autograd at the
torch.sparse boundary -- each case once found wrong by a sweep against dense torch.  Oracle: the
same call on dense tensors (or torch.sparse ones) with plain torch."""

import warnings

import numpy as np
import pytest
import torch

import scorch
from scorch.compiler import build

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def test_a_block_format_that_does_not_divide_the_shape_is_refused_on_every_route():
    """asformat, a torch CSR and to_sparse_bsr built a BSR whose blocks ran past the shape: every
    later result silently wrong."""
    d = torch.arange(1.0, 10.0).reshape(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch: "sparse CSR support is in beta"
        routes = [lambda: scorch.as_sparse(d, "csr").asformat(scorch.formats.bsr(2, 2)),
                  lambda: scorch.as_sparse(d.to_sparse_csr(), scorch.formats.bsr(2, 2)),
                  lambda: scorch.as_sparse(d, "csr").to_sparse_bsr((2, 2)),
                  lambda: scorch.as_sparse(torch.zeros(1, 1), "coo").asformat(scorch.formats.bsc(2, 2))]
        for route in routes:
            with pytest.raises(ValueError, match=r"block size \(2, 2\) does not divide shape"):
                route()
    B = scorch.as_sparse(torch.arange(16.0).reshape(4, 4), "csr").asformat(scorch.formats.bsr(2, 2))
    torch.testing.assert_close(B @ torch.ones(4, 1), torch.arange(16.0).reshape(4, 4) @ torch.ones(4, 1))


@pytest.mark.parametrize("make", ["coo", "uncoalesced", "csr", "dense", "from_coo"])
def test_sparse_inputs_that_require_grad_stay_in_the_graph(make):
    """A torch.sparse operand, a dense tensor given to as_sparse, values given to from_coo: when
    they require grad, gradients reach them (they were detached silently)."""
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    W = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if make == "from_coo":
            leaf = torch.tensor([1.0, 0.5, 1.5], dtype=torch.float64, requires_grad=True)
            A = scorch.from_coo([[0, 0, 1], [0, 0, 1]], leaf, (2, 2), format="csr")
            ref_leaf = leaf.detach().clone().requires_grad_()
            ref = torch.sparse_coo_tensor([[0, 0, 1], [0, 0, 1]], ref_leaf, (2, 2)).to_dense()
        else:
            build_ = {"coo": lambda t: t.to_sparse(), "csr": lambda t: t.to_sparse_csr(), "dense": lambda t: t,
                      "uncoalesced": lambda t: torch.sparse_coo_tensor([[0, 0, 1], [0, 0, 1]],
                                                                       torch.tensor([0.25, 0.75, 2.0], dtype=t.dtype),
                                                                       (2, 2))}[make]
            leaf, ref_leaf = build_(x).requires_grad_(), build_(x).requires_grad_()
            A = leaf if make != "dense" else scorch.as_sparse(leaf, "ell")
            ref = ref_leaf.to_dense()
        out = scorch.einsum("ij,jk->ik", A, W)
        assert out.requires_grad
        (out * W).sum().backward()
        (ref @ W * W).sum().backward()
    torch.testing.assert_close(leaf.grad.to_dense(), ref_leaf.grad.to_dense())


def test_dtypes_follow_torch_on_every_path():
    """Mixed float dtypes promote on the dense path as on the kernels (it raised, or multiplied in
    float32); an integer einsum summing an index only one operand has gives int64, as torch's
    (and scorch's own A.sum); from_coo of Python floats gives torch's default dtype."""
    A = scorch.as_sparse(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "csr")   # density 1: the dense path
    X = torch.rand(2, 2, dtype=torch.float64)
    for mode in ("auto", "sparse", "dense"):
        saved, scorch.config.dispatch = scorch.config.dispatch, mode
        try:
            got = A @ X
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, A.to_dense().double() @ X)
        finally:
            scorch.config.dispatch = saved
    d = torch.tensor([[1, 0, 2], [0, 3, 0]], dtype=torch.int32)
    D = scorch.as_sparse(d, "csr")
    for eq, ops in [("ij->i", (d,)), ("ij->", (d,)), ("ij,j->i", (d, d[0])), ("ij,k->i", (d, d[:, 0])),
                    ("ij,ij->i", (d, d))]:
        got = scorch.einsum(eq, D, *ops[1:])
        want = torch.einsum(eq, *ops)
        assert got.dtype == want.dtype and torch.equal(got, want), eq
    assert scorch.from_coo([[0, 1], [1, 0]], [1.0, 2.0]).dtype == torch.float32
    assert scorch.from_coo([[0, 1], [1, 0]], [1, 2]).dtype == torch.int64


def test_checks_torch_makes():
    """dot of 2-d operands raises (it computed inner); addmm's input must broadcast to the
    product whatever beta is (it broadcast the other way)."""
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    A = scorch.as_sparse(a, "csr")
    with pytest.raises(ValueError, match="dot: expects two 1-d tensors, got 2-d and 2-d"):
        torch.dot(A, a)
    with pytest.raises(ValueError, match="dot: expects two 1-d tensors"):
        A.dot(a)
    assert torch.dot(scorch.as_sparse(a[0]), a[1]) == torch.dot(a[0], a[1])
    for beta in (0, 0.5, 1):
        with pytest.raises(ValueError, match=r"does not broadcast to the (product's|result's) shape"):
            torch.addmm(torch.ones(4, 2, 3), A, torch.ones(2, 3), beta=beta)
    with pytest.raises(ValueError, match=r"addmv: input of shape \(2, 2\) does not broadcast"):
        torch.addmv(torch.ones(2, 2), A, torch.ones(2), beta=2)
    torch.testing.assert_close(torch.addmm(torch.ones(3), A, torch.ones(2, 3), beta=0.5),
                               torch.addmm(torch.ones(3), a, torch.ones(2, 3), beta=0.5))


def test_einsum_and_matmul_are_drop_in_for_dense_calls():
    """With ``import scorch as torch``: torch's sublist form (dense or sparse operands), tensors on
    another device with no sparse operand, and torch's keyword names all work as in torch."""
    a, x = torch.rand(2, 2), torch.rand(2, 3)
    A = scorch.as_sparse(a, "csr")
    torch.testing.assert_close(scorch.einsum(a, [0, 1], x, [1, 2], [0, 2]), a @ x)
    torch.testing.assert_close(scorch.einsum(A, [0, 1], x, [1, 2], [0, 2]), a @ x)
    assert scorch.einsum("ij,jk->ik", a.to("meta"), x.to("meta")).shape == (2, 3)
    torch.testing.assert_close(scorch.matmul(input=A, other=x), a @ x)
    torch.testing.assert_close(torch.mm(input=A, mat2=x), a @ x)
    torch.testing.assert_close(torch.mv(input=A, vec=x[:, 0]), a @ x[:, 0])


def test_explain_shows_what_einsum_runs():
    """explain takes the diagonals einsum takes (it refused ``"ii->i"``), and says when format=
    converts the kernel's result."""
    A = scorch.as_sparse(torch.eye(3) * 2, "csr")
    assert scorch.explain("ii->i", A).loop_order == ("i",)
    torch.testing.assert_close(scorch.einsum("ii->i", A).to_dense(), torch.full((3,), 2.0))
    assert scorch.explain("ij,jk->ik", A, torch.ones(3, 2), format="csr").output_format.endswith(
        "then converted to csr (format=)")


def test_hypersparse_conversions_take_memory_of_the_entries():
    """A (2^33 x 4) matrix of 3 entries converts to COO / DCSC / CSC and multiplies by its
    transpose without an array over its 2^33 rows (they tried to allocate 64 GB)."""
    n = 2 ** 33
    rows, cols, vals = [0, 5, n - 1], [1, 2, 3], [1.0, 2.0, 3.0]
    A = scorch.from_coo([rows, cols], vals, (n, 4), format="dcsr")
    for fmt in ("coo", "dcsc", "csc"):
        coords, values = A.asformat(fmt).coo()
        assert coords.tolist() == [rows, cols] and values.tolist() == vals
    torch.testing.assert_close((A.T @ A).to_dense(), torch.diag(torch.tensor([0.0, 1.0, 4.0, 9.0])))


@pytest.mark.parametrize("eq,shape", [("...ii->...i", (2, 3, 3)), ("i...i->...", (3, 2, 3)), ("...ii", (2, 3, 3)),
                                      ("b...ii,b->b...", (2, 3, 3))])
def test_a_repeated_index_beside_an_ellipsis(eq, shape):
    """A term holding ``...`` and a repeated index takes the diagonal like any other (it was refused,
    naming internal letters)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < 0.6)
    ops = (x,) if "," not in eq else (x, torch.randn(shape[0], generator=g))
    got = scorch.einsum(eq, scorch.as_sparse(x, "csf"), *ops[1:])
    got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
    torch.testing.assert_close(got, torch.einsum(eq, *ops))


def test_copies_into_aliases_reach_the_tensor_and_unset_tensors_fill_whole():
    """``p.detach().copy_(q)`` / ``p.data.copy_(q)`` write through (they wrote into a temporary:
    AveragedModel / EMA kept stale weights); a random
    fill of ``new_empty`` fills it (spectral_norm's vector stayed zeros); spectral_norm and
    GradScaler run on a sparse weight as on the dense one."""
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    W = scorch.as_sparse(x, "csr")
    W.detach().copy_(x * 7)
    assert torch.equal(W.to_dense(), x * 7)
    W.data.copy_(x)
    assert torch.equal(W.to_dense(), x)
    W.data.copy_(x * (x > 1))   # a zero at a stored position: written in place as 0 (it was lost)
    assert torch.equal(W.to_dense(), x * (x > 1)) and W.nnz == 3
    W.data.copy_(x)
    lin = torch.nn.Linear(3, 2)
    lin.weight = torch.nn.Parameter(scorch.as_sparse(x, "csr"))
    avg = torch.optim.swa_utils.AveragedModel(lin)
    avg.update_parameters(lin)   # the first update copies (p_avg.detach().copy_(p))
    with torch.no_grad():
        lin.weight.mul_(3)
    avg.update_parameters(lin)
    torch.testing.assert_close(avg.module.weight.to_dense(), x * 2)   # the mean of x and 3x
    torch.manual_seed(0)
    u = W.new_empty(5).normal_()
    torch.manual_seed(0)
    assert torch.equal(u.to_dense(), torch.empty(5).normal_())
    ref = torch.nn.Linear(3, 2)
    ref.weight, ref.bias = torch.nn.Parameter(x.clone()), lin.bias
    inp = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # vdot of the power iteration's vectors: the dense fallback
        torch.manual_seed(1)
        torch.nn.utils.parametrizations.spectral_norm(lin)
        torch.manual_seed(1)
        torch.nn.utils.parametrizations.spectral_norm(ref)
        for _ in range(3):
            torch.testing.assert_close(lin(inp), ref(inp))
    lin2 = torch.nn.Linear(3, 2)
    lin2.weight = torch.nn.Parameter(scorch.as_sparse(x, "csr"))
    opt, scaler = torch.optim.SGD(lin2.parameters(), lr=0.1), torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(lin2(inp).sum()).backward()
    scaler.step(opt)
    torch.testing.assert_close(lin2.weight.to_dense(), x - 0.1 * inp.sum(0).expand(2, 3) * (x != 0))


def test_dense_results_respect_the_dense_copy_limit():
    """exp(A), A + 1, cos(A), A == A (dense by definition) refuse a dense result over
    ``dense_fallback_max_bytes`` as the other dense paths do (they tried 4 TB)."""
    n = 10 ** 6
    A = scorch.from_coo([[0, 5], [1, 7]], [1.0, 2.0], (n, n), format="csr")
    for op in (torch.exp, lambda a: a + 1, torch.cos, lambda a: a == a):
        with pytest.raises(NotImplementedError, match="dense_fallback_max_bytes"):
            op(A)


def test_from_levels_names_a_wrong_array_type():
    pos, crd, vals = [None, torch.tensor([0, 1, 2])], [None, torch.tensor([2, 0])], torch.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="from_levels: pos arrays must be torch.Tensors .* got list"):
        scorch.SparseTensor.from_levels("csr", (2, 3), [None, [0, 1, 2]], crd, vals)
    with pytest.raises(TypeError, match="from_levels: values must be a torch.Tensor, got list"):
        scorch.SparseTensor.from_levels("csr", (2, 3), pos, crd, [1.0, 2.0])
    assert scorch.SparseTensor.from_levels("csr", (2, 3), pos, crd, vals).to_dense().tolist() == \
        [[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]]


class _SparseSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        d = torch.zeros(3, 4)
        d[i % 3, i % 4] = i + 1.0
        return scorch.as_sparse(d, "csr"), d


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_batches_sparse_samples(workers):
    """default_collate stacks SparseTensor samples into a batched SparseTensor, in worker processes
    too (torch's collate stacked into shared memory, which a SparseTensor has none of)."""
    for sparse, dense in torch.utils.data.DataLoader(_SparseSamples(), batch_size=3, num_workers=workers):
        assert isinstance(sparse, scorch.SparseTensor) and sparse.shape == (3, 3, 4)
        assert torch.equal(sparse.to_dense(), dense)


class _GradSamples(_SparseSamples):
    def __getitem__(self, i):
        return scorch.as_sparse(super().__getitem__(i)[1], "csr").requires_grad_()


def test_a_dataloader_worker_refuses_samples_that_require_grad():
    """As torch's collate refuses them in a worker: the batch could not be sent back, and the
    DataLoader waited forever for it."""
    loader = torch.utils.data.DataLoader(_GradSamples(), batch_size=3, num_workers=1, timeout=60)
    with pytest.raises(RuntimeError, match="cannot send back samples that require grad"):
        next(iter(loader))
    batch = next(iter(torch.utils.data.DataLoader(_GradSamples(), batch_size=3)))   # in process: as torch's
    assert isinstance(batch, scorch.SparseTensor) and batch.requires_grad


@pytest.mark.parametrize("fmt", ["csr", "csc", "bsr"])
def test_to_torch_gives_its_own_values_and_a_format_saves(fmt, tmp_path):
    """to_torch's values were A's own for CSR / CSC / BSR (a write into one reached the other); a
    scorch Format saved beside a tensor loads under weights_only=True."""
    x = torch.tensor([[0.0, 1.0, 0.0, 4.0], [2.0, 0.0, 3.0, 0.0]])
    A = scorch.as_sparse(x, scorch.formats.bsr(1, 2) if fmt == "bsr" else fmt)
    t = A.to_torch()
    t.values().mul_(10)
    assert torch.equal(A.to_dense(), x)
    A.mul_(5)
    assert torch.equal(t.to_dense(), 10 * x)
    torch.save({"weight": A, "format": A.format}, tmp_path / "a.pt")
    back = torch.load(tmp_path / "a.pt", weights_only=True)
    assert back["format"] == A.format and torch.equal(back["weight"].to_dense(), 5 * x)


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
def test_nn_init_fills_a_sparse_weights_pattern(fmt):
    """Every nn.init function writes the stored entries only and keeps the pattern -- trunc_normal_
    too, whose rejection loops draw into empty_like(weight) (a random fill of an unset tensor
    fills its pattern; only one that stores nothing, new_empty's, is filled whole)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 30, generator=g) * (torch.rand(20, 30, generator=g) < 0.2)
    W = scorch.as_sparse(x, fmt)
    stored = W.to_dense() != 0
    inits = [lambda t: torch.nn.init.trunc_normal_(t, std=0.5),                  # its first loop
             lambda t: torch.nn.init.trunc_normal_(t, std=2.0, a=-0.5, b=0.5),   # its second
             torch.nn.init.xavier_uniform_, torch.nn.init.kaiming_normal_, torch.nn.init.ones_,
             lambda t: torch.nn.init.constant_(t, 0.3), torch.nn.init.uniform_, torch.nn.init.normal_]
    for init in inits:
        with torch.no_grad():
            init(W)
        assert W.nnz == int(stored.sum()) and not bool((W.to_dense()[~stored] != 0).any())
    with torch.no_grad():
        torch.nn.init.trunc_normal_(W, std=2.0, a=-0.5, b=0.5)
    assert bool((W.values().abs() <= 0.5).all())


def test_reductions_take_out_and_huge_position_arrays_are_refused():
    """sum / mean / amax / amin / prod / var / std / nansum / aminmax take torch's ``out=`` (a
    TypeError before); CSR / CSC of a 10^9-row hypersparse matrix (a 4 GB position array whatever
    it stores) is refused with the formats that fit, which still convert."""
    d = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    A = scorch.as_sparse(d, "csr")
    for op in (torch.sum, torch.mean, torch.amax, torch.amin, torch.prod, torch.var, torch.std, torch.nansum):
        got, want = torch.empty(0), torch.empty(0)
        assert op(A, 1, out=got) is got
        op(d, 1, out=want)
        torch.testing.assert_close(got, want)
    got = (torch.empty(0), torch.empty(0))
    torch.aminmax(A, dim=0, out=got)
    for g, w in zip(got, torch.aminmax(d, dim=0)):
        torch.testing.assert_close(g, w)
    n = 10 ** 9
    H = scorch.from_coo([[0, 5, n - 1], [1, 7, 3]], [1.0, 2.0, 3.0], (n, n), format="dcsr")
    for fmt in ("csr", "csc"):
        with pytest.raises(NotImplementedError, match="position array of 1000000001 entries"):
            H.asformat(fmt)
    assert H.asformat("coo").nnz == H.asformat("dcsc").nnz == 3


def test_argument_checks_found_by_the_last_sweep():
    """Generators, Format, explain, to_sparse_bsr, rearrange and the command lines refuse what they
    cannot honour (each of these silently did something else or died in a traceback)."""
    from scorch import datasets, dense, compressed, Format, Level
    from scorch import demo
    from scorch.bench.__main__ import main as bench_main
    for call, msg in [(lambda: datasets.rmat(4, -5), "nnz must be an int >= 0"),
                      (lambda: datasets.rmat(4, 10, a=2.0), "a must be a probability"),
                      (lambda: datasets.rmat(4, 10, a=0.6, b=0.3, c=0.3), "a \\+ b \\+ c must be at most 1"),
                      (lambda: datasets.uniform_random(0, 5), "n must be an int >= 1"),
                      (lambda: scorch.formats.csr.permuted((0, 0)), "perm must be a permutation"),
                      (lambda: Format([dense, compressed], order=(0.5, 1)), "order must hold ints"),
                      (lambda: Format([dense, compressed, dense, dense], block=(True, 2)), "block must hold ints"),
                      (lambda: Level("dense", ordered="no"), "ordered must be True or False"),
                      (lambda: scorch.explain("ij,jk->ik", scorch.as_sparse(torch.eye(2)), torch.ones(2, 2),
                                              format="bogus"), "unknown format name 'bogus'")]:
        with pytest.raises((ValueError, TypeError), match=msg):
            call()
    A = scorch.as_sparse(torch.randn(4, 4), "csr")
    assert A.to_sparse_bsr(2).format == scorch.formats.bsr(2, 2)
    assert scorch.rearrange(torch.arange(6.0), "seq -> seq").shape == (6,)   # 1-d: einops' one axis named seq
    assert scorch.rearrange(torch.ones(2, 3), "bd -> bnd", n=4).shape == (2, 4, 3)   # else letters, as before
    saved, scorch.config.dispatch = scorch.config.dispatch, "dense"
    try:
        Q = torch.randn(4, 3)   # dispatch "dense" runs dense results on torch; a sparse result stays sparse
        plan = scorch.explain("ij,jk->ik", A, Q)
        assert plan.output_format.startswith("dense") and plan.backend.startswith("torch.einsum")
        assert type(scorch.einsum("ij,jk->ik", A, Q)) is torch.Tensor
        plan = scorch.explain("ij,ik,jk->ij", A, Q, Q)
        assert plan.output_format.startswith("sparse") and "applies to dense results" in plan.dispatch
        assert type(scorch.einsum("ij,ik,jk->ij", A, Q, Q)) is scorch.SparseTensor
        got = scorch.einsum("ij,jk->ik", A, A, format="coo")   # format= is kept (it was dropped)
        assert got.format == scorch.formats.coo and torch.allclose(got.to_dense(), A.to_dense() @ A.to_dense())
        with pytest.raises(TypeError, match="format must be a format name"):
            scorch.einsum("ij,jk->ik", A, A, format=["csr"])
        with pytest.raises(ValueError, match="the result is a scalar"):
            scorch.einsum("ij,ij->", A, A, format="csr")
    finally:
        scorch.config.dispatch = saved
    for run, argv in [(demo.main, ["--features", "-3"]), (demo.main, ["--graph", "nope"]),
                      (bench_main, ["--repeat", "0"]), (bench_main, ["--plot", "out.txt"])]:
        with pytest.raises(SystemExit):
            run(argv)


def test_a_sparse_operand_broadcasts_its_size_one_dims():
    """einsum broadcasts a sparse operand's size-1 dims as torch.einsum does (it raised; ``A * B``
    broadcast already), gradients summed back into its pattern."""
    g = torch.Generator().manual_seed(0)
    a = torch.tensor([[1.0, 0.0, 2.0, 0.0]])
    b = torch.randn(3, 4, generator=g) * (torch.rand(3, 4, generator=g) < 0.6)
    A, B = scorch.as_sparse(a, "csr"), scorch.as_sparse(b, "coo")
    c = torch.randn(1, 3, 4, generator=g) * (torch.rand(1, 3, 4, generator=g) < 0.5)
    X = torch.randn(2, 4, 5, generator=g)
    for eq, ops, dense_ops in [("ij,ij->ij", (A, B), (a, b)), ("ij,ij->i", (A, b), (a, b)),
                               ("bij,bjk->bik", (scorch.as_sparse(c, "csf"), X), (c, X))]:
        got = scorch.einsum(eq, *ops)
        got = got.to_dense() if isinstance(got, scorch.SparseTensor) else got
        torch.testing.assert_close(got, torch.einsum(eq, *dense_ops))
    assert scorch.explain("ij,ij->i", A, b).loop_order
    Ag = A.clone().requires_grad_()
    scorch.einsum("ij,ij->", Ag, b).backward()
    torch.testing.assert_close(Ag.grad.to_dense(), b.sum(0, keepdim=True) * (a != 0))


def test_like_constructors_honour_a_layout():
    A = scorch.as_sparse(torch.tensor([[0.0, 2.0], [3.0, 0.0]]), "csr")
    for f in (torch.zeros_like, torch.empty_like):
        out = f(A, layout=torch.strided)
        assert type(out) is torch.Tensor and out.shape == A.shape
        out = f(A, layout=torch.sparse_coo)
        assert out.layout == torch.sparse_coo and out._nnz() == 0 and out.shape == A.shape
    assert torch.equal(torch.zeros_like(A, layout=torch.strided), torch.zeros(2, 2))
    assert torch.equal(torch.empty_like(A, layout=torch.strided).fill_(5), torch.full((2, 2), 5.0))
    kept = torch.zeros_like(A)
    assert isinstance(kept, scorch.SparseTensor) and torch.equal(kept.to_dense(), torch.zeros(2, 2))
    assert torch.equal(torch.ones_like(A, layout=torch.strided), torch.ones(2, 2))
    with pytest.raises(ValueError, match="layout=torch.sparse_coo"):
        torch.ones_like(A, layout=torch.sparse_coo)


def test_pattern_changing_writes_reach_data_and_detach_aliases():
    dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    p = torch.nn.Parameter(scorch.as_sparse(dense, "csr"))
    q = torch.tensor([[0.0, 5.0, 0.0], [6.0, 0.0, 0.0]])
    with torch.no_grad():
        p.data.copy_(scorch.as_sparse(q, "csr"))   # another pattern
    assert torch.equal(p.detach().to_dense(), q)
    p.data[0, 2] = 7.0                              # a position not stored: the pattern grows
    q[0, 2] = 7.0
    d = p.detach()
    d[1, 1] = 9.0
    q[1, 1] = 9.0
    assert torch.equal(p.detach().to_dense(), q) and torch.equal(d.to_dense(), q) and p.nnz == 4
    p.data.tril_()
    assert torch.equal(p.detach().to_dense(), q.tril())
    (p * 2).sum().backward()                        # the gradient takes the new pattern
    assert torch.equal(p.grad.to_dense(), 2.0 * (q.tril() != 0))
    other = scorch.as_sparse(dense, "csr")          # not an alias: untouched
    copy = other.clone()
    copy[1, 1] = 4.0
    assert torch.equal(other.to_dense(), dense)


def test_a_detached_result_does_not_keep_its_graph_alive():
    import gc
    import weakref
    W = scorch.as_sparse(torch.eye(3), "csr").requires_grad_()
    h = W * 2.0                       # a result with a graph (which h holds)
    ref = weakref.ref(h)
    kept = h.detach()
    del h
    gc.collect()
    assert ref() is None and torch.equal(kept.to_dense(), 2.0 * torch.eye(3))


def test_var_past_its_degrees_of_freedom_and_alpha_keep_torchs_dtypes():
    x = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 5.0]])
    A = scorch.as_sparse(x, "csr")
    with pytest.warns(UserWarning, match="degrees of freedom"):
        assert torch.equal(torch.var(A, dim=0, correction=2), torch.full((3,), float("inf")))
    with pytest.warns(UserWarning):
        torch.testing.assert_close(A.std(dim=1, correction=5), x.std(dim=1, correction=5))
    xi, m = x.to(torch.int32), x != 0
    Ai = scorch.as_sparse(xi, "csr")
    out = torch.add(Ai, m, alpha=2)
    assert out.dtype == torch.int32 and torch.equal(out.to_dense(), torch.add(xi, m, alpha=2))
    Am = scorch.as_sparse(m, "coo")
    assert torch.equal(torch.add(Am, Am, alpha=2).to_dense(), torch.add(m, m, alpha=2))
    with pytest.raises(TypeError, match="alpha"):
        torch.add(Ai, m, alpha=2.5)
    with pytest.raises(TypeError, match="alpha"):
        torch.add(A, x, alpha=True)
    torch.testing.assert_close(torch.sub(A, x, alpha=0.5).to_dense(), torch.sub(x, x, alpha=0.5))


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
@pytest.mark.parametrize("opt", ["Adam", "SGD"])
def test_optimizers_keep_training_a_parameter_whose_pattern_grew(fmt, opt):
    """Adam's / momentum's state stays in the old pattern when an assignment grows the parameter's:
    the next step's in-place updates add the new entries (oracle: the dense model masked by the
    current pattern)."""
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    p, q = torch.nn.Parameter(scorch.as_sparse(w, fmt)), torch.nn.Parameter(w.clone())
    make = (lambda ps: torch.optim.Adam(ps, lr=0.1)) if opt == "Adam" else \
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    op, oq = make([p]), make([q])
    for step in range(3):
        (x @ p.t()).pow(2).sum().backward()
        (x @ q.t()).pow(2).sum().backward()
        q.grad *= q.detach() != 0
        op.step(), oq.step(), op.zero_grad(), oq.zero_grad()
        if step == 0:
            with torch.no_grad():
                p[0, 1] = 5.0
                q[0, 1] = 5.0
    torch.testing.assert_close(p.detach().to_dense(), q.detach())
    assert p.nnz == 4


def test_writes_take_torchs_argument_forms():
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    A = scorch.as_sparse(d, "csr")
    A[0, 0] = torch.tensor(7.0)                      # a 0-d value of another dtype: cast
    ref = d.clone()
    ref[0, 0] = 7.0
    assert torch.equal(A.to_dense(), ref)
    I = scorch.as_sparse(d.long(), "coo")
    I[d != 0] = torch.tensor(7.5)
    assert torch.equal(I.to_dense(), torch.tensor([[7, 0], [0, 7]]))
    A.fill_(torch.tensor(3.0))                       # fill_ with a 0-d tensor
    assert torch.equal(A.to_dense(), 3.0 * (d != 0))
    with pytest.raises(ValueError, match="0-dimension"):
        A.fill_(torch.ones(2))
    assert torch.equal(torch.empty_like(A).detach().fill_(2).to_dense(), torch.full((2, 2), 2.0, dtype=torch.float64))
    x = torch.arange(8.0).reshape(2, 2, 2)
    B = scorch.as_sparse(x, "coo")
    for f in (lambda t: t.flip(1, 2), lambda t: torch.flip(t, dims=(0,)), lambda t: t.tile(2, 1),
              lambda t: torch.tile(t, dims=(2,))):
        assert torch.equal(f(B).to_dense(), f(x))


def test_copy_into_a_tensor_in_the_graph_is_refused():
    A = scorch.as_sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "csr").requires_grad_()
    B = A * 2
    with pytest.raises(NotImplementedError, match="not recorded by autograd"):
        B.copy_(torch.ones(2, 2))                    # torch would rebase B's history onto the source
    C = scorch.as_sparse(torch.eye(2), "csr")
    with pytest.raises(NotImplementedError, match="not recorded by autograd"):
        C.copy_(torch.ones(2, 2, requires_grad=True))
    with torch.no_grad():
        A.copy_(torch.ones(2, 2))                    # a parameter update
    assert torch.equal(A.detach().to_dense(), torch.ones(2, 2))


def test_ell_padding_stays_zero_under_in_place_writes():
    W = torch.tensor([[1.0, 0, 0, 2], [0, 3, 0, 0], [4, 5, 6, 0]])
    P = scorch.as_sparse(W, "ell")                   # rows padded to 3 slots
    with torch.no_grad():
        P.add_(1.0)
    D = P.to_dense()
    torch.testing.assert_close(P.norm(), D.norm())
    torch.testing.assert_close(torch.linalg.vector_norm(P, 1), D.abs().sum())
    for fill in (lambda t: t.fill_(2.0), lambda t: torch.nn.init.uniform_(t), lambda t: t.mul_(3)):
        with torch.no_grad():
            fill(P)
        torch.testing.assert_close(P.norm(), P.to_dense().norm())
    layer = scorch.nn.SparseLinear(8, 4, format="ell", sparsity=0.5)
    torch.testing.assert_close(layer.weight.norm(), layer.weight.to_dense().norm())


def test_masks_and_indices_are_checked_as_torch_checks_them():
    A = scorch.as_sparse(torch.eye(3), "csr")
    with pytest.raises(TypeError, match="boolean masks"):
        A.masked_fill_(torch.ones(3, 3), 2.0)
    with pytest.raises(TypeError, match="boolean masks"):
        A.masked_fill(torch.ones(3, 3), 0.0)
    with pytest.raises(IndexError, match="out of bounds for dimension 1 with size 3"):
        A.index_fill_(1, torch.tensor([9]), 1.0)


def test_nn_init_orthogonal_reaches_a_sparse_weight():
    W = scorch.as_sparse(torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]), "csr")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")              # (its QR runs on a dense copy, warned once per process)
        torch.nn.init.orthogonal_(W)                 # torch writes W.view_as(q).copy_(q)
    D = W.to_dense()
    torch.testing.assert_close(D @ D.t(), torch.eye(2), atol=1e-5, rtol=0)


def test_reductions_accumulate_as_torch_does():
    big = torch.tensor([[2**60 + 1, 0, 3], [0, 5, 0]])
    B = scorch.as_sparse(big, "csr")
    for f in (lambda t: t.sum(1), lambda t: t.sum(), lambda t: t.sum(0), lambda t: torch.nansum(t, 1)):
        assert torch.equal(f(B), f(big))            # exact int64 (a float64 sum rounds past 2**53)
    h = torch.tensor([[60000.0, 0.0, 60000.0], [0.0, 0.0, 3.0]], dtype=torch.float16)
    H = scorch.as_sparse(h, "csr")
    for f in (lambda t: t.mean(1), lambda t: t.mean(), lambda t: t.std(1), lambda t: t.sum(1)):
        torch.testing.assert_close(f(H), f(h))      # half values accumulate in float32
    tiny = torch.tensor([[1e-3, 0.0, 1e-3]], dtype=torch.float16)
    torch.testing.assert_close(torch.linalg.vector_norm(scorch.as_sparse(tiny, "csr"), 3, 1),
                               torch.linalg.vector_norm(tiny, 3, 1))
    y = torch.tensor([[1e38, 0.0, 1e38], [0.0, 0.0, 3.0]])
    torch.testing.assert_close(scorch.as_sparse(y, "csr").std(), y.std())   # in float64, as torch's var
    p = torch.tensor([[1e30, 0.0, 1e30], [2.0, 3.0, 4.0]])
    assert torch.equal(scorch.as_sparse(p, "csr").prod(1), p.prod(1))       # 0, not 0 * inf
    q = torch.tensor([[float("inf"), 0.0, 1.0]])
    assert bool(scorch.as_sparse(q, "csr").prod(1).isnan()) and bool(q.prod(1).isnan())   # inf * the absent 0
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    A = scorch.as_sparse(x, "csr")
    assert torch.equal(A.any(dim=()), x.any(dim=())) and torch.equal(torch.all(A, dim=()), torch.all(x, dim=()))


def test_integer_elementwise_past_2_53_is_exact():
    x = torch.tensor([[2**60 + 1, 0], [0, 7]])
    y = torch.tensor([[1, 0], [0, 2]])
    A, B = scorch.as_sparse(x, "csr"), scorch.as_sparse(y, "csr")
    for f in (lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b):
        want = f(x, y)
        for other in (B, y):
            got = f(A, other)
            assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)


def test_torchs_argument_spellings():
    import numpy as np
    x = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]])
    A = scorch.as_sparse(x, "csr")
    calls = [lambda t: t.sum(np.int64(1)), lambda t: t.amax(np.int64(-1)), lambda t: t.transpose(np.int64(0), 1),
             lambda t: t.sum(torch.tensor(1)), lambda t: t.permute(np.int64(1), np.int64(0)),
             lambda t: t[np.array([1, 0])], lambda t: torch.add(t, other=torch.ones(3), alpha=2),
             lambda t: t.mul(other=2.0), lambda t: torch.mul(input=t, other=2), lambda t: t.sum(axis=1),
             lambda t: torch.mean(t, axis=0), lambda t: torch.sum(input=t, dim=1), lambda t: torch.t(input=t),
             lambda t: t.permute(dims=(1, 0)), lambda t: t[:1].expand(size=(3, 3)), lambda t: t.std(1, False),
             lambda t: torch.var(t, 1, False), lambda t: t.var(1, True, True), lambda t: t.var(False)]
    for f in calls:
        got, want = f(A), f(x)
        assert torch.allclose(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
    assert torch.equal(A, torch.zeros(3, 2)) is False and torch.equal(A, x) is True
    Z = scorch.as_sparse(torch.zeros(0, 3), "csr")
    assert [tuple(t.shape) for t in Z.chunk(3, 0)] == [(0, 3)] * 3
    out = torch.empty(4, 3)
    assert torch.cat([A, A], out=out) is out and torch.equal(out, torch.cat([x, x]))
    out = torch.empty(2, 2, 3)
    assert torch.stack([A, A], out=out) is out and torch.equal(out, torch.stack([x, x]))


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr"])
def test_softmax_has_a_second_derivative(fmt):
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, -1.0]], dtype=torch.float64)
    pattern = scorch.as_sparse(d, fmt)
    X = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def f(v):
        return (torch.softmax(pattern.with_values(v), 1) @ X).pow(2).sum()
    v = pattern.values().clone().requires_grad_()
    assert torch.autograd.gradgradcheck(f, (v,))
    masked = torch.where(d != 0, 0.0, float("-inf"))   # oracle: the dense softmax over the stored entries
    dv = d.clone().requires_grad_()
    dense = (torch.softmax(dv + masked, 1) @ X).pow(2).sum()
    torch.testing.assert_close(torch.autograd.grad(f(v), v)[0], torch.autograd.grad(dense, dv)[0][d != 0])


def test_forward_mode_ad_carries_tangents_through_sparse_products():
    import torch.autograd.forward_ad as fwAD
    g = torch.Generator().manual_seed(0)
    Wd = torch.randn(4, 3, generator=g) * (torch.rand(4, 3, generator=g) > 0.5)
    W, b = scorch.as_sparse(Wd, "csr"), torch.randn(4, generator=g)
    x, t, tb = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g), torch.randn(4, generator=g)
    with fwAD.dual_level():
        d, db = fwAD.make_dual(x, t), fwAD.make_dual(b, tb)
        for got, want in [(torch.nn.functional.linear(d, W), t @ Wd.t()),
                          (torch.nn.functional.linear(d, W, db), t @ Wd.t() + tb),
                          (W @ fwAD.make_dual(x.t().contiguous(), t.t().contiguous()), Wd @ t.t())]:
            tangent = fwAD.unpack_dual(got).tangent
            assert tangent is not None
            torch.testing.assert_close(tangent, want)


def test_autocast_gives_its_dtype_for_sparse_products():
    g = torch.Generator().manual_seed(0)
    Wd = torch.randn(4, 8, generator=g) * (torch.rand(4, 8, generator=g) > 0.5)
    W, b, x = scorch.as_sparse(Wd, "csr"), torch.randn(4, generator=g), torch.randn(3, 8, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for got, want in [(torch.nn.functional.linear(x, W, b), torch.nn.functional.linear(x, Wd, b)),
                          (x @ W.t(), x @ Wd.t()), (torch.mm(W, x.t()), torch.mm(Wd, x.t()))]:
            assert got.dtype == want.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)
        W64 = scorch.as_sparse(Wd.double(), "csr")
        assert (W64 @ x.double().t()).dtype == torch.float64          # autocast leaves float64 alone
    assert (x @ W.t()).dtype == torch.float32


def test_auto_sparsify_keeps_dense_results_dense(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 100, generator=g) * (torch.rand(100, 100, generator=g) < 0.02)
    y = torch.randn(100, 100, generator=g)
    monkeypatch.setattr(scorch.config, "auto_sparsify", True)
    for eq, ops in (("ij,ij->ij", (x, y)), ("ij->ji", (x,)), ("ij,jk->ik", (x, y))):
        out = scorch.einsum(eq, *ops)
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, torch.einsum(eq, *ops))


def test_torch_func_transforms_over_dense_inputs_of_sparse_products():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    Wd = torch.randn(4, 3, generator=g) * (torch.rand(4, 3, generator=g) > 0.5)
    W, b, x = scorch.as_sparse(Wd, "csr"), torch.randn(4, generator=g), torch.randn(6, 5, 3, generator=g)
    cases = [lambda M: torch.func.vmap(lambda a: F.linear(a, M, b))(x),
             lambda M: torch.func.vmap(lambda a: M @ a)(x[0]),
             lambda M: torch.func.jacrev(lambda a: F.linear(a, M, b))(x[0]),
             lambda M: torch.func.jacfwd(lambda a: M @ a)(x[0, 0]),
             lambda M: torch.func.jvp(lambda a: F.linear(a, M, b), (x[0],), (x[1],)),
             lambda M: torch.func.hessian(lambda a: (M @ a).pow(2).sum())(x[0, 0]),
             lambda M: torch.func.vmap(torch.func.grad(lambda a: F.linear(a, M).pow(2).sum()))(x)]
    for f in cases:
        got, want = f(W), f(Wd)
        for p, q in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fmt", ["csr", "coo", "ell"])
@pytest.mark.parametrize("opt", ["Adam", "AdamW", "SGD", "Adagrad"])
def test_fused_optimizers_step_sparse_parameters(fmt, opt):
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    kw = {"SGD": {"momentum": 0.9, "nesterov": True}, "Adam": {"amsgrad": True, "weight_decay": 0.1}}.get(opt, {})
    make = lambda ps: getattr(torch.optim, opt)(ps, lr=0.1, fused=True, **kw)   # noqa: E731
    p, q = torch.nn.Parameter(scorch.as_sparse(w, fmt)), torch.nn.Parameter(w.clone())
    b, c = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))   # a dense one beside it
    op, oq = make([p, b]), make([q, c])
    for _ in range(3):
        (x @ p.t() + b).pow(2).sum().backward()
        (x @ q.t() + c).pow(2).sum().backward()
        q.grad *= w != 0
        op.step(), oq.step(), op.zero_grad(), oq.zero_grad()
    torch.testing.assert_close(p.detach().to_dense(), q.detach())
    torch.testing.assert_close(b.detach(), c.detach())


@pytest.mark.parametrize("opt", ["Adam", "AdamW", "Adam-amsgrad", "Adamax", "RMSprop", "Adagrad", "NAdam", "RAdam",
                                 "Adam-fused", "AdamW-fused", "SGD-fused", "Adagrad-fused"])
def test_optimizers_follow_a_parameter_whose_pattern_was_replaced(opt):
    """``p.data.copy_(q)`` with a pattern neither inside nor around p's (the optimizer's state stays
    in the old one): the next steps match the dense model masked by the current pattern (they gave
    NaN, or raised for amsgrad / Adamax / the fused forms)."""
    name, _, variant = opt.partition("-")
    extra = {"amsgrad": {"amsgrad": True}, "fused": {"fused": True}}.get(variant, {})
    extra = {**extra, "momentum": 0.9} if name == "SGD" else extra
    make = lambda ps: getattr(torch.optim, name)(ps, lr=0.1, **extra)  # noqa: E731
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    q = torch.tensor([[0.0, 4.0, 2.0], [5.0, 0.0, 0.0]])
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    p, d = torch.nn.Parameter(scorch.as_sparse(w, "csr")), torch.nn.Parameter(w.clone())
    op, od = make([p]), make([d])
    for step in range(3):
        if step == 1:
            with torch.no_grad():
                p.data.copy_(scorch.as_sparse(q, "csr"))
                d.data.copy_(q)
        mask = p.detach().to_dense() != 0
        (p @ x).sum().backward()
        (d @ x).sum().backward()
        d.grad.mul_(mask)
        op.step(), od.step(), op.zero_grad(), od.zero_grad()
    torch.testing.assert_close(p.detach().to_dense(), d.detach())


def test_addcdiv_and_addcmul_with_sparse_operands_of_other_patterns():
    P = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    Q = torch.tensor([[0.0, 4.0, 2.0], [5.0, 0.0, 1.0]])
    x = scorch.as_sparse(P, "csr")
    x.addcmul_(scorch.as_sparse(P, "csr"), scorch.as_sparse(Q, "csr"), value=2.0)
    assert torch.equal(x.to_dense(), torch.addcmul(P, P, Q, value=2.0))
    y = scorch.as_sparse(P, "csr")
    t1, t2 = scorch.as_sparse(Q, "coo"), scorch.as_sparse(Q + (Q != 0), "csr")
    y.addcdiv_(t1, t2, value=-0.5)                   # the quotient on t1's entries (an absent t1 adds 0)
    want = P + torch.where(Q != 0, -0.5 * Q / torch.where(Q != 0, Q + 1, 1.0), 0.0)
    torch.testing.assert_close(y.to_dense(), want)


def test_gradients_of_ties_follow_torch():
    X = torch.tensor([[2.0, 0.0, 2.0], [1.0, 2.0, 0.0]])
    for f in (lambda t: t.max(dim=1).values.sum(), lambda t: t.min(dim=0).values.sum(), lambda t: t.median(),
              lambda t: torch.nanmedian(t)):
        D = X.clone().requires_grad_()
        S = scorch.as_sparse(X, "csr").requires_grad_()
        f(D).backward()
        f(S).backward()
        torch.testing.assert_close(f(S), f(D))
        torch.testing.assert_close(S.grad.to_dense(), D.grad * (X != 0))   # (absent entries: outside the pattern)


def test_secondary_sparse_arguments_and_integer_features():
    D = torch.arange(12.0).view(3, 4)
    v, w = torch.tensor([0, 3, 0, 1]), torch.tensor([0.5, 0.0, 2.0, 0.0])
    idx = torch.tensor([[3, 0], [1, 1], [2, 0]])
    S = lambda t: scorch.as_sparse(t, "coo")   # noqa: E731
    assert torch.equal(torch.bincount(v, weights=S(w)), torch.bincount(v, weights=w))
    assert torch.equal(torch.gather(D, 1, S(idx)), torch.gather(D, 1, idx))
    assert torch.equal(torch.take(D, S(idx)), torch.take(D, idx))
    assert torch.equal(torch.take_along_dim(D, S(idx), 1), torch.take_along_dim(D, idx, 1))
    with pytest.raises(ValueError, match="inf norm on an empty tensor"):
        torch.linalg.vector_norm(scorch.as_sparse(torch.zeros(0, 3), "csr"), float("inf"))
    torch.manual_seed(0)
    m = scorch.nn.Recommender(7, 6, dim=3)
    uf = (torch.rand(4, 7) < 0.5).long()
    itf = (torch.rand(5, 6) < 0.5).long()
    got = m(scorch.as_sparse(uf, "csr"), scorch.as_sparse(itf, "csr"))   # 0/1 features: the model's floats
    want = m(scorch.as_sparse(uf.float(), "csr"), scorch.as_sparse(itf.float(), "csr"))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_forward_mode_ad_through_a_sparse_operand_s_values_and_autocast_of_every_product():
    import torch.autograd.forward_ad as fwAD
    xd = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    X = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))
    A = scorch.as_sparse(xd, "csr")
    with fwAD.dual_level():
        At = A.with_values(fwAD.make_dual(A.values().clone(), torch.ones(A.nnz)))
        want = fwAD.unpack_dual(fwAD.make_dual(xd, (xd != 0).float()) @ X).tangent
        torch.testing.assert_close(fwAD.unpack_dual(At @ X).tangent, want)
    Y = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for got, ref in [(scorch.einsum("ij,jk->ik", A, Y), torch.einsum("ij,jk->ik", xd, Y)),
                         (torch.tensordot(A, Y, dims=1), torch.tensordot(xd, Y, dims=1)),
                         (torch.sparse.mm(A, Y), torch.sparse.mm(xd.to_sparse(), Y))]:
            assert got.dtype == ref.dtype == torch.bfloat16
        assert A.sum().dtype == torch.float32 and (A * 2).dtype == torch.float32   # reductions, elementwise: as they are


def test_autocast_chains_sparse_layers_and_leaves_dense_einsums_to_torch():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    W1 = torch.randn(4, 3, 3, 3, generator=g) * (torch.rand(4, 3, 3, 3, generator=g) < 0.5)
    W2 = torch.randn(2, 4, 3, 3, generator=g) * (torch.rand(2, 4, 3, 3, generator=g) < 0.5)
    x = torch.randn(2, 3, 8, 8, generator=g)
    S1, S2 = scorch.as_sparse(W1, "csf"), scorch.as_sparse(W2, "csf")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.conv2d(F.conv2d(x, S1).relu(), S2)   # the second conv meets the first's bfloat16 output
        want = F.conv2d(F.conv2d(x, W1).relu(), W2)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)
        a, b = torch.randn(5, 6, generator=g), torch.randn(6, 7, generator=g)
        assert torch.equal(scorch.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", a, b))   # torch's own


def test_a_device_context_leaves_sparse_work_on_the_cpu():
    """Under ``with torch.device("meta")`` scorch's buffers went to meta and a kernel wrote through
    its null pointer (the process crashed): CPU operands compute on the CPU, as torch's do."""
    D = torch.rand(50, 40, generator=torch.Generator().manual_seed(0))
    D = D * (D < 0.3)
    A, x = scorch.as_sparse(D, "csr"), torch.randn(40, generator=torch.Generator().manual_seed(1))
    with torch.device("meta"):
        for got, want in [(A @ x, D @ x), (scorch.einsum("ij,j->i", A, x), D @ x), (A.sum(0), D.sum(0)),
                          ((A * 2).to_dense(), D * 2), (scorch.as_sparse(D, "coo").to_dense(), D),
                          (A.asformat("ell").to_dense(), D), (A.t().to_dense(), D.t())]:
            assert got.device.type == "cpu"
            torch.testing.assert_close(got, want)


def test_writes_through_values_are_seen_by_autograd_and_torch_func_makes_sparse_tensors():
    A = scorch.as_sparse(torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]), "csr")
    x = torch.ones(3, 2, requires_grad=True)
    y = A @ x
    A.values().mul_(10)                               # A saved for backward, changed under it
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    B = scorch.as_sparse(torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]), "csr")
    for op in (lambda M: M.detach(), lambda M: M.clone(), lambda M: M.double().float(), lambda M: M.asformat("coo")):
        g = torch.func.grad(lambda v: (op(B) @ v).sum())(torch.ones(3))   # a SparseTensor made in the transform
        torch.testing.assert_close(g, torch.tensor([1.0, 3.0, 2.0]))


def test_torch_func_over_a_sparse_convolution():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, 3, 3, generator=g) * (torch.rand(8, 4, 3, 3, generator=g) < 0.2)
    x = torch.randn(5, 4, 8, 8, generator=g)
    f = lambda W: torch.func.vmap(torch.func.grad(   # noqa: E731  per-sample input gradients
        lambda xi: torch.nn.functional.conv2d(xi[None], W, padding=1).pow(2).sum()))(x)
    torch.testing.assert_close(f(scorch.as_sparse(w, "csf")), f(w))


def test_malformed_batched_and_hybrid_torch_compressed_tensors_are_refused():
    """torch builds them unchecked with check_invariants=False; its own conversion then corrupted
    memory: scorch checks their index arrays first."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = torch.sparse_csr_tensor(torch.tensor([[0, 2, 100], [0, 1, 2]]), torch.tensor([[0, 1000000], [5, -3]]),
                                          torch.ones(2, 2), (2, 2, 3), check_invariants=False)
        hybrid = torch.sparse_csr_tensor(torch.tensor([0, 2, 100]), torch.tensor([0, 1000000]), torch.ones(2, 2),
                                         (2, 3, 2), check_invariants=False)
        bad_cols = torch.sparse_csr_tensor(torch.tensor([[0, 1, 2], [0, 1, 2]]), torch.tensor([[0, 7], [1, 2]]),
                                           torch.ones(2, 2), (2, 2, 3), check_invariants=False)
        good = torch.sparse_csr_tensor(torch.tensor([[0, 1, 2], [0, 2, 2]]), torch.tensor([[2, 0], [0, 1]]),
                                       torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (2, 2, 3))
    for bad in (batched, hybrid, bad_cols):
        with pytest.raises(ValueError, match="crow_indices|col_indices"):
            scorch.as_sparse(bad, "csr")
    assert torch.equal(scorch.as_sparse(good, "csr").to_dense(), good.to_dense())


def test_malformed_scipy_matrices_are_refused():
    sp = pytest.importorskip("scipy.sparse")
    bad_ptr = sp.csr_matrix((3, 3))
    bad_ptr.indptr, bad_ptr.indices, bad_ptr.data = (np.array([0, 2, 50, 100], dtype=np.int32),
                                                     np.array([0, 1], dtype=np.int32), np.ones(2))
    falling = sp.csr_matrix((3, 3))
    falling.indptr, falling.indices, falling.data = (np.array([0, 2, 1, 2], dtype=np.int32),
                                                     np.array([0, 1], dtype=np.int32), np.ones(2))
    short = sp.coo_matrix((np.ones(2), (np.array([0, 1]), np.array([1, 2]))), shape=(3, 3))
    short.data = np.ones(1)
    for bad in (bad_ptr, falling, short):
        with pytest.raises(ValueError, match="indptr|one length"):
            scorch.as_sparse(bad, "csr")
    good = sp.random(5, 4, density=0.4, format="csr", random_state=0)
    assert torch.equal(scorch.as_sparse(good, "coo").to_dense(), torch.from_numpy(good.toarray()))


@pytest.mark.parametrize("fmt", ["csr", "coo", "dcsr", "csc", "dcsc", "ell", "bsr"])
def test_coalesced_means_row_major_indices_aligned_with_values(fmt):
    x = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 3.0, 0.0], [0.0, 4.0, 0.0, 5.0], [0.0, 0.0, 6.0, 0.0]])
    A = scorch.as_sparse(x, scorch.formats.bsr(2, 2) if fmt == "bsr" else fmt)
    C = A.coalesce()
    assert C.is_coalesced() and A.is_coalesced() == (fmt in ("csr", "coo", "dcsr"))
    T = torch.sparse_coo_tensor(C.indices(), C.values(), C.shape, is_coalesced=C.is_coalesced())
    assert torch.equal(T.to_sparse_csr().to_dense(), x)   # torch code trusting the flag reads it right


@pytest.mark.parametrize("fmt", ["csr", "bsr"])
def test_roots_keep_zero_gradients_at_stored_zeros(fmt):
    """vector_norm with 0 < p < 1 over a dim and std over a dim of all-zero stored values: torch's
    backward masks the root's infinite derivative at 0; scorch's gave NaN there."""
    x = torch.tensor([[0.0, 0.0, 1.0, 0.0], [2.0, 3.0, 0.0, 4.0]], dtype=torch.float64)
    f = scorch.formats.bsr(1, 2) if fmt == "bsr" else fmt   # bsr stores the zeros beside 1 and 4
    for op in (lambda t: torch.linalg.vector_norm(t, 0.5, dim=1), lambda t: t.norm(0.25, dim=0),
               lambda t: torch.nn.functional.normalize(t, p=0.5, dim=1), lambda t: t.std(1),
               lambda t: torch.std_mean(t[:, :2], 1)[0]):
        want = x.clone().requires_grad_()
        op(want).sum().backward()
        got = x.clone().requires_grad_()
        out = op(scorch.as_sparse(got, f))
        (out.to_dense() if isinstance(out, scorch.SparseTensor) else out).sum().backward()
        stored = scorch.as_sparse(x, f).to_dense() != 0
        assert not got.grad.isnan().any()
        torch.testing.assert_close(got.grad[stored], want.grad[stored])


def test_sparse_masks_and_indices_stay_sparse_or_run_densely_as_torch():
    """A sparse bool mask of the tensor's shape is read at its stored True entries (its dense copy of
    a 10^6 x 10^6 matrix was allocated); a sparse index of a scatter into a dense tensor recursed
    forever; a dense input with a sparse mask raised in masked_select."""
    n = 10 ** 6
    A = scorch.from_coo([[0, 5, n - 1], [3, 5, n - 2]], [1.0, -2.0, 3.0], (n, n), format="csr")
    assert A.masked_fill(A < 0, 0.0).values().tolist() == [1.0, 0.0, 3.0]
    assert A.clone().masked_fill_(A < 0, 0.0).values().tolist() == [1.0, 0.0, 3.0]
    assert A.masked_select(A > 0).tolist() == [1.0, 3.0]
    for value in (0.0, 7):
        B = A.clone()
        B[A < 0] = value
        assert B.values().tolist() == [1.0, float(value), 3.0] and B.nnz == 3
    assert A.index_put((A < 0,), torch.tensor(0.0)).values().tolist() == [1.0, 0.0, 3.0]
    assert [t.tolist() for t in torch.where(A > 0)] == [[0, n - 1], [3, n - 2]]
    x = torch.tensor([[0.0, -1.0, 2.0], [3.0, 0.0, -4.0]])
    for fmt in ("csr", "csc", "coo", "ell"):
        S, m = scorch.as_sparse(x, fmt), x != 0
        for want, got in ((x.masked_fill(x < 0, 9.0), S.masked_fill(S < 0, 9.0)),
                          (x.masked_fill(m, 5.0), x.masked_fill(scorch.as_sparse(m, fmt), 5.0)),
                          (x.masked_select(x > 0), x.masked_select(scorch.as_sparse(x > 0, fmt)))):
            assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
        B, d = S.clone(), x.clone()
        B[scorch.as_sparse(x > 1, fmt)] = 8.0
        d[x > 1] = 8.0
        assert torch.equal(B.to_dense(), d)
        grow = S.clone()
        grow.masked_fill_(scorch.as_sparse(torch.eye(2, 3, dtype=torch.bool), fmt), 6.0)   # (0, 0) joins
        assert torch.equal(grow.to_dense(), x.masked_fill(torch.eye(2, 3, dtype=torch.bool), 6.0))
        assert [t.tolist() for t in torch.where(S)] == [t.tolist() for t in torch.where(x)]
    for dtype, value in ((torch.float64, 1.2), (torch.int64, 2.7), (torch.bool, 2)):   # cast as torch casts
        d = (x * 10).to(dtype)
        B = scorch.as_sparse(d, "csr")
        B[scorch.as_sparse(d != 0, "csr")] = value
        d[d != 0] = value
        assert torch.equal(B.to_dense(), d)
    idx = torch.tensor([[1, 0], [0, 1]])
    for op in ("scatter", "scatter_add"):
        got = getattr(torch.zeros(2, 2), op)(1, scorch.as_sparse(idx, "csr"), torch.ones(2, 2))
        assert torch.equal(got, getattr(torch.zeros(2, 2), op)(1, idx, torch.ones(2, 2)))
    assert torch.equal(torch.zeros(2, 2).scatter(1, scorch.as_sparse(idx, "coo"), 1.0),
                       torch.zeros(2, 2).scatter(1, idx, 1.0))
    assert torch.equal(torch.zeros(2, 2).scatter(1, idx, value=2.0), torch.zeros(2, 2).scatter(1, idx, 2.0))


@pytest.mark.parametrize("fmt", ["csr", "ell", "bsr"])
def test_frexp_gives_both_parts_in_the_pattern(fmt):
    x = torch.tensor([[0.0, 1.5, 0.0, 0.0], [-2.0, 0.0, 0.0, 40.0]])
    S = scorch.as_sparse(x, scorch.formats.bsr(1, 2) if fmt == "bsr" else fmt)
    got, want = torch.frexp(S), torch.frexp(x)
    assert type(got) is type(want)
    assert torch.equal(got.mantissa.to_dense(), want.mantissa) and torch.equal(got.exponent.to_dense(), want.exponent)
    assert got.exponent.dtype == torch.int32 and torch.equal(S.frexp()[1].to_dense(), want[1])
    m, e = torch.empty(0), torch.empty(0, dtype=torch.int32)
    out = torch.frexp(S, out=(m, e))   # (its out= overload names mantissa= / exponent=, not out=)
    assert out[0] is m and out[1] is e and torch.equal(m, want.mantissa) and torch.equal(e, want.exponent)


def test_scaled_products_follow_torch_for_alpha_zero_and_integer_scalars():
    inf = float("inf")
    x = torch.tensor([[0.0, inf], [1.0, 0.0]])
    A, I, v = scorch.as_sparse(x, "csr"), torch.ones(2, 2), torch.ones(2)
    for name, args in (("addmm", (I, A, I)), ("addmv", (v, A, v)), ("addbmm", (I, A.unsqueeze(0), I[None])),
                       ("baddbmm", (I[None], A.unsqueeze(0), I[None]))):
        dense = [a.to_dense() if isinstance(a, scorch.SparseTensor) else a for a in args]
        for alpha, beta in ((0, 1), (0, 2.0), (2.0, 0)):
            want = getattr(torch, name)(*dense, alpha=alpha, beta=beta)   # baddbmm: torch passes inf * 0 on
            torch.testing.assert_close(getattr(torch, name)(*args, alpha=alpha, beta=beta), want, equal_nan=True)
    xi, Ii, M = torch.tensor([[0, 3], [5, 0]]), torch.tensor([[1, 2], [3, 5]]), torch.tensor([[1, 1], [2, 3]])
    Ai = scorch.as_sparse(xi, "csr")
    for kw in ({"alpha": 2.5}, {"beta": 0.5}, {"alpha": -1.5, "beta": 2.0}):
        got = torch.addmm(Ii, Ai, M, **kw)
        assert got.dtype == torch.int64 and torch.equal(got, torch.addmm(Ii, xi, M, **kw))
        assert torch.equal(torch.addmv(Ii[0], Ai, M[0], **kw), torch.addmv(Ii[0], xi, M[0], **kw))


def test_legacy_torch_save_format_is_refused_clearly(tmp_path, monkeypatch):
    """torch's legacy (non-zip) format reads a tensor's arrays only after rebuilding it: the arrays
    were checked while still uninitialised (a false error, garbage coordinates)."""
    tensor_module = __import__("importlib").import_module("scorch.tensor")
    A = scorch.as_sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "csr")
    with pytest.raises(scorch.NotSupportedError, match="legacy format"):
        torch.save(A, tmp_path / "a.pt", _use_new_zipfile_serialization=False)
    real = tensor_module._inside
    monkeypatch.setattr(tensor_module, "_inside", lambda fn: False if fn is torch.serialization._legacy_save
                        else real(fn))   # a file written anyway (by hand, say)
    torch.save({"A": A}, tmp_path / "a.pt", _use_new_zipfile_serialization=False)
    monkeypatch.setattr(tensor_module, "_inside", real)
    for weights_only in (True, False):
        with pytest.raises(scorch.NotSupportedError, match="legacy"):
            torch.load(tmp_path / "a.pt", weights_only=weights_only)
    torch.save(A, tmp_path / "b.pt")
    assert torch.equal(torch.load(tmp_path / "b.pt").to_dense(), A.to_dense())


def test_deepcopy_keeps_a_users_attributes():
    A = scorch.as_sparse(torch.eye(3), "csr")
    A.tag = {"layer": 1}
    A.me = A   # (a cycle: the memo ends it, as torch's)
    B = __import__("copy").deepcopy(A)
    assert B.tag == {"layer": 1} and B.tag is not A.tag and torch.equal(B.to_dense(), torch.eye(3))
    assert B.me is B
    import pickle
    C = scorch.as_sparse(torch.eye(3), "csr")
    C.tag = {"layer": 1}
    P = torch.nn.Parameter(scorch.as_sparse(torch.eye(2), "coo"))
    P.note = "w"
    for got in (pickle.loads(pickle.dumps(C)), pickle.loads(pickle.dumps(P))):   # pickling keeps them too
        assert getattr(got, "tag", None) == {"layer": 1} or getattr(got, "note", None) == "w"
    buf = __import__("io").BytesIO()
    torch.save({"C": C, "P": P}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)   # plain-data attributes load under weights_only
    assert back["C"].tag == {"layer": 1} and back["P"].note == "w" and isinstance(back["P"], torch.nn.Parameter)


@pytest.mark.parametrize("op", ["argmax", "argmin", "trace", "topk", "kthvalue", "median", "nanmedian"])
def test_order_statistics_refuse_bool_as_torch(op):
    b = torch.tensor([[False, True, False], [True, True, False]])
    call = {"topk": lambda t: t.topk(1), "kthvalue": lambda t: t.kthvalue(1)}.get(op, lambda t: getattr(t, op)())
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(b)
    with pytest.raises(TypeError, match=f"{op}: does not support bool input"):
        call(scorch.as_sparse(b, "csr"))
    if op in ("argmax", "median"):
        with pytest.raises(TypeError, match="bool"):
            getattr(scorch.as_sparse(b, "coo"), op)(1)
    assert torch.equal(scorch.as_sparse(b.int(), "csr").argmax(), b.int().argmax())


def test_dense_operands_with_torchs_negation_bit_are_read_as_their_values():
    """``x.conj().imag`` (and ``torch._neg_view``) is a lazily negated tensor: kernels read its raw
    memory, which holds the values before negation (every product was negated)."""
    D = torch.tensor([[0.0, 2.0, 0.0, 1.0], [3.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 4.0]])
    A = scorch.as_sparse(D, "csr")
    z = torch.tensor([1 + 2j, 3 - 1j, -2 + 0.5j, 4 + 1j], dtype=torch.complex64)
    x = z.conj().imag
    X = torch._neg_view(torch.randn(4, 3))
    assert x.is_neg() and X.is_neg()
    for _ in range(2):   # the first call binds the kernel, the second runs the bound call
        torch.testing.assert_close(A @ x, D @ x.resolve_neg())
        torch.testing.assert_close(scorch.einsum("ij,j->i", A, x), D @ x.resolve_neg())
        torch.testing.assert_close(A @ X, D @ X.resolve_neg())
        torch.testing.assert_close((A * x).to_dense(), D * x.resolve_neg())
        torch.testing.assert_close(torch.addmv(x, A.t(), x[:3]), torch.addmv(x.resolve_neg(), D.t(), x[:3].resolve_neg()))
    B = A.with_values(torch._neg_view(A.values().clone()))   # negated values: stored as what they mean
    torch.testing.assert_close(B.to_dense(), -D)
    torch.testing.assert_close(B @ x, -D @ x.resolve_neg())


def test_the_arrays_a_tensor_hands_out_cannot_change_its_storage():
    """values() is a view (its resize_ / set_ / .data = leave the tensor's array alone); pos() / crd()
    / crow_indices() and to_scipy() give copies (scipy's eliminate_zeros compacted the tensor's own
    arrays): each of these crashed the next product or read garbage."""
    D = torch.tensor([[0.0, 2.0, 0.0, 1.0], [3.0, 0.0, -1.0, 0.0], [0.0, 5.0, 0.0, 4.0]])
    x = torch.arange(4.0)
    for attack in (lambda A: A.values().resize_(1), lambda A: A.values().set_(torch.empty(0)),
                   lambda A: setattr(A.values(), "data", A.values().double()),
                   lambda A: A.crd(1).fill_(10 ** 6), lambda A: A.pos(1).__setitem__(-1, 10 ** 8),
                   lambda A: A.col_indices().fill_(10 ** 6), lambda A: A.crow_indices().zero_()):
        A = scorch.as_sparse(D, "csr")
        A @ x
        attack(A)
        assert A.dtype == torch.float32
        torch.testing.assert_close(A @ x, D @ x)
    A = scorch.as_sparse(D, "csr")
    A.values().mul_(2)   # writes into the values are the tensor's, as torch's values()
    torch.testing.assert_close(A.to_dense(), 2 * D)
    sp = pytest.importorskip("scipy.sparse")
    A = scorch.as_sparse(D, "csr")
    A.values()[::2] = 0
    S = A.to_scipy()
    S.eliminate_zeros()
    S.data *= 10
    assert isinstance(S, sp.sparray) and A.nnz == 6
    torch.testing.assert_close(A @ x, A.to_dense() @ x)


def test_values_on_another_device_never_reach_a_bound_kernel():
    D = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    A, x = scorch.as_sparse(D, "csr"), torch.ones(2)
    A @ x   # binds the CPU kernel for the CPU signature
    meta = torch.ones(A.nnz, device="meta")
    B = scorch.SparseTensor(A._format, A._shape, A._pos, A._crd, meta)   # (the raw constructor trusts its arrays)
    with pytest.raises(scorch.NotSupportedError, match="on meta"):
        B @ x
    for make in (lambda: A.with_values(meta), lambda: scorch.from_coo([[0], [1]], torch.ones(1, device="meta"), (2, 2)),
                 lambda: scorch.SparseTensor.from_levels("csr", (2, 2), A._pos, A._crd, meta)):
        with pytest.raises(scorch.NotSupportedError, match="values are on meta"):   # (from_coo stored zeros)
            make()
    for bad in (torch.int16, torch.float32, "int32"):   # (an int16 index width reached the kernels: segfault)
        with pytest.raises(TypeError, match="index_dtype must be"):
            A.asformat("coo", index_dtype=bad)


def test_more_torch_conventions_of_todays_sweeps():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    S, idx = scorch.as_sparse(x, "csr"), torch.tensor([0, 1, -1])
    src = scorch.as_sparse(torch.ones(3, 2), "coo")
    with pytest.raises(IndexError, match="index -1 is out of bounds"):
        torch.zeros(3, 2).index_add(0, idx, src)
    with pytest.raises(RuntimeError):
        torch.zeros(3, 2).index_add(0, idx, torch.ones(3, 2))   # torch's own refusal
    y = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    m = x > 0
    for kw in ({"input": S, "other": y}, {"input": y, "other": S}):
        want = torch.where(m, **{k: v.to_dense() if isinstance(v, scorch.SparseTensor) else v for k, v in kw.items()})
        got = torch.where(m, **kw)
        assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, want)
    got = torch.where(condition=scorch.as_sparse(m, "csr"), input=y, other=S)
    assert torch.equal(got.to_dense() if isinstance(got, scorch.SparseTensor) else got, torch.where(m, y, x))
    a = torch.tensor([[0.0, float("inf")], [1.0, 0.0]])
    for name, factors in (("addmm", (torch.ones(2, 2),)), ("addmv", (torch.ones(2),))):
        leaf = a.clone().requires_grad_()
        P = scorch.as_sparse(leaf, "csr")
        out = getattr(torch, name)(torch.ones(2, 2) if name == "addmm" else torch.ones(2), P, *factors, alpha=0)
        assert out.requires_grad
        out.sum().backward()
        assert torch.equal(leaf.grad, torch.zeros(2, 2))
    xi = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="must not be floating point"):
        torch.addr(torch.zeros(2, 2, dtype=torch.int64), scorch.as_sparse(xi, "coo"), xi, alpha=2.5)
    with pytest.raises(RuntimeError, match="must not be a floating point"):
        torch.addr(torch.zeros(2, 2, dtype=torch.int64), xi, xi, alpha=2.5)   # torch's own refusal
    I8 = scorch.as_sparse(torch.tensor([[1, 0], [0, 2]], dtype=torch.int8), "csr")
    for value in (300, float("nan")):
        with pytest.raises(RuntimeError, match="overflow"):
            I8.clone().masked_fill_(I8 != 0, value)
        with pytest.raises(RuntimeError, match="overflow"):
            I8.clone()[I8 != 0] = value
    F = scorch.as_sparse(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "coo")
    for value in (1e40, 1 + 2j):
        with pytest.raises(RuntimeError, match="overflow"):
            F.clone()[F != 0] = value
    G = F.clone()
    G[F != 0] = 1 + 0j   # a complex with no imaginary part is written, as torch writes it
    assert torch.equal(G.to_dense(), torch.eye(2))
    row = scorch.as_sparse(torch.tensor([[0.0, 3.0, 0.0, 4.0]]), "csr")
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])
    assert torch.equal(row.masked_select(mask), row.to_dense().masked_select(mask))
    with pytest.raises(ValueError, match="at most 26 dims"):
        scorch.from_coo(torch.zeros(27, 1, dtype=torch.int64), torch.ones(1), (1,) * 27, format="coo")


def test_dtype_sweep_cases():
    """Narrow integer products wrapped as torch's on the first call too (a float cast saturated);
    a Python float written where nothing was stored kept float64 precision (it went through
    float32); complex prod kept its type; out= casts as torch's; complex errors say so."""
    d = torch.zeros(2, 4, dtype=torch.int32)
    d[0], d[1, 0] = 2 ** 30, 2 ** 30
    X, C = torch.full((4, 1), 2, dtype=torch.int32), torch.ones(2, 1, dtype=torch.int32)
    for _ in range(2):
        assert torch.equal(torch.addmm(C, scorch.as_sparse(d, "csr"), X), torch.addmm(C, d, X))
        assert torch.equal(torch.addmv(C[:, 0], scorch.as_sparse(d, "csr"), X[:, 0]), torch.addmv(C[:, 0], d, X[:, 0]))
    for dtype, value in ((torch.float64, 0.1), (torch.complex128, 0.1 + 0.1j)):
        x = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=dtype)
        for write in (lambda t: t.__setitem__((0, 0), value), lambda t: t.__setitem__(0, value),
                      lambda t: t.__setitem__(([0], [0]), value), lambda t: t.masked_fill_(torch.eye(2) > 0, value),
                      lambda t: t.fill_diagonal_(value)):
            A, D = scorch.as_sparse(x, "csr"), x.clone()
            write(A), write(D)
            assert torch.equal(A.to_dense(), D)
    z = torch.tensor([[1 + 2j, 2.5], [3, 3 - 1j]], dtype=torch.complex64)
    Z = scorch.as_sparse(z, "coo")
    torch.testing.assert_close(Z.prod(), z.prod())
    torch.testing.assert_close(Z.prod(1), z.prod(1))
    with pytest.raises(ValueError, match="dtype should be complex"):
        torch.linalg.vector_norm(Z, dtype=torch.float64)
    torch.testing.assert_close(Z @ torch.ones(2, dtype=torch.complex64), z @ torch.ones(2, dtype=torch.complex64))
    x = torch.tensor([[1.5, 0.0, 2.0], [0.0, 3.0, 0.0]])
    A = scorch.as_sparse(x, "csr")
    for op in (lambda t, out: torch.sum(t, 1, out=out), lambda t, out: torch.exp(t, out=out),
               lambda t, out: torch.add(t, 1, out=out)):
        got, want = torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64)
        op(A, got), op(x, want)
        assert got.dtype == torch.float64 and torch.equal(got, want)
    got = torch.sum(A, 1, out=torch.empty(2, dtype=torch.int64))   # torch sums in the out's dtype
    assert torch.equal(got, torch.sum(x, 1, out=torch.empty(2, dtype=torch.int64)))
    with pytest.raises(ValueError, match="cannot be cast"):
        torch.exp(A, out=torch.empty(2, 3, dtype=torch.int64))


def test_what_torch_refuses_for_dtypes_is_refused():
    b, i = torch.tensor([[True, False], [False, True]]), torch.tensor([[5, 0], [0, 7]])
    B, I = scorch.as_sparse(b, "csr"), scorch.as_sparse(i, "csr")
    for x, y in ((B, i), (b, I), (B, I), (I, B)):
        with pytest.raises(ValueError, match="with a bool tensor is not supported"):
            x - y
        with pytest.raises(ValueError, match="with a bool tensor is not supported"):
            torch.sub(x, y, alpha=2)
    with pytest.raises(RuntimeError, match="bool tensor is not supported"):
        b - i   # torch's own
    assert torch.equal((B ^ B).to_dense(), b ^ b) and torch.equal((I - I).to_dense(), i - i)
    F = scorch.as_sparse(i.float(), "coo")
    with pytest.raises(TypeError, match="dtype= must be a floating point"):
        F.mean(dtype=torch.int64)
    for call in (lambda t: t.norm(dim=1), lambda t: torch.linalg.vector_norm(t, dtype=torch.float64),
                 lambda t: torch.nn.functional.normalize(t, dim=1)):
        with pytest.raises(RuntimeError):
            call(i)
        with pytest.raises(TypeError, match="expects a floating point or complex tensor"):
            call(I)
    torch.testing.assert_close(F.mean(1, dtype=torch.float64), i.float().mean(1, dtype=torch.float64))


def test_out_dtype_rules_follow_torch_per_op():
    x = torch.tensor([[1.5, 0.0, -2.0], [0.0, 3.25, 0.0]])
    A = scorch.as_sparse(x, "csr")
    for name, op in (("sum", lambda t, o: torch.sum(t, 1, out=o)), ("exp", lambda t, o: torch.exp(t, out=o)),
                     ("add", lambda t, o: torch.add(t, 1, out=o)), ("gt", lambda t, o: torch.gt(t, 0, out=o)),
                     ("cat", lambda t, o: torch.cat([t, t], out=o)), ("abs", lambda t, o: torch.abs(t, out=o)),
                     ("clamp", lambda t, o: torch.clamp(t, 0, 1, out=o)), ("mm", lambda t, o: torch.mm(t, x.t(), out=o)),
                     ("amax", lambda t, o: torch.amax(t, 1, out=o)), ("mean", lambda t, o: torch.mean(t, 1, out=o))):
        for dtype in (torch.float64, torch.int64, torch.float16):
            try:
                want = op(x, torch.empty(0, dtype=dtype))
            except (RuntimeError, TypeError):
                with pytest.raises(ValueError, match="out= has dtype"):
                    op(A, torch.empty(0, dtype=dtype))
                continue
            got = op(A, torch.empty(0, dtype=dtype))
            assert got.dtype == want.dtype and torch.equal(got, want), (name, dtype)
    v = torch.full((100000,), 0.1)
    got = torch.sum(scorch.as_sparse(v, "coo"), 0, out=torch.empty((), dtype=torch.float64))
    assert got.item() == torch.sum(v, 0, out=torch.empty((), dtype=torch.float64)).item()   # summed in float64


def test_negated_inputs_of_linear_and_vmap_over_values():
    W = scorch.as_sparse(torch.tensor([[1.0, 0.0, 2.0], [0.0, -1.0, 0.0]]), "csr")
    base = torch.randn(4, 3)
    xn = torch._neg_view(base)
    torch.testing.assert_close(torch.nn.functional.linear(xn, W), torch.nn.functional.linear(-base, W.to_dense()))
    d = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    A, x = scorch.as_sparse(d, "csr"), torch.arange(3.0)
    V = torch.stack([A.values(), 2 * A.values()])
    with pytest.raises(NotImplementedError, match="vmap over a SparseTensor's values"):
        torch.func.vmap(lambda v: A.with_values(v) @ x)(V)   # (it used the first values for every batch)
    got = torch.func.vmap(lambda xb: A @ xb)(torch.stack([x, 2 * x]))   # batching the dense operand is fine
    torch.testing.assert_close(got, torch.stack([d @ x, d @ (2 * x)]))


def test_public_arguments_named_in_their_errors():
    A = scorch.as_sparse(torch.eye(3), "csr")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    from scorch import datasets
    from scorch.nn import SparseAttention
    for call, exc, msg in [
            (lambda: scorch.formats.csf(2.0), TypeError, "ndim must be an int"),
            (lambda: scorch.formats.preset(None, 2), TypeError, "format name must be a str"),
            (lambda: A.to_dense("float64"), TypeError, "to_dense: dtype must be a torch.dtype"),
            (lambda: datasets.save_matrix_market(A, "unused.mtx", comment=3), TypeError, "comment must be a str"),
            (lambda: SparseAttention(8, 2, window=4)(torch.randn(6, 8), mask="causal"), TypeError,
             "mask must be a bool tensor or a sparse tensor")]:
        with pytest.raises(exc, match=msg):
            call()
    partial = scorch.schedule.create_schedule(model)["0.weight"].block(2, 2).set_format("csr", axis=(0, 1))
    assert "incomplete" in repr(partial)   # a repr never raises
    assert A.to_dense(torch.float64).dtype == torch.float64


def test_generators_and_layers_check_seeds_sizes_and_flags():
    """seed= must be an int (torch's manual_seed error came late, or never when unused); R-MAT's
    scale stops where its int64 edge keys would overflow; GNN layers' flags and GATConv's dropout
    are checked where given, naming the argument."""
    from scorch import datasets
    from scorch.nn import GATConv, GCNConv, SAGEConv, SparseAttention
    for call, msg in [(lambda: datasets.rmat(70, 10), "scale must be an int >= 1 and <= 31"),
                      (lambda: datasets.rmat(5, 10, seed=1.5), "rmat: seed must be an int"),
                      (lambda: datasets.uniform_random(10, 5, seed="a"), "uniform_random: seed must be an int"),
                      (lambda: datasets.power_law_graph(100, 50, seed=None), "power_law_graph: seed must be an int"),
                      (lambda: datasets.attention_mask(16, seed=2.0), "attention_mask: seed must be an int"),
                      (lambda: datasets.multi_hot(4, 8, 2, seed=[1]), "multi_hot: seed must be an int"),
                      (lambda: datasets.pruned_weight(4, 8, 0.5, seed=True), "pruned_weight: seed must be an int"),
                      (lambda: SparseAttention(8, 2, seed=0.5), "SparseAttention: seed must be an int"),
                      (lambda: GATConv(4, 4, dropout=1.5), "GATConv: dropout must be a probability"),
                      (lambda: GATConv(4, 4, concat="yes"), "GATConv: concat must be a bool"),
                      (lambda: GATConv(4, 4, negative_slope="x"), "GATConv: negative_slope must be a number"),
                      (lambda: GCNConv(4, 4, bias="x"), "GCNConv: bias must be a bool"),
                      (lambda: GCNConv(True, 4), "GCNConv: in_channels must be a positive int"),
                      (lambda: SAGEConv(4, 4, cached=1), "SAGEConv: cached must be a bool")]:
        with pytest.raises((ValueError, TypeError), match=msg):
            call()
    assert datasets.rmat(5, 10, seed=np.int64(3)).edge_index.shape == (2, 10)


def test_products_and_shapes_that_would_make_huge_dense_results(monkeypatch):
    """Small sparse inputs, results sparse or refused clearly (a 100000-long vector with one entry
    asked for 40 GB): outer products and a sparse * sparse broadcast are einsums, diagflat and
    matrix_power stay sparse, a dense result over the limit is refused up front, and a 3-d CSR-like
    result of a huge shape (unsqueeze(-1)) is COO rather than a position per outer coordinate."""
    g = torch.Generator().manual_seed(0)
    d = torch.randn(5, generator=g) * (torch.rand(5, generator=g) < 0.6)
    v = scorch.as_sparse(d, "coo")
    for got, want in [(torch.outer(v, v), torch.outer(d, d)), (v.unsqueeze(1) * v.unsqueeze(0), d[:, None] * d[None, :]),
                      (torch.diagflat(v, 1), torch.diagflat(d, 1))]:
        assert isinstance(got, scorch.SparseTensor)
        torch.testing.assert_close(got.to_dense(), want)
    m = torch.randn(4, 4, generator=g) * (torch.rand(4, 4, generator=g) < 0.5)
    M = scorch.as_sparse(m, "csr")
    for n in (0, 1, 2, 5):
        got = torch.linalg.matrix_power(M, n)
        assert isinstance(got, scorch.SparseTensor)
        torch.testing.assert_close(got.to_dense(), torch.linalg.matrix_power(m, n))
    N = 100_000
    big = scorch.from_coo([[5]], [2.0], (N,), format="coo")
    assert torch.outer(big, big).nnz == 1
    S = scorch.from_coo([[0, 5], [0, 1]], [1.0, 2.0], (N, 2), format="csr")
    with pytest.raises(NotImplementedError, match="dense result here, of 37.3 GiB"):
        torch.cdist(S, S)
    A = scorch.from_coo([[0, 5], [0, 5]], [1.0, 2.0], (N, N), format="csr")
    U = A.unsqueeze(-1)
    assert U.format == scorch.formats.preset("coo", 3) and U.nnz == 2 and tuple(U.shape) == (N, N, 1)


def test_out_arguments_of_the_less_common_ops():
    """out= on argmax / argmin / take / narrow_copy / nanmean (a bare TypeError), and a dense out=
    taking a sparse result (mm, tril, kron refused it); index_reduce_ into a SparseTensor in place."""
    x = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, float("nan")]])
    y = x.nan_to_num()   # (absent entries count as 0 in products, where a dense NaN * 0 is NaN)
    for t, f, dtype in ((y, lambda t, o: torch.argmax(t, 1, out=o), torch.int64),
                        (y, lambda t, o: torch.argmin(t, out=o), torch.int64),
                        (x, lambda t, o: torch.take(t, torch.tensor([1, 3]), out=o), x.dtype),
                        (x, lambda t, o: torch.narrow_copy(t, 1, 0, 2, out=o), x.dtype),
                        (x, lambda t, o: torch.nanmean(t, 1, out=o), x.dtype),
                        (y, lambda t, o: torch.mm(t, t.t(), out=o), x.dtype),
                        (x, lambda t, o: torch.tril(t, out=o), x.dtype),
                        (y, lambda t, o: torch.kron(t, t, out=o), x.dtype)):
        want, got = torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype)
        f(t, want)
        assert f(scorch.as_sparse(t, "csr"), got) is got
        torch.testing.assert_close(got, want, equal_nan=True)
    d = torch.tensor([[1.0, 0.0, 3.0], [0.0, 5.0, 0.0]])
    src = torch.tensor([[7.0, 7.0, 7.0]])
    D, S = d.clone(), scorch.as_sparse(d, "csr")
    D.index_reduce_(0, torch.tensor([0]), src, "amax")
    S.index_reduce_(0, torch.tensor([0]), src, "amax")
    assert torch.equal(S.to_dense(), D)


def test_review_of_the_new_ops_and_checks():
    """matrix_power(A, 1) is a new tensor and (A, 0) stays in the graph; outer / matrix_power take
    out=; argmax with out= on an input that requires grad goes through (its indices do not), and
    nanmean casts into out=; the dense-result check runs random ops on meta tensors (it drew from
    the global generator when device= was given)."""
    A = scorch.as_sparse(torch.tensor([[1.0, 2.0], [0.0, 3.0]]), "csr")
    M = torch.linalg.matrix_power(A, 1)
    M.mul_(10)
    assert torch.equal(A.to_dense(), torch.tensor([[1.0, 2.0], [0.0, 3.0]]))
    B = A.clone().requires_grad_()
    E = torch.linalg.matrix_power(B, 0)
    assert E.requires_grad
    E.to_dense().sum().backward()
    assert torch.equal(B.grad.to_dense(), torch.zeros(2, 2))
    for f, want in ((lambda o: torch.linalg.matrix_power(A, 2, out=o), A.to_dense() @ A.to_dense()),
                    (lambda o: torch.outer(A[0], A[1], out=o), torch.outer(A.to_dense()[0], A.to_dense()[1]))):
        o = torch.empty(0)
        assert f(o) is o and torch.equal(o, want)
    C = scorch.as_sparse(torch.tensor([[0.0, 2.0], [1.0, 0.0]]), "csr").requires_grad_()
    o = torch.empty(0, dtype=torch.int64)
    torch.argmax(C, 1, out=o)
    assert o.tolist() == [1, 0]
    o = torch.empty(0, dtype=torch.float64)
    torch.nanmean(A, 1, out=o)
    torch.testing.assert_close(o, torch.tensor([1.5, 1.5], dtype=torch.float64))
    torch.manual_seed(0)
    got = torch.randint_like(scorch.as_sparse(torch.eye(3) * 2, "csr"), 100, device="cpu")
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(got, torch.randint_like(torch.eye(3) * 2, 100, device="cpu")) and torch.equal(after, torch.rand(1))
