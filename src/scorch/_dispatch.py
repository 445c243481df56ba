"""The one dispatch table from torch functions to scorch implementations.

``__torch_function__`` on SparseTensor lands in :func:`torch_function`: a
registered implementation runs if there is one; otherwise the call proceeds
into torch with subclass handling off, so metadata queries (shape, dtype,
``requires_grad_``...) work on the wrapper directly.  Any aten op that then
reaches :func:`torch_dispatch` without a handler runs on densified operands
(the dense fallback), except ops that would write into a SparseTensor, which
raise instead of silently writing into a temporary.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Callable

import torch

from . import config
from ._memo import remember
from .errors import NotSupportedError, ScorchTypeError, ScorchValueError
from .interop import check_foreign, check_torch_sparse
from .tensor import SparseTensor, _within

_FUNCTIONS: dict[Callable, Callable] = {}
_ATEN: dict = {}
_warned: set[str] = set()


def implements(*funcs):
    """Register the decorated function as the SparseTensor implementation of ``funcs``."""
    def register(impl):
        for f in funcs:
            _FUNCTIONS[f] = impl
        return impl
    return register


def autocast_lower_precision(*funcs):
    """torch's autocast "lower precision" ops among the registered ``funcs`` (products, linear,
    convolutions): under ``torch.autocast("cpu")`` a float32 result comes back in the autocast
    dtype, as torch's own does (scorch computes it in float32: its kernels have no bfloat16 form);
    float64 results stay, as autocast leaves float64 inputs alone."""
    for f in funcs:
        impl = _FUNCTIONS.get(f)
        if impl is None or getattr(impl, "_autocast", False):
            continue

        @functools.wraps(impl)
        def run(*args, _impl=impl, **kwargs):
            if not torch._C._is_any_autocast_enabled():
                return _impl(*args, **kwargs)
            return with_autocast(_impl, *args, **kwargs)
        run._autocast = True
        _FUNCTIONS[f] = run


def with_autocast(impl, *args, **kwargs):
    """``impl(*args, **kwargs)`` of a lower-precision op under ``torch.autocast("cpu")`` (see
    :func:`autocast_lower_precision`): with a SparseTensor operand, computed in float32 (half-float
    operands, an earlier layer's autocast output, go up) and returned in the autocast dtype; without
    one, torch's own autocast as it is."""
    if not torch.is_autocast_enabled("cpu") or not any(isinstance(a, SparseTensor) for a in leaves(args, kwargs)):
        return impl(*args, **kwargs)
    half = lambda a: isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16)  # noqa: E731
    args, kwargs = _map(lambda a: a.float(), args, half), _map(lambda a: a.float(), kwargs, half)
    with torch.autocast("cpu", enabled=False):
        out = impl(*args, **kwargs)
    return out.to(torch.get_autocast_dtype("cpu")) if isinstance(out, torch.Tensor) \
        and out.dtype == torch.float32 else out


def implements_aten(*ops):
    def register(impl):
        for op in ops:
            _ATEN[op] = impl
        return impl
    return register


@implements(torch.Tensor.requires_grad_)
def _requires_grad_(self, requires_grad=True):
    as_torch_runs(torch.Tensor.requires_grad_, self, requires_grad)
    if requires_grad and isinstance(self, SparseTensor):
        self._grads_keep_pattern()
    return self


@implements(torch.Tensor.requires_grad.__set__)   # x.requires_grad = True
def _set_requires_grad(self, requires_grad):
    _requires_grad_(self, requires_grad)


def accepts_out(fn):
    """``fn`` (an out-of-place implementation) taking torch's ``out=`` keyword: the result, a
    dense tensor or a tuple of them (``topk``'s values and indices), is written into ``out`` as
    torch writes one -- resized when its shape differs (with torch's warning when ``out`` held
    elements), of the result's dtype -- and ``out`` returned.  A sparse result cannot be
    written into a dense ``out``; like torch, ``out=`` does not combine with autograd."""
    name = fn.__name__.strip("_")

    @functools.wraps(fn)
    def run(*args, out=None, **kwargs):
        if out is None:
            return fn(*args, **kwargs)
        if name in _REDUCED_IN_OUT_DTYPE and isinstance(out, torch.Tensor) and kwargs.get("dtype") is None \
                and not (name in ("mean", "nanmean") and not (out.dtype.is_floating_point or out.dtype.is_complex)):
            kwargs = dict(kwargs, dtype=out.dtype)   # (torch sums in out='s dtype)
        result = fn(*args, **kwargs)
        if torch.is_grad_enabled() and any(isinstance(r, torch.Tensor) and r.requires_grad for r in
                                           (result if isinstance(result, tuple) else (result,))):
            # (a result that requires grad: argmax's indices do not, and go through, as torch's)
            raise ScorchValueError(f"{name}(): out= does not support automatic differentiation (as in torch), "
                                   "but an argument requires grad; call it without out= or under torch.no_grad()")
        return write_out(name, result, out)
    return run


def _check_out_dtype(name: str, result, out) -> None:
    """torch's rule for ``out=``: the ops that cast their result into ``out`` (arithmetic,
    comparisons, float functions, sums, concatenations: :data:`_OUT_CASTS`) take one of a dtype
    ``torch.can_cast`` allows; the others want the result's own dtype (``abs``, ``clamp``,
    products, lookups, order statistics)."""
    if result != out and not (name in _OUT_CASTS and torch.can_cast(result, out)):
        raise ScorchValueError(f"{name}: out= has dtype {out}, the result has {result}"
                               + (", which cannot be cast to it" if name in _OUT_CASTS else
                                  f" ({name} does not cast into out=, as torch's)"))


# torch's ops that cast their result into an out= of another dtype (checked against torch 2.13)
_OUT_CASTS = frozenset({
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "pow", "float_power", "atan2",
    "hypot", "fmod", "remainder", "maximum", "minimum", "lerp", "addcmul", "addcdiv", "xlogy",
    "gt", "lt", "ge", "le", "eq", "ne", "greater", "less", "greater_equal", "less_equal", "not_equal",
    "logical_and", "logical_or", "logical_xor", "logical_not",
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "square", "reciprocal", "sin", "cos",
    "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc",
    "sum", "mean", "nanmean", "prod", "nansum", "var", "std", "logsumexp", "cumsum", "cumprod",
    "cat", "concat", "concatenate", "stack", "kron", "outer"})
# reductions torch computes in out='s dtype (a float32 sum into a float64 out sums in float64)
_REDUCED_IN_OUT_DTYPE = frozenset({"sum", "prod", "nansum", "cumsum", "cumprod", "mean", "nanmean"})


def write_out(name: str, result, out, densify: bool = False):
    """``result`` written into ``out`` (see :func:`accepts_out`); returns ``out``.  With
    ``densify`` (an elementwise op), a sparse result goes into a dense ``out`` densified, and a
    SparseTensor ``out`` takes a sparse result in its own pattern (``torch.mul(A, 2, out=A)``)."""
    if isinstance(out, SparseTensor):
        check_write(name, out)
    if isinstance(result, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != len(result):
            raise ScorchTypeError(f"{name}: out= must be a tuple of {len(result)} tensors, got {type(out).__name__}")
        written = tuple(write_out(name, r, o, densify) for r, o in zip(result, out))
        return written if type(result) is tuple else type(result)(written)
    if densify and isinstance(out, SparseTensor) and out._stored == math.prod(out._shape) \
            and tuple(result.shape) == out._shape and not (isinstance(result, SparseTensor) and _same_pattern(result, out)):
        # a SparseTensor storing every position takes any result of its shape, read at its positions
        _check_out_dtype(name, result.dtype, out.dtype)
        from .ops._pattern import project
        out._vals.copy_(project(result.to_dense() if isinstance(result, SparseTensor) else result, out))
        torch.autograd.graph.increment_version(out)
        return out
    if densify and isinstance(out, SparseTensor):
        _check_out_dtype(name, result.dtype, out.dtype)
        if not (isinstance(result, SparseTensor) and _same_pattern(result, out)):
            if tuple(result.shape) != out._shape:
                raise NotSupportedError(f"{name}: out= is a SparseTensor of shape {out._shape}, the result has shape "
                                        f"{tuple(result.shape)}; use the returned tensor")
            with torch.no_grad():   # another pattern: out takes the result's, as copy_ does (amsgrad's
                return out.copy_(result)   # maximum(max_sq, sq, out=max_sq) after the parameter grew)
        out._vals.copy_(result._vals)
        torch.autograd.graph.increment_version(out)
        return out
    if isinstance(result, SparseTensor) and type(out) is torch.Tensor and out.layout == torch.strided:
        check_dense_size(f"{name}: out= is dense, so the result is written densely, and", [result])
        result = result.to_dense()   # (a dense out= takes any result, as torch's)
    if isinstance(result, SparseTensor) or isinstance(out, SparseTensor):
        raise NotSupportedError(f"{name}: out= needs a dense result and a dense out tensor; here "
                                f"{'the result' if isinstance(result, SparseTensor) else 'out'} is a SparseTensor "
                                "(call it without out=)")
    if type(out) is not torch.Tensor or out.layout != torch.strided:
        raise ScorchTypeError(f"{name}: out= must be a dense torch.Tensor, got {type(out).__name__} "
                              f"{getattr(out, 'layout', '')}")
    _check_out_dtype(name, result.dtype, out.dtype)
    if out.shape != result.shape:
        if out.numel():
            warnings.warn(f"{name}: an out= tensor of shape {tuple(out.shape)} was resized to {tuple(result.shape)} "
                          "(as torch resizes one that holds elements; pass an empty tensor to resize it silently)",
                          UserWarning, stacklevel=3)
        out.resize_(result.shape)
    return out.copy_(result)


def torch_function(func, types, args, kwargs):
    check_foreign(args)   # a torch.sparse tensor beside a SparseTensor: validated before anything reads it
    if kwargs:
        check_foreign(kwargs.values())
    impl = _FUNCTIONS.get(func)
    if impl is not None:
        if kwargs and not _TORCH_NAMES.isdisjoint(kwargs):
            args, kwargs = _torch_keywords(impl, args, kwargs)
        return impl(*args, **kwargs)
    return as_torch_runs(func, *args, **kwargs)


_TORCH_NAMES = frozenset({"input", "other", "axis", "keepdims", "dims", "size"})
_PARAMS: dict = {}   # impl -> its parameter names, and whether it takes **kwargs


def _torch_keywords(impl, args: tuple, kwargs: dict):
    """The call as ``impl`` takes it when it was made with torch's keyword names: ``input=`` /
    ``other=`` (the first / second argument of every torch function that has them), numpy's
    ``axis=`` / ``keepdims=`` for ``dim=`` / ``keepdim=``, and ``dims=`` / ``size=`` of the
    varargs methods (``permute``, ``expand``)."""
    names = _PARAMS.get(impl)
    if names is None:
        try:
            params = inspect.signature(impl).parameters.values()
        except (TypeError, ValueError):
            params = ()
        names = _PARAMS[impl] = ({p.name for p in params}, any(p.kind == p.VAR_POSITIONAL for p in params))
    named, varargs = names
    kwargs = dict(kwargs)
    for alias, name in (("axis", "dim"), ("keepdims", "keepdim")):
        if alias in kwargs and name not in kwargs and alias not in named:
            kwargs[name] = kwargs.pop(alias)
    if "input" in kwargs and "input" not in named and not args:
        args = (kwargs.pop("input"),)
    if "other" in kwargs and "other" not in named and len(args) == 1:
        args = args + (kwargs.pop("other"),)
    for name in ("dims", "size"):
        if name in kwargs and name not in named and varargs and len(args) == 1:
            value = kwargs.pop(name)
            args = args + (tuple(value) if isinstance(value, (tuple, list, torch.Size)) else (value,))
    return args, kwargs


def as_torch_runs(func, *args, **kwargs):
    """``func`` as torch runs it, SparseTensor subclass handling off (its aten ops then reach
    :func:`torch_dispatch`: a sparse implementation or the dense fallback)."""
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


_POINTWISE: list = []  # the handler for aten ops tagged pointwise (scorch.ops.pointwise)


def register_pointwise(handler):
    _POINTWISE[:] = [handler]
    return handler


def torch_dispatch(func, types, args, kwargs):
    written = _WRITTEN.get(func)
    if written is None:
        written = _WRITTEN[func] = _written_arguments(func)
    if not written:
        return _run(func, args, kwargs)
    targets = []
    for k, name in written:
        t = args[k] if k < len(args) else kwargs.get(name)
        if type(t) is SparseTensor:
            if t._grad_view or t._copy_note:
                check_write(func.overloadpacket.__name__, t)
            targets.append(t._vals)
    out = _run(func, args, kwargs)
    if targets:   # the version autograd's saved values (and every alias's values()) carry
        _bump_versions(tuple(targets))
    return out


_bump_versions = torch._C._increment_version


def _run(func, args, kwargs):
    impl = _ATEN.get(func) or _ATEN.get(func.overloadpacket)
    if impl is not None:
        return impl(*args, **kwargs)
    if _POINTWISE and (torch.Tag.pointwise in func.tags or _in_place_pointwise(func)):
        return _POINTWISE[0](func, args, kwargs)
    if func.overloadpacket in _DENSE_BY_DEFINITION and not _writes_sparse(func, args, kwargs):
        check_dense_size(f"{func.overloadpacket.__name__} gives a dense result, and", leaves(args, kwargs))
        return densified(func, args, kwargs)
    return dense_fallback(func, args, kwargs)


# ------------------------------------------------------------------ writes into a SparseTensor's values

_WRITTEN: dict = {}   # aten op -> its written arguments: ((position, name), ...)


def _written_arguments(func) -> tuple:
    return tuple((k, a.name) for k, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def check_write(name: str, t: SparseTensor) -> None:
    """An in-place op runs below autograd on the wrapper it writes; writing through a SparseTensor
    whose values are another tensor's that requires grad (a view: ``x.t()``, ``x.reshape(...)``,
    ``x.with_values(v)``) would change that tensor unrecorded -- refused while grad mode is on, as
    torch refuses writes through a leaf's views (and scorch cannot rebase a base's history).  The
    aten writes check here; writes made above them (``out=``, ``apply_``) call it themselves.
    A result torch makes a view of but scorch a copy (``x.real`` / ``x.imag`` of a complex
    SparseTensor: its values are contiguous, their parts are not; ``x.view(...)`` reordering the
    entries) carries ``_copy_note``: a write into it, which torch's view would pass on to ``x``,
    is refused."""
    if t._copy_note:
        raise NotSupportedError(f"{name}: {t._copy_note}: this in-place write would not reach x; compute out of "
                                "place")
    if t._grad_view and torch.is_grad_enabled():
        with torch._C.DisableTorchFunctionSubclass():
            tracked = t.requires_grad
        if tracked:
            raise RuntimeError(
                f"{name}: a SparseTensor that shares its values with a tensor that requires "
                "grad (a view such as x.t(), x.reshape(...), x.with_values(v)) is being used in an in-place "
                "operation, which autograd would not record; write into the tensor itself, out of place, or "
                "under torch.no_grad()")


# aten ops whose result is dense whatever the input's sparsity (centred or normalised values,
# f(0) != 0, one value per position or per bin): computed densely, without the fallback's
# "no sparse implementation" warning -- as exp(A) or A + 1 are
_DENSE_BY_DEFINITION = {getattr(torch.ops.aten, name) for name in (
    "native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "native_group_norm", "log_sigmoid_forward", "binary_cross_entropy_with_logits", "searchsorted", "bucketize",
    "histogram", "_cdist_forward", "cdist") if hasattr(torch.ops.aten, name)}


_IN_PLACE: dict = {}
# elementwise, but aten leaves the tag off (prelu's kernel: its weight broadcast to the input)
_UNTAGGED = {"floor_divide", "floor_divide_", "hardswish", "hardswish_", "hardswish_backward", "_prelu_kernel"}


def _in_place_pointwise(func) -> bool:
    """An in-place op whose out-of-place form is tagged pointwise (aten leaves the tag off a few,
    ``abs_`` and ``threshold_`` among them), an ``out=`` overload of a pointwise op
    (``where.self_out``), or an untagged elementwise op (``floor_divide``)."""
    found = _IN_PLACE.get(func)
    if found is None and func._overloadname.endswith("out") and "out" in [a.name for a in func._schema.arguments]:
        packet = func.overloadpacket
        found = _IN_PLACE[func] = any(torch.Tag.pointwise in getattr(packet, ov).tags for ov in packet.overloads()
                                      if not ov.endswith("out"))
    if found is None:
        name = func.overloadpacket.__name__
        if name in _UNTAGGED and func._overloadname in ("default", "Scalar", "Tensor"):
            _IN_PLACE[func] = True
            return True
        base = getattr(torch.ops.aten, name[:-1], None) if name.endswith("_") and not name.startswith("_") else None
        overload = getattr(base, func._overloadname, None) if base is not None else None
        found = _IN_PLACE[func] = overload is not None and torch.Tag.pointwise in overload.tags
    return found


def _writes_sparse(func, args, kwargs) -> bool:
    schema = getattr(func, "_schema", None)   # (a torch-level function has none: its caller checked)
    for i, a in enumerate(schema.arguments if schema is not None else ()):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        val = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(val, SparseTensor) or (isinstance(val, (list, tuple))   # a Tensor(a!)[] (_foreach_*_)
                                             and any(isinstance(v, SparseTensor) for v in val)):
            return True
    return False


def check_dense_size(what: str, tensors) -> None:
    """Raise when the dense copies of the SparseTensors among ``tensors`` would exceed
    ``config.dense_fallback_max_bytes`` (``what`` starts the message: the op and why)."""
    limit = config.dense_fallback_max_bytes
    size = sum(a.numel() * a._vals.element_size() for a in tensors if isinstance(a, SparseTensor))
    if limit is not None and size > limit:
        raise NotSupportedError(
            f"{what} its dense copy would take {size / 2**30:.1f} GiB, over "
            f"scorch.config.dense_fallback_max_bytes = {limit / 2**30:.1f} GiB; use x.to_dense() if you mean "
            "it, or raise the limit")


def broadcast_shapes(*shapes) -> tuple:
    """``torch.broadcast_shapes`` for concrete shapes, without its symbolic-shape guards (7 us a
    call there, on the paths of sparse * dense and of every binary op)."""
    out = []
    for dims in zip(*(((1,) * (max(map(len, shapes)) - len(s))) + tuple(s) for s in shapes)):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ScorchValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def densified(func, args, kwargs):
    """``func`` on dense copies of the SparseTensor arguments -- and of any ``torch.sparse`` one
    beside them (the result is dense).  An ``out=`` SparseTensor raises: the result would go into
    its dense copy and be lost."""
    out = kwargs.get("out")
    if isinstance(out, SparseTensor) or (isinstance(out, (tuple, list)) and any(isinstance(o, SparseTensor) for o in out)):
        name = getattr(func, "__name__", None) or str(func)
        raise NotSupportedError(f"{name}: out= is a SparseTensor, but this result is computed densely; "
                                "use the returned tensor")
    tensors = leaves(args, kwargs)
    check_dense_size(f"{_name_of(func)} is computed on the dense tensor, and", tensors)
    _check_result_size(func, args, kwargs, tensors)
    args, kwargs = _map(_to_dense, args, _is_any_sparse), _map(_to_dense, kwargs, _is_any_sparse)
    return func(*args, **kwargs)


def _check_result_size(func, args, kwargs, tensors) -> None:
    """Small sparse inputs can make a huge dense result (``v[:, None] * v[None, :]``, ``cdist``): a
    result many times the size of its inputs' dense copies -- found by broadcasting for an
    elementwise op, by running the op on meta tensors otherwise -- must fit
    ``config.dense_fallback_max_bytes`` too."""
    limit = config.dense_fallback_max_bytes
    sparse = [a for a in tensors if isinstance(a, SparseTensor)]
    if limit is None or not sparse:
        return
    shaped = [a for a in tensors if isinstance(a, torch.Tensor)]
    item = max(a.element_size() if not isinstance(a, SparseTensor) else a._vals.element_size() for a in shaped)
    if hasattr(func, "tags") and torch.Tag.pointwise in func.tags:
        if len({tuple(a.shape) for a in shaped if a.dim()}) <= 1:
            return   # (no broadcast: the result is an input's size)
        try:
            numel = math.prod(broadcast_shapes(*(tuple(a.shape) for a in shaped)))
        except ScorchValueError:
            return   # (torch reports the mismatch)
        size = [numel * item]
    else:   # on meta tensors, memoised by the arguments' shapes (a meta layer_norm takes 0.5 ms)
        sig = lambda a: (tuple(a.shape), a.dtype)  # noqa: E731
        try:
            key = (func, repr((_map(sig, args, _is_tensor), _map(sig, kwargs, _is_tensor))))
        except Exception:   # (an argument whose repr fails: measured every time)
            key = None
        size = _RESULT_BYTES.get(key) if key is not None else None
        if size is None:
            meta = lambda a: torch.empty(a.shape, dtype=a.dtype, device="meta")  # noqa: E731
            mkw = {k: v for k, v in kwargs.items() if k not in ("generator", "out")}   # (no CPU work, no RNG draws:
            if "device" in mkw:                                                        # randint_like(A, device=...))
                mkw["device"] = "meta"
            try:
                out = func(*_map(meta, args, _is_tensor), **_map(meta, mkw, _is_tensor))
            except Exception:   # (an op without a meta kernel: its inputs' check is all there is)
                return
            size = [sum(o.numel() * o.element_size() for o in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(o, torch.Tensor))]
            if key is not None:
                remember(_RESULT_BYTES, key, size)
    inputs = sum(a.numel() * (a._vals if isinstance(a, SparseTensor) else a).element_size() for a in shaped)
    if sum(size) > limit and sum(size) > 4 * inputs:   # (a result many times its inputs' dense copies)
        raise NotSupportedError(
            f"{_name_of(func)} of a SparseTensor gives a dense result here, of {sum(size) / 2**30:.1f} GiB, over "
            f"scorch.config.dense_fallback_max_bytes = {limit / 2**30:.1f} GiB; use x.to_dense() if you mean it, "
            "or raise the limit")


_RESULT_BYTES: dict = {}   # (op, its arguments' shapes and dtypes) -> [bytes of its dense result]


def _is_tensor(a) -> bool:
    return isinstance(a, torch.Tensor)


def _name_of(func) -> str:
    return str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else getattr(func, "__name__", str(func))


def _to_dense(a) -> torch.Tensor:
    if type(a) is not SparseTensor:
        check_torch_sparse(a)
    return a.to_dense()


def _is_any_sparse(a) -> bool:
    return isinstance(a, SparseTensor) or (isinstance(a, torch.Tensor) and a.layout != torch.strided)


# An op's arguments hold SparseTensors at the top level or in lists, tuples and dicts (an aten
# schema's Tensor[]).  torch.utils._pytree walks them too, but at ~10 us a walk (three walks
# made a pointwise op on a SparseTensor 25x slower than the op on its values) and through a
# self-referencing closure that leaves a reference cycle per walk for the garbage collector.

def map_sparse(fn, args: tuple, kwargs: dict):
    """``(args, kwargs)`` with every SparseTensor ``a`` in them replaced by ``fn(a)``."""
    return _map(fn, args), _map(fn, kwargs)


def _map(fn, x, pick=None):
    t = type(x)
    if t is tuple or t is list:
        return t([_map(fn, a, pick) for a in x])
    if t is dict:
        return {k: _map(fn, v, pick) for k, v in x.items()}
    return fn(x) if (isinstance(x, SparseTensor) if pick is None else pick(x)) else x


def leaves(args: tuple, kwargs: dict) -> list:
    """Every argument that is not a list, tuple or dict, in order (nested ones flattened)."""
    out: list = []
    _leaves(args, out)
    _leaves(kwargs, out)
    return out


def _leaves(x, out: list) -> None:
    t = type(x)
    if t is tuple or t is list:
        for a in x:
            _leaves(a, out)
    elif t is dict:
        for a in x.values():
            _leaves(a, out)
    else:
        out.append(x)


def dense_fallback(func, args, kwargs):
    name = _name_of(func)
    if _writes_sparse(func, args, kwargs):
        raise NotSupportedError(
            f"{name}: writing into a SparseTensor in place is not supported; "
            "use the out-of-place op, or x.to_dense() first")
    mode = config.dense_fallback   # (warn / silent / raise: scorch.config checks it when set)
    if mode == "raise":
        raise NotSupportedError(
            f"{name} has no sparse implementation and scorch.config.dense_fallback = 'raise'; "
            "convert with x.to_dense() first, or set dense_fallback = 'warn'")
    check_dense_size(f"{name} has no sparse implementation, and", leaves(args, kwargs))
    if mode == "warn" and name not in _warned:
        _warned.add(name)
        warnings.warn(f"scorch: {name} has no sparse implementation; running it on a dense copy "
                      "(warned once per op; scorch.config.dense_fallback controls this)", stacklevel=3)
    return densified(func, args, kwargs)


# ------------------------------------------------------------------ tensor-level methods reached as torch functions

implements(torch.clone, torch.Tensor.clone)(SparseTensor.clone)
implements(torch.t, torch.Tensor.t)(SparseTensor.t)
implements(torch.transpose, torch.Tensor.transpose)(SparseTensor.transpose)
implements(torch.permute, torch.Tensor.permute)(SparseTensor.permute)
implements(torch.Tensor.detach)(SparseTensor.detach)
implements(torch.Tensor.to)(SparseTensor.to)
implements(torch.Tensor.to_dense)(SparseTensor.to_dense)
implements(torch.Tensor.values)(SparseTensor.values)
implements(torch.Tensor._values)(SparseTensor._coo_values)
implements(torch.Tensor.coalesce)(SparseTensor.coalesce)
implements(torch.Tensor.indices, torch.Tensor._indices)(SparseTensor.indices)
for _name in ("tolist", "_nnz", "sparse_dim", "dense_dim", "crow_indices", "col_indices", "ccol_indices", "row_indices",
              "to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr", "to_sparse_bsc"):
    implements(getattr(torch.Tensor, _name))(getattr(SparseTensor, _name))


@implements(torch.Tensor.grad.__set__)   # p.grad = g
def _set_grad(self, grad):
    """``p.grad = g`` with a sparse ``p`` and a sparse ``g`` storing some of ``p``'s positions (or
    the same ones in another format): ``g`` in ``p``'s pattern, zeros stored where it has none --
    as autograd's gradients arrive.  An optimizer's ``grad + eps`` then reaches every stored
    position (Adamax divided 0 by 0 where ``g`` stored nothing), and a fused step keeps ``p``'s
    storage.  Any other ``g`` is set as it is."""
    if isinstance(self, SparseTensor) and isinstance(grad, SparseTensor):
        grad = _in_pattern_of(self, grad)
    return as_torch_runs(torch.Tensor.grad.__set__, self, grad)


def _in_pattern_of(p: SparseTensor, g: SparseTensor) -> SparseTensor:
    from .ops._pattern import in_pattern, project, same_pattern
    if g.shape != p.shape or g.dtype != p.dtype or same_pattern(g, p):
        return g
    same = g if g._format == p._format else g.asformat(p._format)
    if not _within(same, p):
        return g
    return in_pattern(p, project(g, p))


# A SparseTensor's buffers are its index arrays and values; the wrapper has no storage of its
# own, and torch's storage methods on it crash the process (share_memory_, a storage's copy_).
@implements(torch.Tensor.data.__set__)   # x.data = y
def _set_data(self, new):
    """``x.data = y``: a SparseTensor takes another SparseTensor's storage (its pattern too), of
    the same shape and dtype (the wrapper's own sizes and dtype are fixed); anything else raises
    (it was ignored)."""
    if not isinstance(self, SparseTensor):
        return as_torch_runs(torch.Tensor.data.__set__, self, new)
    if not isinstance(new, SparseTensor) or new.shape != self.shape or new.dtype != self.dtype:
        got = f"{type(new).__name__} {tuple(getattr(new, 'shape', ()))} {getattr(new, 'dtype', '')}"
        raise NotSupportedError(f"x.data = y: a SparseTensor's data can be replaced by a SparseTensor of its shape "
                                f"{tuple(self.shape)} and dtype {self.dtype}, got {got}; use copy_ (which converts)")
    self._become(new.detach())


@implements(torch.Tensor.share_memory_)
def _share_memory_(self):
    for t in (*self._pos, *self._crd, self._vals):
        if t is not None:
            t.share_memory_()
    return self


@implements(torch.Tensor.is_shared)
def _is_shared(self):
    return self._vals.is_shared()


@implements(torch.Tensor.is_pinned)
def _is_pinned(self, *args, **kwargs):
    return self._vals.is_pinned(*args, **kwargs)


@implements(torch.Tensor.untyped_storage, torch.Tensor.storage, torch.Tensor._typed_storage)
def _no_storage(self, *args, **kwargs):
    raise ScorchTypeError("a SparseTensor has no storage of its own: its buffers are x.values() and the index "
                          "arrays x.pos(level) / x.crd(level).  (Under torch.compile, which asks for it: scorch "
                          "tensors cannot be traced yet -- their kernels are compiled already; compile the dense "
                          "parts only, with no SparseTensor among their inputs or module attributes)")


@implements(*[getattr(torch.Tensor, n) for n in ("data_ptr", "const_data_ptr", "mutable_data_ptr")
              if hasattr(torch.Tensor, n)])
def _no_data_ptr(self, *args, **kwargs):
    """A SparseTensor has no dense buffer: its wrapper's pointer is 0 (every SparseTensor would
    seem to alias every other, and C given it would read address 0).  As torch.sparse's, it raises."""
    if not isinstance(self, SparseTensor):
        return as_torch_runs(torch.Tensor.data_ptr, self, *args, **kwargs)
    raise ScorchTypeError("data_ptr(): a SparseTensor has no dense buffer; its arrays are x.values(), x.pos(level) "
                          "and x.crd(level) (each has a data_ptr), or use x.to_dense()")


@implements(torch.Tensor.__dlpack__)
def _no_dlpack(self, *args, **kwargs):
    """DLPack describes one strided buffer, which a SparseTensor does not have (the wrapper reports
    a strided layout, so torch's own check let ``torch.from_dlpack(A)`` / ``np.from_dlpack(A)`` read
    the wrapper's empty buffer: garbage or a segfault).  torch.sparse's tensors raise the same."""
    raise BufferError("Can't export a SparseTensor through DLPack (it has no strided buffer): export "
                      "x.to_dense(), or its arrays x.values(), x.pos(level), x.crd(level)")


@implements(torch.Tensor.apply_)
def _apply_(self, callable):
    """``fn`` on each stored value, in place (as every in-place op: the pattern stays)."""
    check_write("apply_", self)
    self._vals.apply_(callable)
    torch.autograd.graph.increment_version((self, self._vals))
    return self


@implements(torch.Tensor.copy_)
def _copy(self, src, non_blocking=False):
    if isinstance(self, SparseTensor):
        return self.copy_(src, non_blocking)
    # a dense destination: torch broadcasts and casts the dense value of the source
    return as_torch_runs(torch.Tensor.copy_, self, src.to_dense(), non_blocking)


# aten ops that torch itself issues on our wrapper (autograd, nn.Module, copy)
@implements_aten(torch.ops.aten.detach.default, torch.ops.aten.alias.default)
def _aten_detach(x):
    return x.detach()


@implements_aten(torch.ops.aten.new_empty_strided.default)
def _aten_new_empty_strided(x, size, stride, **kwargs):
    """A SparseTensor's ``new_empty_strided`` of its own shape and dtype: its pattern, zeros stored.
    Autograd's gradient layout contract asks for it (``new_grad.new_empty_strided(...).copy_(new_grad)``)
    when a backward with ``create_graph=True`` accumulates a gradient: a sparse gradient stays sparse
    (it became dense).  Any other shape or dtype: the dense fallback's strided tensor."""
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if (isinstance(x, SparseTensor) and tuple(size) == x._shape and dtype in (None, x.dtype)
            and (device is None or torch.device(device).type == "cpu") and kwargs.get("layout") in (None, torch.strided)):
        out = x._like(values=torch.zeros_like(x._vals), nnz=x._stored)
        out._unset = True   # as empty_like's: a fill writes every position (ops.pointwise._unset)
        return out
    return dense_fallback(torch.ops.aten.new_empty_strided.default, (x, size, stride), kwargs)


@implements_aten(torch.ops.aten.clone.default)
def _aten_clone(x, memory_format=None):
    return x.clone()


@implements_aten(torch.ops.aten.is_same_size.default)
def _aten_is_same_size(a, b):   # (fwAD.make_dual's check: it densified both)
    return tuple(a.shape) == tuple(b.shape)


@implements_aten(torch.ops.aten._has_same_storage_numel.default)
def _aten_same_storage_numel(a, b):
    """make_dual's check that a tangent can stand for its primal: a SparseTensor beside a tensor of
    its shape (a wrapper's storage is its arrays; the tangent's pattern may differ)."""
    return tuple(a.shape) == tuple(b.shape)


@implements_aten(torch.ops.aten._to_copy.default)
def _aten_to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                  memory_format=None):
    if layout not in (None, torch.strided):
        raise NotSupportedError(f"_to_copy: cannot change a SparseTensor's layout to {layout}; use to_torch()")
    return x.to(device=device, dtype=dtype, non_blocking=non_blocking, copy=True)


@implements_aten(torch.ops.aten.copy_.default)
def _aten_copy(dst, src, non_blocking=False):
    if not isinstance(dst, SparseTensor):
        return dst.copy_(src.to_dense() if isinstance(src, SparseTensor) else src)
    with torch.no_grad():   # (below autograd, which recorded the copy: CopyBackwards)
        return dst.copy_(src)


def _same_pattern(a: SparseTensor, b: SparseTensor) -> bool:
    from .ops._pattern import same_pattern   # the ops build on this module
    return same_pattern(a, b)
