"""Pointwise ops on SparseTensors, at the aten level (below autograd).

Every aten op tagged *pointwise* whose sparse operands share one pattern (the
others being scalars or 0-d tensors) runs on the stored values:

* out of place, when ``f(0, ...) == 0`` (``relu``, ``neg``, ``x * 2``, ``sqrt``,
  ``threshold_backward``...): a SparseTensor with the same pattern;
  otherwise (``exp``, ``x + 1``) the result is dense by definition, computed densely;
* in place (``add_``, ``mul_``, ``addcmul_``, ``lerp_``...): the stored values
  are updated -- what optimizers need to update a sparse ``nn.Parameter``; a
  scalar operand leaves the pattern as it is (``denom.add_(eps)``: where
  ``f(0) != 0`` the absent entries stay absent), while the absent entries that
  tensor operands make nonzero join the pattern (as an assignment's do).

Because this sits below autograd, torch's own derivative formulas (themselves
pointwise aten ops) run on SparseTensors too, and gradients keep the pattern.
"""

from __future__ import annotations

import functools
import math

import torch

from .._dispatch import (broadcast_shapes, check_dense_size, dense_fallback, densified, implements, implements_aten,
                         leaves, map_sparse, register_pointwise, write_out)
from ..interop import is_torch_sparse, torch_sparse_as_ours
from ..errors import InternalError, NotSupportedError, ScorchTypeError, ScorchValueError
from ..format import Format, dense
from ..tensor import SparseTensor
from .._memo import remember
from ._pattern import project, same_pattern, stored
from .assign import _densified, mask_points, store_at, stored_hits


def _is_scalar(a) -> bool:
    return not isinstance(a, torch.Tensor) or (not isinstance(a, SparseTensor) and a.dim() == 0)


def _zero_preserving(func, args, kwargs) -> bool:
    """Whether ``func`` gives 0 where every SparseTensor argument is 0 (the others as given),
    remembered per op and arguments when those are scalars (a 0-d op and three checks: ~20 us)."""
    try:
        key = (func, _scalar_key(args), _scalar_key(kwargs))
    except (_NotScalar, TypeError):  # a dense tensor or an unhashable argument: computed every time
        return _computes_zero(func, args, kwargs)
    found = _ZERO_PRESERVING.get(key)
    if found is None:
        found = remember(_ZERO_PRESERVING, key, _computes_zero(func, args, kwargs))
    return found


_ZERO_PRESERVING: dict = {}


class _NotScalar(Exception):
    pass


def _scalar_key(x):
    """A hashable stand-in for an op's arguments: a SparseTensor by its value type, a scalar by
    its type and value, containers element-wise; any other tensor raises :class:`_NotScalar`."""
    t = type(x)
    if t is tuple or t is list:
        return (t, *[_scalar_key(a) for a in x])
    if t is dict:
        return (dict, *sorted((k, _scalar_key(v)) for k, v in x.items()))
    if isinstance(x, SparseTensor):
        return (SparseTensor, x._vals.dtype)
    if isinstance(x, torch.Tensor):
        raise _NotScalar
    hash(x)  # an unhashable argument: not remembered
    return (t, x)


def _computes_zero(func, args, kwargs, shape=()) -> bool:
    """Whether ``func`` gives 0 (not NaN) with every SparseTensor argument zeros of ``shape``."""
    zargs, zkwargs = map_sparse(lambda a: torch.zeros(shape, dtype=a._vals.dtype), args, kwargs)
    try:
        z = func(*zargs, **zkwargs)
    except (RuntimeError, TypeError):
        return False
    z = z[0] if isinstance(z, (tuple, list)) else z
    return isinstance(z, torch.Tensor) and not bool(torch.isnan(z).any()) and bool((z == 0).all())


def _zero_of(a: SparseTensor) -> torch.Tensor:
    """A zero standing for ``a``: of its dims (all 1, broadcasting), so that it promotes as the
    dimensioned tensor ``a`` is (a 0-d complex64 zero beside a float16 tensor made ComplexHalf)."""
    return torch.zeros((1,) * a.dim(), dtype=a._vals.dtype)


def _values_of(a: SparseTensor) -> torch.Tensor:
    return a._vals


_SUBTRACTIONS = (torch.ops.aten.sub, torch.ops.aten.sub_, torch.ops.aten.rsub)


def refuse_bool_subtraction(operands) -> None:
    """torch refuses ``-`` with a bool tensor (a ValueError here: a TypeError raised inside ``__sub__``
    becomes Python's "unsupported operand" message)."""
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in operands):
        raise ScorchValueError("sub: subtraction, the `-` operator, with a bool tensor is not supported (as torch's); "
                               "to invert a mask use `~` or logical_not()")


@register_pointwise
def pointwise(func, args, kwargs):
    mutable = func._schema.is_mutable
    flat = leaves(args, kwargs)
    if func.overloadpacket in _SUBTRACTIONS:
        refuse_bool_subtraction(flat)
    if any(is_torch_sparse(a) for a in flat):   # beside a SparseTensor, a torch.sparse tensor counts as one
        args, kwargs = torch_sparse_as_ours(args, kwargs)
        flat = leaves(args, kwargs)
    outs = [a.name for a in func._schema.arguments if a.is_out] if mutable else ()
    if outs and all(n in kwargs for n in outs):   # an out= overload (frexp's: mantissa=, exponent=): the op,
        kw = dict(kwargs)                          # then its result written into the outs
        out = tuple(kw.pop(n) for n in outs)
        return write_out(func.overloadpacket.__name__, func.overloadpacket(*args, **kw),
                         out[0] if len(out) == 1 else out, densify=True)
    if mutable and not isinstance(args[0], SparseTensor):
        return _into_dense(func, args, kwargs)
    sparse = [a for a in flat if isinstance(a, SparseTensor)]
    ref = sparse[0]
    shared = all(same_pattern(ref, s) for s in sparse[1:]) and all(
        _is_scalar(a) for a in flat if isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor))
    if not shared and func.overloadpacket is torch.ops.aten.mul and not mutable and len(sparse) == 1:
        # sparse * dense (autograd's grad * f'(x)): zero wherever the sparse operand is.
        dense = next(a for a in args if isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor))
        if broadcast_shapes(dense.shape, ref.shape) == tuple(ref.shape):
            return ref._like(values=ref._vals * project(dense.expand(ref.shape), ref), nnz=ref._stored)
    if not shared and not mutable and len(sparse) == 2 and func in _CO_ITERATED \
            and args[0] is sparse[0] and args[1] is sparse[1]:
        return _co_iterated(func, args, kwargs)
    if not shared and not mutable and len(sparse) == 1 and _zero_beside_small_dense(func, args, kwargs, ref):
        at = stored(ref)   # prelu's per-channel weight, a clamp's per-column bound: read at the entries
        vargs, vkwargs = map_sparse(_values_of, *_dense_at(args, kwargs, ref, at))
        return ref._like(values=func(*vargs, **vkwargs), nnz=ref._stored)
    if not shared and mutable and args[0] is ref and func in _ADDC and isinstance(args[1], SparseTensor) \
            and not all(same_pattern(ref, s) for s in sparse[1:]):
        return _addc_other_patterns(func, args, kwargs)
    if not shared and mutable and args[0] is ref:
        if not all(same_pattern(ref, s) for s in sparse[1:]):   # another pattern: read as a dense operand
            check_dense_size(f"{func.overloadpacket.__name__} in place reads a SparseTensor of another pattern "
                             "densely, and", sparse[1:])
            args, kwargs = map_sparse(lambda a: a if a is ref or same_pattern(ref, a) else a.to_dense(),
                                      args, kwargs)
        return _in_place_with_dense(func, args, kwargs, ref)
    if not shared:
        if mutable:
            raise NotSupportedError(
                f"{func.overloadpacket.__name__}: in place on SparseTensors needs operands with the same "
                "pattern (or dense ones, or scalars); use the out-of-place op")
        if any(isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor) and not _is_scalar(a) for a in flat):
            # sparse + dense (autograd summing a sparse and a dense gradient): dense by definition
            return densified(func, args, kwargs)
        if any(s._shape != ref._shape for s in sparse):
            return dense_fallback(func, args, kwargs)  # a sparse operand broadcast: dense by definition
        return _on_union(func, args, kwargs, sparse)
    vargs, vkwargs = map_sparse(_values_of, args, kwargs)
    if mutable:
        func(*vargs, **vkwargs)
        _clear_padding(args[0])
        return args[0]
    if not _zero_preserving(func, args, kwargs):
        return densified(func, args, kwargs)  # f(0) != 0: the result is dense by definition
    out = func(*vargs, **vkwargs)
    if isinstance(out, tuple):   # frexp: (mantissa, exponent), each in the pattern, torch's named tuple
        parts = tuple(ref._like(values=o, nnz=ref._stored) for o in out)
        return parts if type(out) is tuple else type(out)(parts)
    if out.shape == ref._vals.shape and out.is_contiguous():
        return ref._on_pattern(out)   # the pattern as it is: nothing to check again
    return ref._like(values=out, nnz=ref._stored)


_ADDC = {torch.ops.aten.addcmul_.default: torch.mul, torch.ops.aten.addcdiv_.default: torch.div}


def _addc_other_patterns(func, args, kwargs):
    """``x.addcmul_(t1, t2, value=v)`` / ``addcdiv_`` with a sparse ``t1`` of another pattern than
    ``x``'s (an optimizer's state after its parameter's pattern changed): ``x += v * t1 (op) t2`` with
    the product or quotient taken on ``t1``'s entries -- an absent numerator contributes 0, not the
    0 / 0 a dense read of a sparse denominator would give -- and added as ``add_`` adds another
    pattern (entries it makes nonzero join ``x``'s)."""
    self, t1, t2 = args[:3]
    value = args[3] if len(args) > 3 else kwargs.get("value", 1)
    common = torch.promote_types(torch.promote_types(self.dtype, t1.dtype), t2.dtype)   # torch's, not t1's
    t1, t2 = t1.to(common), (t2.to(common) if isinstance(t2, torch.Tensor) else t2)
    if _ADDC[func] is torch.mul:
        update = t1 * t2
    else:
        update = t1._like(values=t1._vals / project(t2, t1), nnz=t1._stored)
    return torch.ops.aten.add_.Tensor(self, update, alpha=value)


def _zero_beside_small_dense(func, args, kwargs, ref: SparseTensor) -> bool:
    """Whether ``func`` of the one SparseTensor ``ref`` and dense operands no larger than its
    stored values (broadcast to its shape: a per-channel weight) is 0 wherever ``ref`` is, for
    every value of those operands (checked on them: ``prelu(0, w) == 0``)."""
    dense = [a for a in leaves(args, kwargs) if isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor)
             and not _is_scalar(a)]
    if sum(d.numel() for d in dense) > ref._vals.numel() or any(
            broadcast_shapes(d.shape, ref.shape) != tuple(ref.shape) for d in dense):
        return False
    return _computes_zero(func, args, kwargs, broadcast_shapes(*(d.shape for d in dense)) if dense else ())


def _dense_at(args, kwargs, ref: SparseTensor, at):
    """``args`` / ``kwargs`` with every non-scalar dense tensor replaced by its values at ``ref``'s
    stored entries (``at``: :func:`stored` of ``ref``)."""
    def pick(a):
        if isinstance(a, (list, tuple)):
            return type(a)(pick(x) for x in a)
        if isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor) and not _is_scalar(a):
            return project(a.expand(ref.shape), ref, at)
        return a
    return pick(args), {k: pick(v) for k, v in kwargs.items()}


def _on_union(func, args, kwargs, sparse):
    """``func`` over SparseTensors of one shape and different patterns (``maximum(A, B)``,
    ``where(A > 0, A, B)``, ``atan2``, ``logical_and``, ``A < B``...), the other arguments
    scalars: where ``f(0, ..., 0) == 0`` each operand's values are read at the union of the
    patterns (its zeros where it stores nothing) and ``func`` runs on those, giving a
    SparseTensor in the union's pattern -- the pattern and format ``A + B`` has; otherwise the
    result is dense by definition, computed densely."""
    if not _zero_preserving(func, args, kwargs):
        check_dense_size(f"{func.overloadpacket.__name__} gives a dense result here, and", sparse)
        return densified(func, args, kwargs)
    union, on_union = _on_union_values(list(dict.fromkeys(sparse)))   # an operand passed twice counts once
    vargs, vkwargs = map_sparse(lambda a: on_union[id(a)], args, kwargs)
    out = func(*vargs, **vkwargs)
    return union._like(values=out, nnz=union._stored)


def _on_union_values(sparse: list):
    """The union of the patterns of ``sparse`` (one shape; a SparseTensor) and each operand's
    values at its entries (``{id(operand): values}``, 0 where the operand stores nothing).  One
    compiled union (``+``) per operand, the operand holding its positions + 1 (exact in float64)
    and the others zeros: every union has the same pattern, and its values say where each of the
    operand's values goes -- no sorting or key search."""
    from .binary import _evaluate   # binary builds on the einsum layer, which imports this module
    idx = "abcdefghijklmnopqrstuvwxyz"[:len(sparse[0]._shape)]
    union, out = None, {}
    with torch.no_grad():
        for s in sparse:
            u = None
            for t in sparse:
                n = t._vals.numel()
                ids = torch.arange(1, n + 1, dtype=torch.float64) if t is s else torch.zeros(n, dtype=torch.float64)
                part = t._like(values=ids, nnz=t._stored)
                u = part if u is None else _evaluate("+", idx, (u, part))
            if union is None:
                union = u
            elif not same_pattern(union, u):
                raise InternalError("pointwise: the unions of one set of patterns differ")
            out[id(s)] = torch.cat([s._vals.new_zeros(1), s._vals])[u._vals.long()]
    return union, out


_CO_ITERATED = {torch.ops.aten.add.Tensor: torch.add, torch.ops.aten.sub.Tensor: torch.sub,
                 torch.ops.aten.mul.Tensor: torch.mul}


def _co_iterated(func, args, kwargs):
    """sparse +- * sparse with different patterns reached at the aten level (``torch.diff``, a
    composite's arithmetic): the union / intersection kernels of :mod:`.binary`.  Autograd has
    recorded the op already: no second graph."""
    from .binary import binary   # binary builds on the einsum layer, which imports this module
    a, b = args[0], args[1]
    alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
    op = {torch.add: "+", torch.sub: "-", torch.mul: "*"}[_CO_ITERATED[func]]
    with torch.no_grad():
        b = b * alpha if alpha != 1 else b
        return binary(op, a, b, _CO_ITERATED[func], (a, b), {})


def _in_place_with_dense(func, args, kwargs, x: SparseTensor):
    """An in-place op on a SparseTensor whose other operands are dense tensors (broadcastable to
    it) or SparseTensors of its pattern -- ``A.mul_(mask)``, an optimizer's
    ``param.addcdiv_(grad, denom)`` with a dense ``denom``: the stored values updated, each dense
    operand read at the stored positions, when the op leaves every absent entry 0 (checked on
    the dense operands: 0 * mask, 0 / denom); where it would not (``A.add_(ones)``, a 0 / 0), the
    entries it makes nonzero join the pattern first (explicit zeros, then the op)."""
    name = func.overloadpacket.__name__
    for a in leaves(args, kwargs):
        if isinstance(a, torch.Tensor) and not isinstance(a, SparseTensor) and not _is_scalar(a) \
                and broadcast_shapes(a.shape, x.shape) != tuple(x.shape):
            raise NotSupportedError(f"{name}: in place on a SparseTensor of shape {tuple(x.shape)} needs dense "
                                    f"operands broadcastable to it, got shape {tuple(a.shape)}")
    entries = stored(x)   # the stored coordinates, read once for every dense operand and the check
    bad = _absent_nonzero(func, args, kwargs, x, entries)
    if bad is None:
        raise NotSupportedError(f"{name}: in place on a SparseTensor with dense operands is not supported for this "
                                "op; use the out-of-place op")
    if bad.numel():   # the op makes entries x does not store nonzero (Adam's state after its parameter grew):
        from .assign import store_zeros_at   # they join the pattern, as a write's do (zeros, then the op)
        if torch.is_grad_enabled() and x.requires_grad:
            raise NotSupportedError(f"{name}: in place on a SparseTensor that requires grad would add entries to "
                                    "its pattern, which autograd does not record; use the out-of-place op")
        store_zeros_at(x, bad, name)
        entries = stored(x)

    def at(a):
        if isinstance(a, SparseTensor):   # x's pattern may have grown: another operand of its old pattern
            if a is x or same_pattern(a, x):   # is read at the new entries too (0 there: 1 / 0 is inf, as dense)
                return a._vals
            return project(a._like(nnz=a._stored), x, entries)   # (the wrapper: untracked, below autograd)
        return project(a.expand(x.shape), x, entries) if isinstance(a, torch.Tensor) and not _is_scalar(a) else a
    func(*[at(a) for a in args], **{k: at(v) for k, v in kwargs.items()})
    _clear_padding(x, entries)
    return x


def _clear_padding(x: SparseTensor, entries=None) -> None:
    """After an in-place write into all of ``x._vals``: its unused slots (ELL's padding, which
    a norm or a dot product of the values would count) hold 0 again."""
    if x._stored < x._vals.numel():
        keep = torch.zeros(x._vals.numel(), dtype=torch.bool)
        keep[(entries if entries is not None else stored(x))[1]] = True
        x._vals.masked_fill_(~keep, 0)


def _absent_nonzero(func, args, kwargs, x: SparseTensor, entries) -> torch.Tensor | None:
    """The coordinates (``ndim x k``) of the entries ``x`` does not store where the out-of-place
    form of in-place ``func`` gives nonzero or NaN: evaluated with the sparse operands (all of
    ``x``'s pattern) as zeros against the dense ones -- as much work as the dense operands hold.
    A NaN that only the other sparse operands' absent zeros make (a 0 / 0: RMSprop's
    ``param.addcdiv_(grad, avg)`` with a dense gradient, 0 where ``param`` stores nothing) leaves
    the entry absent, as ``A.div_(B)`` leaves its absent 0 / 0 entries 0 -- found by a second
    evaluation with those operands as ones.  None when there is no out-of-place form to ask."""
    packet = getattr(torch.ops.aten, func.overloadpacket.__name__[:-1], None)
    if packet is None:
        return None
    zargs, zkwargs = map_sparse(_zero_of, args, kwargs)
    try:   # the packet picks the overload (an in-place op's overload names need not match)
        z = packet(*zargs, **zkwargs)
        nan = torch.isnan(z)
        bad = (z != 0) | nan   # the dense operands' shape: broadcast, each counts that often
        if bool(nan.any()) and any(isinstance(a, SparseTensor) and a is not x for a in leaves(args, kwargs)):
            oargs, okwargs = map_sparse(lambda a: _zero_of(a) if a is x else _zero_of(a) + 1, args, kwargs)
            bad &= ~(nan & (packet(*oargs, **okwargs) == 0))
    except (RuntimeError, TypeError):
        return None
    total = int(bad.sum()) * (math.prod(x._shape) // max(bad.numel(), 1))
    if total == int(project(bad.expand(x.shape), x, entries).sum()):   # every such position stored
        return torch.zeros((len(x._shape), 0), dtype=torch.int64)
    check_dense_size(f"{func.overloadpacket.__name__} in place adds entries to a SparseTensor's pattern, and", [x])
    return bad.expand(x.shape).nonzero().t()


_SCATTER_ADD = {torch.ops.aten.add_.Tensor: 1, torch.ops.aten.sub_.Tensor: -1}


def _into_dense(func, args, kwargs):
    """An in-place op writing into a dense tensor (``dense += A``, an optimizer's
    ``param.add_(sparse_grad, alpha=-lr)``): dense by definition.  ``add_`` / ``sub_`` of a
    SparseTensor of the same shape and dtype add its stored values in place (no dense copy)."""
    dst = args[0]
    other = args[1] if len(args) > 1 else kwargs.get("other")
    sign = _SCATTER_ADD.get(func)
    if sign is not None and isinstance(other, SparseTensor) and other.shape == dst.shape \
            and other.dtype == dst.dtype:
        alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        coords, where = stored(other)
        vals = other._vals[where]
        return dst.index_put_(tuple(coords), vals if sign * alpha == 1 else vals * (sign * alpha), accumulate=True)
    check_dense_size(f"{func.overloadpacket.__name__} writes into a dense tensor, and", leaves(args, kwargs))
    return densified(func, args, kwargs)


# ------------------------------------------------------------------ non-pointwise ops the optimizers and autograd use

def _on_cpu_only(name: str, device) -> None:
    """A ``device=`` given to a ``*_like`` / ``new_*`` of a SparseTensor: SparseTensors and the
    results made beside them live on the CPU (scorch's kernels run there), so another device is
    refused rather than ignored (the result came back on the CPU)."""
    if device is not None and torch.device(device).type != "cpu":
        raise NotSupportedError(f"{name}: device={device} is not supported for a SparseTensor, which lives on the "
                                f"CPU (scorch's kernels run there); omit device= or pass 'cpu', or call {name} on "
                                "x.to_dense() moved to that device")


def _dense_of_shape(make):
    """``ones_like`` and kin: the same value everywhere, or random numbers -- a dense tensor of
    ``x``'s shape by definition (zeros_like keeps the pattern instead), within
    ``config.dense_fallback_max_bytes`` as every densifying op (a hypersparse ``x`` has a huge shape)."""
    def like(x, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None, **kwargs):
        name = f"{make.__name__}_like"
        if layout not in (None, torch.strided):   # torch cannot make these of a sparse layout either
            raise ScorchValueError(f"{name}: layout={layout} is not supported for these values "
                                   f"(they fill every position); expected None or torch.strided")
        _on_cpu_only(name, device)
        check_dense_size(f"{name} gives a dense result, and", [x])
        return make(x.shape, *args, dtype=x.dtype if dtype is None else dtype, **kwargs)
    return like


for _op, _make in ((torch.ops.aten.ones_like.default, torch.ones), (torch.ops.aten.full_like.default, torch.full),
                   (torch.ops.aten.rand_like.default, torch.rand), (torch.ops.aten.randn_like.default, torch.randn)):
    implements_aten(_op)(_dense_of_shape(_make))


@implements_aten(torch.ops.aten.zeros_like.default)
def _zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """Zeros in the same pattern: the same dense value as torch's, and it stays sparse; with a
    ``layout=`` of torch's (``torch.strided``, ``torch.sparse_coo``...), torch's zeros of it."""
    _on_cpu_only("zeros_like", device)
    if layout is not None:
        return torch.zeros(x.shape, dtype=x.dtype if dtype is None else dtype, layout=layout)
    return x._like(values=torch.zeros_like(x._vals, dtype=dtype), nnz=x._stored)


@implements_aten(torch.ops.aten.new_zeros.default)
def _new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    """``x.new_zeros(size)``: nothing stored, in ``x``'s format adapted to ``size`` (as a sparse
    torch tensor's ``new_zeros`` stays sparse)."""
    _on_cpu_only("new_zeros", device)
    from .shape import rebuild
    return rebuild(x._format, tuple(size), torch.zeros((len(size), 0), dtype=torch.int64),
                   torch.zeros(0, dtype=x.dtype if dtype is None else dtype), x.index_dtype)


def _unset(make, name: str):
    """``empty_like`` / ``new_empty``: ``make``'s zeros (in the pattern / nothing stored), marked
    *unset* -- every entry is the writer's, the absent ones too.  So the fill that such a tensor
    usually gets next (``empty_like(y).fill_(s).sub_(y)`` is how torch's C++ computes ``s - y``
    inside composite ops, e.g. ``hinge_embedding_loss``) gives ``s`` everywhere, not only at the
    stored positions as a fill of a pattern does (an optimizer's or ``nn.init``'s)."""
    def empty(*args, **kwargs):
        _on_cpu_only(name, kwargs.get("device"))   # (keyword-only in both ops' schemas)
        out = make(*args, **kwargs)
        if type(out) is SparseTensor:   # (layout=torch.strided gave torch's own tensor)
            out._unset = True
        return out
    return empty


implements_aten(torch.ops.aten.empty_like.default)(_unset(_zeros_like, "empty_like"))
implements_aten(torch.ops.aten.new_empty.default)(_unset(_new_zeros, "new_empty"))


@implements_aten(torch.ops.aten.new_ones.default)
def _new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    _on_cpu_only("new_ones", device)
    return torch.ones(tuple(size), dtype=x.dtype if dtype is None else dtype)


@implements_aten(torch.ops.aten.new_full.default)
def _new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    _on_cpu_only("new_full", device)
    return torch.full(tuple(size), fill_value, dtype=x.dtype if dtype is None else dtype)


@implements_aten(torch.ops.aten.zero_.default)
def _zero_(x):
    x._vals.zero_()
    return x


@implements_aten(torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor)
def _fill_(x, value):
    """The stored values (``nn.init.ones_(sparse_weight)``: the pattern is fixed); an unset
    tensor (:func:`_unset`) takes ``value`` everywhere -- every position stored.  ``value`` a
    number or a 0-d tensor."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ScorchValueError(f"fill_: only supports a 0-dimension value tensor, got {value.dim()} dims")
        value = value.item()
    if value != 0:
        _every_position_if_unset(x)
    x._vals.fill_(value)
    _clear_padding(x)
    return x


def _every_position_if_unset(x: SparseTensor, only_if_empty: bool = False) -> None:
    """An unset tensor (:func:`_unset`) about to be written everywhere (a fill) stores every
    position: a dense format, its values to be written.  ``only_if_empty`` (a random fill): only
    when it stores nothing (``new_empty``); ``empty_like(w).uniform_()`` fills ``w``'s pattern,
    as a random fill of a pattern does (``nn.init.trunc_normal_`` of a sparse weight builds on it)."""
    if only_if_empty and x._stored:
        return
    if getattr(x, "_unset", False) and x._stored < math.prod(x._shape):
        n = len(x._shape)
        check_dense_size("filling every position of an empty_like / new_empty SparseTensor stores them all, and",
                         [x])   # (a 60000 x 60000 DCSR of 2 entries: 3.6e9 positions, unchecked)
        x._restore(SparseTensor(Format([dense] * n), x._shape, (None,) * n, (None,) * n,
                               torch.zeros(math.prod(x._shape), dtype=x.dtype)))


__all__ = ["same_pattern", "pointwise"]


@implements(torch.nn.functional.dropout, torch.dropout)
def dropout(input, p=0.5, training=True, inplace=False):
    """Dropout on the stored values: the pattern is kept, dropped values become 0."""
    if not 0 <= p <= 1:
        raise ScorchValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0:
        return input
    keep = torch.empty_like(input._vals).bernoulli_(1 - p)
    if inplace:   # an in-place product autograd records (and refuses through a view, as any write)
        return input.mul_(input._like(values=keep / (1 - p) if p < 1 else keep * 0, nnz=input._stored))
    values = input.values() * keep / (1 - p) if p < 1 else input.values() * 0
    return input.detach().with_values(values) if values.requires_grad else input._like(values=values, nnz=input._stored)


# ------------------------------------------------------------------ _foreach_* (optimizers' foreach=True, clip_grad_norm_)

def _foreach(name: str, *args, **kwargs):
    """``torch._foreach_op(tensors, ...)`` (aten op ``name``) over a list holding SparseTensors:
    ``op`` on each element (its list arguments -- tensors, scalars -- taken element-wise), each
    through its own sparse implementation: an in-place one updates the stored values (such an
    update used to go into a dense copy and be lost)."""
    base = name[len("_foreach_"):]
    if base == "norm":
        op = torch.ops.aten.linalg_vector_norm
    elif hasattr(torch.ops.aten, base):
        op = getattr(torch.ops.aten, base)
    else:   # maximum_ / minimum_: no in-place aten op -- the result copied in
        op = functools.partial(_copied_in, getattr(torch.ops.aten, base[:-1]))
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))
    args, kwargs = list(args), dict(kwargs)
    if base.rstrip("_") in ("addcmul", "addcdiv") and len(args) > 3:   # its value: keyword-only in the op
        value = args.pop(3)   # a number, a list of them, or a 1-d tensor of them (one per element)
        kwargs["value"] = value.tolist() if isinstance(value, torch.Tensor) and value.dim() == 1 else value
    if base == "norm" and len(args) > 2:
        kwargs["dtype"] = args.pop(2)

    def pick(a, i):
        return a[i] if isinstance(a, (list, tuple)) else a
    outs = [op(*[pick(a, i) for a in args], **{k: pick(v, i) for k, v in kwargs.items()}) for i in range(n)]
    return None if name.endswith("_") else outs


def _copied_in(op, x, *args, **kwargs):
    return torch.ops.aten.copy_(x, op(x, *args, **kwargs))


for _name in sorted({n[len("aten::"):].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                     if n.startswith("aten::_foreach_")}):   # (dir(torch.ops.aten) lists loaded ops only)
    _base = _name[len("_foreach_"):]
    if hasattr(torch.ops.aten, _base) or (_base.endswith("_") and hasattr(torch.ops.aten, _base[:-1])):
        implements_aten(getattr(torch.ops.aten, _name))(functools.partial(_foreach, _name))


# ------------------------------------------------------------------ masked_fill: the mask read at the stored entries

def _mask_hits(x: SparseTensor, mask) -> torch.Tensor:
    """Per value of ``x``: whether ``mask`` (broadcast to ``x``'s shape) is True at its entry
    (False at ELL's padding slots); a sparse mask of ``x``'s shape by its stored True entries."""
    at = mask_points(mask, x._shape)
    if at is None:
        return project(_densified(mask, "masked_fill: a sparse mask that broadcasts").expand(x._shape), x)
    where, hit = stored_hits(x, at)
    hits = torch.zeros(x._vals.shape, dtype=torch.bool)
    hits[where] = hit
    return hits


def _check_bool_mask(name: str, mask) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ScorchTypeError(f"{name}: only supports boolean masks, but got mask with dtype {got}")


def _fill_value(value):
    return value.item() if isinstance(value, torch.Tensor) else value


@implements_aten(torch.ops.aten.masked_fill.Scalar, torch.ops.aten.masked_fill.Tensor)
def _masked_fill(self, mask, value):
    """Filling with 0 keeps the pattern (the masked stored values become 0); any other value
    reaches the absent entries too: the result is dense, computed densely (as is a 0-d tensor value
    that requires grad: the result depends on it at every masked entry, stored or not)."""
    traced = isinstance(value, torch.Tensor) and value.requires_grad
    value = _fill_value(value)
    _check_bool_mask("masked_fill", mask)
    if not isinstance(self, SparseTensor):   # a dense tensor with a sparse mask
        return torch.ops.aten.masked_fill.Scalar(self, _densified(mask, "masked_fill: the sparse mask"), value)
    if value == 0 and not traced:
        return self._like(values=self._vals.masked_fill(_mask_hits(self, mask), 0), nnz=self._stored)
    check_dense_size("masked_fill with a value other than 0 gives a dense result, and", [self, mask])
    return torch.ops.aten.masked_fill.Scalar(self.to_dense(), _densified(mask, "masked_fill"), value)


@implements_aten(torch.ops.aten.masked_fill_.Scalar, torch.ops.aten.masked_fill_.Tensor)
def _masked_fill_(self, mask, value):
    """In place: the masked stored values take ``value``; a nonzero value where nothing is stored
    joins the pattern (as ``x[mask] = value`` does: :func:`~scorch.ops.assign.store_at`)."""
    value = _fill_value(value)
    _check_bool_mask("masked_fill_", mask)
    if not isinstance(self, SparseTensor):
        return self.masked_fill_(_densified(mask, "masked_fill_: the sparse mask"), value)
    # an out-of-range value raises, as torch's (masked_fill_'s own check: 1e6 into float16 too, which fill_ lets be inf)
    value = torch.zeros((), dtype=self.dtype).masked_fill_(torch.tensor(True), value).item()
    hits = _mask_hits(self, mask)
    if value != 0:
        at = mask_points(mask, self._shape)
        if at is None:
            at = _densified(mask, "masked_fill_: a sparse mask that broadcasts").expand(self._shape).nonzero().t()
        if at.shape[1] != int(hits.sum()):
            store_at(self, at, torch.full((at.shape[1],), value, dtype=self.dtype), "masked_fill_")
            return self
    self._vals.masked_fill_(hits, value)
    return self


@implements_aten(torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default)
def _amp_unscale_(grads, found_inf, inv_scale):
    """GradScaler's unscale of the gradients (a SparseTensor's: its stored values), ``found_inf``
    set where one is not finite."""
    torch._amp_foreach_non_finite_check_and_unscale_(
        [g._vals if isinstance(g, SparseTensor) else g for g in grads], found_inf, inv_scale)


def _fused_step(func):
    """A fused optimizer step (``Adam(fused=True)``'s ``_fused_adam_``...) on the stored values: every
    per-parameter list entry of a SparseTensor parameter (its gradient, its state) holds its pattern,
    as the optimizers build them, and the op runs on their values arrays."""
    def step(*args, **kwargs):
        params = args[0]
        slots = [k for k, a in enumerate(args) if isinstance(a, (list, tuple)) and len(a) == len(params)]
        for i, p in enumerate(params):   # a parameter whose pattern changed: its gradient and state in the
            if isinstance(p, SparseTensor):   # union of their patterns, as the unfused step's writes grow them
                group = list({id(t): t for t in (args[k][i] for k in slots) if isinstance(t, SparseTensor)}.values())
                if not all(same_pattern(p, t) for t in group):
                    union, on_union = _on_union_values(group)
                    for t in group:
                        t._restore(union._like(values=on_union[id(t)].to(t.dtype), nnz=union._stored))
                        torch.autograd.graph.increment_version(t)
        args, back = list(args), []
        for k in slots:
            out = []
            for p, t in zip(params, args[k]):
                sparse = isinstance(p, SparseTensor)
                if isinstance(t, SparseTensor) and sparse and same_pattern(p, t):
                    t = t._vals
                elif sparse and type(t) is torch.Tensor and tuple(t.shape) == p._shape:
                    at = stored(p)   # a dense state (Adagrad's full_like sums): its values at the entries,
                    back.append((t, at, project(t, p, at)))   # written back after the step
                    t = back[-1][2]
                elif isinstance(t, SparseTensor) or (sparse and t.numel() != 1):   # (a step count: as it is)
                    raise NotSupportedError(f"{func.overloadpacket.__name__}: a SparseTensor parameter needs its "
                                            "gradient and state in its own pattern (another pattern here); use "
                                            "fused=False")
                out.append(t)
            args[k] = out
        func(*args, **kwargs)
        for t, (coords, where), values in back:
            t.index_put_(tuple(coords), values[where])
        for p in params:
            if isinstance(p, SparseTensor):
                _clear_padding(p)
    return step


for _op in (torch.ops.aten._fused_adam_, torch.ops.aten._fused_adamw_, torch.ops.aten._fused_sgd_,
            torch.ops.aten._fused_adagrad_):
    for _name in _op.overloads():
        implements_aten(getattr(_op, _name))(_fused_step(getattr(_op, _name)))


# ------------------------------------------------------------------ random fills: the stored values, as every in-place op

def _fill_stored(func):
    """``func`` (an in-place random fill: ``uniform_``, ``normal_``...) on the stored values --
    ``nn.init.xavier_uniform_(sparse_weight)`` initialises the weights the pattern keeps; like
    every in-place op on a SparseTensor, it cannot make absent entries present -- except on an
    unset tensor that stores nothing (``x.new_empty(n).normal_()``: spectral_norm's vector),
    which it fills whole."""
    def fill(self, *args, **kwargs):
        if not isinstance(self, SparseTensor):
            return func(self, *args, **kwargs)
        if any(isinstance(a, torch.Tensor) and a.dim() for a in leaves(args, kwargs)):   # bernoulli_(p tensor)
            raise NotSupportedError(f"{func.overloadpacket.__name__}: a tensor of parameters is not supported "
                                    "on a SparseTensor; pass a number")
        _every_position_if_unset(self, only_if_empty=True)
        func(self._vals, *args, **kwargs)
        _clear_padding(self)
        return self
    return fill


for _op in (torch.ops.aten.uniform_.default, torch.ops.aten.normal_.default, torch.ops.aten.bernoulli_.float,
            torch.ops.aten.bernoulli_.Tensor, torch.ops.aten.exponential_.default, torch.ops.aten.geometric_.default,
            torch.ops.aten.log_normal_.default, torch.ops.aten.cauchy_.default, torch.ops.aten.random_.default,
            torch.ops.aten.random_.to, getattr(torch.ops.aten.random_, "from")):   # ("from": a keyword)
    implements_aten(_op)(_fill_stored(_op))


# ------------------------------------------------------------------ complex parts of the values

def _part(x: SparseTensor, part: str) -> SparseTensor:
    """The pattern holding the ``part`` ("real" / "imag") of the stored values: a copy (the
    kernels read contiguous values, and every other float of a complex array is not), marked so
    that an in-place write into it -- which torch's view would pass on to ``x`` -- raises instead
    of being lost (:func:`scorch._dispatch.check_write`)."""
    if x._needs_grad():
        out = x.with_values(getattr(x.values(), part))
    else:
        out = x._like(values=getattr(x._vals, part), nnz=x._stored)
    out._copy_note = (f"x.{part} of a complex SparseTensor is a copy, not a view (its values would be every other "
                      "float of x's); write through torch.view_as_real(x), whose values() alternate x's real and "
                      "imaginary parts in x's memory")
    return out


@implements(torch.real, torch.Tensor.real.__get__)
def real(x):
    """``x.real``: the pattern holding the real parts of the stored values (a copy: the kernels read
    contiguous values; an in-place write into it raises, as it would not reach ``x`` as it does
    through torch's view -- ``torch.view_as_real(x)`` is the view to write through); a real tensor
    itself.  Differentiable.  (It ran densely.)"""
    if not x.dtype.is_complex:
        return x
    return _part(x, "real")


@implements(torch.imag, torch.Tensor.imag.__get__)
def imag(x):
    """``x.imag``: as :func:`real`, the imaginary parts; a real tensor has none (as torch's)."""
    if not x.dtype.is_complex:
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return _part(x, "imag")


def _with_pair_level(x: SparseTensor) -> Format:
    """``x``'s format storing one more, last dim in a trailing dense level: each stored value's
    (real, imaginary) pair, contiguous in the values array as ``torch.view_as_real`` lays it out."""
    fmt = x._format
    if fmt.block:   # the new dim's in-block level would sit between the block levels
        raise NotSupportedError(f"view_as_real: a SparseTensor in a blocked format ({fmt}) is not supported; "
                                "convert it first (x.asformat('csr')) or use torch.view_as_real(x.to_dense())")
    return Format(fmt.levels + (dense,), fmt.order + (len(fmt.levels),))


@implements(torch.view_as_real)
def view_as_real(x):
    """``torch.view_as_real(x)`` of a complex SparseTensor: a view of shape ``x.shape + (2,)``
    holding ``x``'s pattern and its values array seen as (real, imaginary) pairs (a trailing dense
    level of size 2) -- writes into its values reach ``x``, as torch's optimizers need (they update
    a complex parameter, its gradient and state through this view).  Differentiable; in grad mode
    an in-place write through it is refused when ``x`` requires grad, as through ``x.t()``."""
    if not x.dtype.is_complex:
        raise ScorchValueError(f"view_as_real: only supported for complex tensors, got dtype {x.dtype}")
    pattern = x._like(fmt=_with_pair_level(x), shape=x._shape + (2,),
                      values=torch.view_as_real(x._vals.detach()).reshape(-1), nnz=2 * x._stored)
    if x._needs_grad():
        return pattern.with_values(torch.view_as_real(x.values()).reshape(-1))
    return pattern._alias_of(x, back=_complex_back)   # (a write adding entries reaches x too)


def _complex_back(new: SparseTensor, source: SparseTensor) -> SparseTensor:
    """A ``view_as_real`` view's new storage (its pair level kept: writes rebuild in its format) as
    the complex source holds it (:meth:`SparseTensor._restore`)."""
    return view_as_complex(new).asformat(source._format, index_dtype=source.index_dtype)


@implements(torch.view_as_complex)
def view_as_complex(x):
    """``torch.view_as_complex(x)`` of a SparseTensor whose last dim (of size 2) is stored by a
    trailing dense level, as :func:`view_as_real` gives: the complex view, sharing the values array."""
    fmt, n = x._format, len(x._shape)
    if x.dtype not in (torch.float16, torch.float32, torch.float64):
        raise ScorchValueError(f"view_as_complex: expected a float16, float32 or float64 tensor, got {x.dtype}")
    if n < 2 or x._shape[-1] != 2 or fmt.block or fmt.levels[-1] != dense or fmt.order[-1] != n - 1:
        raise NotSupportedError(
            f"view_as_complex: needs the last dim, of size 2, stored by a trailing dense level (as "
            f"torch.view_as_real of a complex SparseTensor gives), got shape {tuple(x._shape)} in format {fmt}; "
            "use torch.view_as_complex(x.to_dense())")
    pattern = x._like(fmt=Format(fmt.levels[:-1], fmt.order[:-1]), shape=x._shape[:-1],
                      values=torch.view_as_complex(x._vals.detach().view(-1, 2)), nnz=x._stored // 2)
    if x._needs_grad():
        return pattern.with_values(torch.view_as_complex(x.values().view(-1, 2)))
    return pattern
