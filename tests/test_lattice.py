"""Merge lattices as data (no C), and elementwise programs over them (with C)."""

import pytest
import torch

import scorch
from scorch.compiler import build
from scorch.compiler.driver import evaluate
from scorch.compiler.lattice import lattice, needs_every_coordinate
from scorch.compiler.notation import Access, Neg, Op, Zero, without

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
