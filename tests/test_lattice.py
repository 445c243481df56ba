"""Merge lattices as data (no C), and elementwise programs over them (with C)."""

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.compiler.driver import evaluate
from scorch.compiler.lattice import lattice, needs_every_coordinate
from scorch.compiler.notation import Access, Neg, Op, Zero, accesses, without

A, B, X = Access(0, "ij"), Access(1, "ij"), Access(2, "ij")


def pts(points):
    return [(tuple(sorted(p.iterators)), str(p.expr)) for p in points]


def test_intersection_has_one_point():
    assert pts(lattice(Op("*", A, B), frozenset({0, 1}))) == [((0, 1), "(T0[i,j] * T1[i,j])")]


def test_union_has_three_points_largest_first():
    assert pts(lattice(Op("+", A, B), frozenset({0, 1}))) == [
        ((0, 1), "(T0[i,j] + T1[i,j])"), ((0,), "T0[i,j]"), ((1,), "T1[i,j]")]


def test_subtraction_negates_the_lone_right_operand():
    assert pts(lattice(Op("-", A, B), frozenset({0, 1})))[2] == ((1,), "-T1[i,j]")


def test_sparse_plus_dense_needs_every_coordinate():
    points = lattice(Op("+", A, X), frozenset({0}))
    assert pts(points) == [((0,), "(T0[i,j] + T2[i,j])"), ((), "T2[i,j]")]
    assert needs_every_coordinate(points)
    assert not needs_every_coordinate(lattice(Op("*", A, X), frozenset({0})))


def test_mixed_expression():
    e = Op("+", Op("*", A, B), X)  # A*B + X with A, B sparse
    assert [p[0] for p in pts(lattice(e, frozenset({0, 1})))] == [(0, 1), ()]


def test_without_simplifies():
    assert isinstance(without(Op("*", A, B), frozenset({1})), Zero)
    assert without(Op("+", A, B), frozenset({0})) == B
    assert without(Op("-", A, B), frozenset({0})) == Neg(B)
    assert without(Op("max", A, B), frozenset({1})) == Op("max", A, Zero())


needs_cc = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


def rnd(*shape, density=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * (torch.rand(*shape, generator=g) < density)


DENSE_OPS = {"+": torch.add, "-": torch.sub, "*": torch.mul, "max": torch.maximum, "min": torch.minimum}


@needs_cc
@pytest.mark.parametrize("op", list(DENSE_OPS))
@pytest.mark.parametrize("fa,fb", [("csr", "csr"), ("dcsr", "coo"), ("csc", "csr"), ("ell", "dcsc")])
def test_sparse_op_sparse(op, fa, fb):
    a, b = rnd(9, 7), rnd(9, 7, seed=1)
    Sa, Sb = scorch.as_sparse(a, fa), scorch.as_sparse(b, fb)
    out = evaluate("ij,ij->ij", [Sa, Sb], expr=Op(op, A, B))
    assert isinstance(out, scorch.SparseTensor)
    torch.testing.assert_close(out.to_dense(), DENSE_OPS[op](a, b))
    present = (a != 0) | (b != 0) if op != "*" else (a != 0) & (b != 0)
    assert out.nnz == int(present.sum())  # union (or intersection for *), no more


@needs_cc
@pytest.mark.parametrize("op", ["+", "-", "max"])
def test_sparse_op_dense_is_dense(op):
    a, x = rnd(6, 5), rnd(6, 5, density=1, seed=2)
    out = evaluate("ij,ij->ij", [scorch.as_sparse(a, "csr"), x], expr=Op(op, A, B))
    assert not isinstance(out, scorch.SparseTensor)
    torch.testing.assert_close(out, DENSE_OPS[op](a, x))


@needs_cc
def test_three_way_expression_and_vectors():
    a, b, c = rnd(12), rnd(12, seed=1), rnd(12, seed=2)
    ops = [scorch.as_sparse(v, "csr") for v in (a, b, c)]
    e = Op("+", Op("*", Access(0, "i"), Access(1, "i")), Access(2, "i"))
    out = evaluate("i,i,i->i", ops, expr=e)
    torch.testing.assert_close(out.to_dense(), a * b + c)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TORCH_OP = {"+": torch.add, "-": torch.sub, "*": torch.mul, "max": torch.maximum, "min": torch.minimum}


@st.composite
def expressions(draw, nops):
    def tree(depth):
        if depth == 0 or draw(st.booleans()):
            k = draw(st.integers(0, nops - 1))
            return Access(k, "ij"), k
        op = draw(st.sampled_from(list(TORCH_OP)))
        (a, _), (b, _) = tree(depth - 1), tree(depth - 1)
        return Op(op, a, b), None
    return tree(3)[0]


def dense_eval(e, xs):
    if isinstance(e, Access):
        return xs[e.operand]
    return TORCH_OP[e.op](dense_eval(e.a, xs), dense_eval(e.b, xs))


@needs_cc
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_elementwise_programs(data):
    nops = data.draw(st.integers(1, 3))
    e = data.draw(expressions(nops))
    shape = (data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6)))
    xs, ops = [], []
    for k in range(nops):
        x = rnd(*shape, density=data.draw(st.sampled_from([0.0, 0.3, 1.0])), seed=k) + 0.0
        xs.append(x)
        fmt = data.draw(st.sampled_from(["dense-tensor", "csr", "coo", "csc", "dcsr", "ell"]))
        ops.append(x if fmt == "dense-tensor" else scorch.as_sparse(x, fmt))
    used = sorted({a.operand for a in accesses(e)})
    eq = ",".join(["ij"] * nops) + "->ij"
    out = evaluate(eq, ops, expr=e)
    want = dense_eval(e, xs)
    got = out.to_dense() if isinstance(out, scorch.SparseTensor) else out
    torch.testing.assert_close(got, want)
    assert used  # the expression reads at least one operand
