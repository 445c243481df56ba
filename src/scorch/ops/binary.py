"""``+ - * /`` between a SparseTensor and a sparse or dense tensor, torch semantics.

* sparse op scalar, or sparse op sparse with the same pattern: the stored values
  (:mod:`.pointwise`, below autograd);
* sparse + sparse (different patterns): the union, sparse * sparse: the
  intersection -- compiled co-iteration (merge lattices);
* sparse * dense: sparse in the sparse operand's pattern; sparse +- dense: dense;
  sparse / dense: sparse when the divisor has no zeros (else 0/0 is NaN: dense);
* anything else (broadcasting a sparse operand, dense / sparse, sparse / sparse):
  computed densely -- the result is dense by definition.

All of it is differentiable (the compiled cases through :class:`_Elementwise`
or the einsum Function).
"""

from __future__ import annotations

import torch

from .._dispatch import accepts_out, as_torch_runs, broadcast_shapes, check_dense_size, densified, implements, write_out
from ..compiler import driver
from ..compiler.notation import Access, Op
from ..errors import ScorchTypeError, ScorchValueError
from ..interop import from_torch, is_torch_sparse
from ..tensor import _FORWARD_AD, SparseTensor, _layers_deep
from ._pattern import _lookup, in_pattern, project, same_pattern
from .einsum import _any_requires_grad, _functorch_level, _stand_in, _stood_in, einsum
from .pointwise import refuse_bool_subtraction

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _is_scalar(x) -> bool:
    return not isinstance(x, torch.Tensor) or (not isinstance(x, SparseTensor) and x.dim() == 0)


def _dtype(x) -> torch.dtype:
    """``x.dtype`` without a torch-function round trip for a SparseTensor (~2.5 us a call)."""
    return x._vals.dtype if isinstance(x, SparseTensor) else x.dtype


def binary(op: str, a, b, func, args, kwargs):
    if is_torch_sparse(a) or is_torch_sparse(b):   # A + torch.eye(n).to_sparse(): the SparseTensor's rules
        a, b = (from_torch(x) if is_torch_sparse(x) else x for x in (a, b))
        args, kwargs = (a, b), {}
    if _is_scalar(a) or _is_scalar(b) or (isinstance(a, SparseTensor) and isinstance(b, SparseTensor)
                                          and same_pattern(a, b)):
        return as_torch_runs(func, *args, **kwargs)
    shape = broadcast_shapes(a.shape, b.shape)
    sparse_ok = all(tuple(x.shape) == tuple(shape) for x in (a, b) if isinstance(x, SparseTensor))
    if not sparse_ok:
        if op == "*" and isinstance(a, SparseTensor) and isinstance(b, SparseTensor):
            return _broadcast_product(a, b, shape)
        return densified(func, args, kwargs)
    if op != "*" and ((_functorch_level() is not None and any(
            isinstance(x, torch.Tensor) and not isinstance(x, SparseTensor) and _layers_deep(x) for x in (a, b)))
            or (_FORWARD_AD._current_level >= 0 and any(isinstance(x, SparseTensor) and x._needs_grad()
                                                         for x in (a, b)))):
        return densified(func, args, kwargs)   # a dense operand torch.func tracks (vmap's batch), a forward-mode
        # tangent on a sparse one (the kernels carry none): torch's op on the dense copies
    if op == "/":
        if isinstance(b, SparseTensor) or bool((b == 0).any()):
            return densified(func, args, kwargs)  # x/0 at absent entries: the result is dense
        return _divided(a, b, shape)
    if any(_dtype(x).is_complex for x in (a, b)) and op in "+-":
        return _complex_sum(op, a, b, func)
    both_bool = _dtype(a) == torch.bool and _dtype(b) == torch.bool
    if op in "+*" and both_bool:   # torch's bool + / *: or / and (- with a bool operand: refused by _op),
        u8 = (a.to(torch.uint8), b.to(torch.uint8))                        # as 0 / 1 integers (no overflow)
        return binary(op, *u8, func, u8, {}).bool()
    idx = _LETTERS[:len(shape)]
    ops = [x if isinstance(x, SparseTensor) else x.expand(shape) for x in (a, b)]
    if _past_float64(ops):   # integers the kernels' float64 would round: torch's exact integers on the values
        return _exact_integers(op, ops, func, args, kwargs)
    if op == "*":
        return einsum(f"{idx},{idx}->{idx}", *ops)
    if torch.is_grad_enabled() and _any_requires_grad(ops):
        return _Elementwise.apply(op, idx, *ops)
    return _evaluate(op, idx, ops)


def _divided(a: SparseTensor, b: torch.Tensor, shape: tuple) -> SparseTensor:
    """``a / b`` by a dense ``b`` without zeros: ``a``'s pattern holding its values divided by ``b``
    read at their positions (0 / b elsewhere is 0), in torch's dtype and rounding (a product with
    ``1 / b`` rounded twice)."""
    dtype = _result_dtype(a, b)
    dtype = dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()
    at = project(b.expand(shape), a)
    at = at.masked_fill(at == 0, 1)   # b has no zeros: a 0 is an unused slot's (ELL's padding: 0 / 0 was NaN)
    return a.with_values(torch.div(a.values().to(dtype), at.to(dtype)))


def _complex_sum(op: str, a, b, func):
    """``a +- b`` with a complex operand (the kernels compute real values): the real and the imaginary
    parts each (a real operand's imaginary part: zeros in its pattern, so both parts have the
    same one), then joined."""
    def parts(x):
        if _dtype(x).is_complex:
            return x.real, x.imag
        zero = x.with_values(torch.zeros_like(x.values())) if isinstance(x, SparseTensor) else torch.zeros_like(x)
        return x, zero
    (ar, ai), (br, bi) = parts(a), parts(b)
    re, im = binary(op, ar, br, func, (ar, br), {}), binary(op, ai, bi, func, (ai, bi), {})
    if isinstance(re, SparseTensor) and isinstance(im, SparseTensor):
        return re.with_values(torch.complex(re.values(), im.values()))
    return torch.complex(re.to_dense() if isinstance(re, SparseTensor) else re,
                         im.to_dense() if isinstance(im, SparseTensor) else im)


def _broadcast_product(a: SparseTensor, b: SparseTensor, shape: tuple):
    """``a * b`` of SparseTensors where one broadcasts (``v[:, None] * v[None, :]``: an outer
    product): the einsum of the two with their broadcast size-1 dims dropped -- sparse, the
    product of the patterns, never the dense result."""
    n, idx = len(shape), _LETTERS[:len(shape)]
    terms, ops = [], []
    for x in (a, b):
        lead = n - x.dim()
        drop = [d for d in range(x.dim()) if x.shape[d] == 1 and shape[lead + d] != 1]
        for d in reversed(drop):
            x = x.squeeze(d)
        terms.append("".join(idx[lead + d] for d in range(len(drop) + x.dim()) if d not in drop))
        ops.append(x)
    return einsum(",".join(terms) + "->" + idx, *ops)


@implements(torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger)
@accepts_out
def outer(input, vec2):
    """The outer product: sparse when an operand is (an einsum; it ran densely)."""
    if input.dim() != 1 or vec2.dim() != 1:
        raise ScorchValueError(f"outer: expects two 1-d tensors, got shapes {tuple(input.shape)} and "
                               f"{tuple(vec2.shape)}")
    return einsum("i,j->ij", input, vec2)


def _past_float64(ops) -> bool:
    """Integer operands whose ``+ - *`` could pass 2^53, where the kernels' float64 rounds."""
    if any(x.dtype.is_floating_point or x.dtype.is_complex for x in ops):   # (bool: an integer 0 / 1 here)
        return False
    return driver.value_bound(ops) > 2 ** 53


def _exact_integers(op: str, ops, func, args, kwargs):
    """``a (op) b`` of integers by torch's own integer arithmetic on the values: sparse * dense on
    the sparse operand's pattern, sparse (op) sparse on the union of the patterns, sparse +- dense
    densely (a dense result by definition)."""
    sparse = [x for x in ops if isinstance(x, SparseTensor)]
    if len(sparse) == 1:
        if op != "*":
            return densified(func, args, kwargs)
        s = sparse[0]
        at = project(ops[1] if ops[0] is s else ops[0], s)
        return s._like(values=func(*((s._vals, at) if ops[0] is s else (at, s._vals))), nnz=s._stored)
    from .pointwise import _on_union_values   # (pointwise imports the einsum layer, which imports this module)
    union, on_union = _on_union_values(sparse if sparse[0] is not sparse[1] else sparse[:1])
    return union._like(values=func(on_union[id(ops[0])], on_union[id(ops[1])]), nnz=union._stored)


def _evaluate(op, idx, ops):
    return driver.elementwise(f"{idx},{idx}->{idx}", tuple(ops), Op(op, Access(0, idx), Access(1, idx)))


class _Elementwise(torch.autograd.Function):
    """a + b / a - b through the compiler; gradients read back at each sparse operand's pattern."""

    @staticmethod
    def forward(ctx, op, idx, a, b):
        ctx.op = op
        ctx.operands = (_stand_in(a), _stand_in(b))   # (+ and -: their gradients read patterns and shapes only)
        return _evaluate(op, idx, (a, b))

    @staticmethod
    def backward(ctx, grad):
        a, b = map(_stood_in, ctx.operands)
        out = [None, None]
        for x, sign, need in ((a, 1, ctx.needs_input_grad[2]), (b, -1 if ctx.op == "-" else 1,
                                                                   ctx.needs_input_grad[3])):
            if not need:
                out.append(None)
            elif isinstance(x, SparseTensor):
                out.append(in_pattern(x, (sign * project(grad, x)).to(x.dtype)))
            else:
                g = grad.to_dense() if isinstance(grad, SparseTensor) else grad
                out.append((sign * g).to(x.dtype))
        return tuple(out)


def _op(op: str, func):
    """The implementation of ``func(a, b, ...)`` (``alpha=`` scales b; ``rounding_mode=`` is dense
    by nature; ``out=`` gets the result as torch writes one, :func:`scorch._dispatch.write_out`)."""
    def impl(a, b, *, alpha=1, out=None, **kw):
        if op == "-":
            refuse_bool_subtraction((a, b))
        if out is not None:
            return write_out(func.__name__, impl(a, b, alpha=alpha, **kw), out, densify=True)
        if kw.get("rounding_mode") is not None:
            return densified(func, (a, b), dict(kw, **({"alpha": alpha} if alpha != 1 else {})))
        if alpha != 1 or isinstance(alpha, bool):
            b = _scaled(b, alpha, _result_dtype(a, b), func.__name__)
        return binary(op, a, b, func, (a, b), {})
    return impl


def _result_dtype(a, b) -> torch.dtype:
    """torch's result dtype of ``a (op) b`` (numbers and 0-d tensors promoting as torch's do)."""
    proxy = lambda t: torch.empty(1, dtype=t.dtype) if isinstance(t, SparseTensor) else t  # noqa: E731
    return torch.result_type(proxy(a), proxy(b))


def _scaled(b, alpha, dtype: torch.dtype, name: str):
    """``alpha * b`` in the result's ``dtype`` (alpha takes no part in the promotion, as in torch)."""
    if not dtype.is_floating_point and not dtype.is_complex and isinstance(alpha, float):
        raise ScorchTypeError(f"{name}: for integral input tensors, argument alpha must not be a floating point "
                              f"number, got alpha={alpha!r}")
    if isinstance(alpha, bool) and dtype != torch.bool:
        raise ScorchTypeError(f"{name}: a boolean alpha is only supported for bool results, got alpha={alpha!r} "
                              f"for a {dtype} result")
    if isinstance(b, torch.Tensor):   # in the result's dtype first: an int8 b times 2 wrapped before promoting
        return (b.to(dtype) * alpha).to(dtype)   # (a bool b times 2: bool, as torch's add)
    scaled = b * alpha
    return bool(scaled) if dtype == torch.bool else scaled


for _sym, _func, _names in (("+", torch.add, ("add",)), ("-", torch.sub, ("sub", "subtract")),
                            ("*", torch.mul, ("mul", "multiply")), ("/", torch.div, ("div", "divide", "true_divide"))):
    _impl = _op(_sym, _func)
    implements(*[getattr(torch, n) for n in _names], *[getattr(torch.Tensor, n) for n in _names])(_impl)
    _dunder = {"+": "add", "-": "sub", "*": "mul", "/": "truediv"}[_sym]
    implements(getattr(torch.Tensor, f"__{_dunder}__"))(lambda a, b, _i=_impl: _i(a, b))
    if _sym != "/":
        implements(getattr(torch.Tensor, f"__r{_dunder}__"))(lambda a, b, _i=_impl: _i(b, a))  # b (op) a


@implements(torch.Tensor.__rtruediv__)
def _rtruediv(a, b):
    """``b / a`` (``a.__rtruediv__(b)``, ``__rdiv__``).  For a number ``b``: torch's ``a.reciprocal()
    * b`` (a float16 ``a`` under 65520 / a: the number is not rounded to ``a``'s dtype first; dense:
    1 / 0 at the absent entries).  For a tensor ``b`` -- sparse, torch.sparse or dense -- the true
    division: a sparse ``b`` times the dense reciprocal keeps only ``b``'s pattern, which made the
    absent 0 / 0 entries 0 instead of NaN."""
    if isinstance(b, torch.Tensor):
        return torch.div(b, a)
    return torch.reciprocal(a) * b


@implements(torch.equal, torch.Tensor.equal)
def equal(input, other):
    """``torch.equal``: False for tensors of different shapes (they raised: no broadcasting here)."""
    if tuple(input.shape) != tuple(other.shape):
        return False
    return as_torch_runs(torch.equal, input, other)


@implements(torch.allclose, torch.Tensor.allclose)
def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``torch.allclose``; two SparseTensors of one shape compare at their stored positions only
    (elsewhere both are 0), no dense copy; with a dense operand, on the dense values."""
    if isinstance(input, SparseTensor) and isinstance(other, SparseTensor) and input.shape == other.shape:
        coords = torch.cat([input.coo()[0], other.coo()[0]], 1)
        a, b = _lookup(input, coords), _lookup(other, coords)
        return bool(torch.isclose(a, b, rtol, atol, equal_nan).all())
    check_dense_size("allclose compares the dense values, and", [input, other])
    a, b = (t.to_dense() if isinstance(t, SparseTensor) else t for t in (input, other))
    return torch.allclose(a, b, rtol, atol, equal_nan)
