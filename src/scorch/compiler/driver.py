"""The compiler driver: ``einsum(eq, *operands)`` top to bottom.

operands -> :func:`notation.parse` -> :func:`schedule.make_schedule` ->
:func:`lower.lower` -> :func:`codegen.render` -> :func:`build.compile_library`
-> call with the operands' raw pointers.  Plans are cached in process by a
canonical key (equation, expression, operand formats / index widths / stride
kinds, value type, output mode); sizes are runtime arguments, so one kernel
serves every shape.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass, field

import torch

from .. import convert
from .._dispatch import broadcast_shapes
from ..errors import InternalError, NotSupportedError, ScorchTypeError, ScorchValueError
from .._memo import remember
from ..format import preset, resolve
from ..interop import as_sparse, from_torch, is_sparse
from ..tensor import SparseTensor, resolved
from . import build, codegen, compact
from .lower import lower
from .notation import Einsum, parse, permutation, product
from .schedule import Operand, Schedule, make_schedule


@dataclass
class Plan:
    """What runs for one einsum: readable with ``str()``, inspectable by tests."""
    equation: str
    loop_order: tuple
    output_format: str
    parallel: str
    notes: tuple
    source: str
    backend: str = "generated C"
    dispatch: str = ""   # sparse or dense path for the call explained, and why (scorch.runtime)
    schedule: Schedule | None = field(default=None, repr=False)
    kernels: tuple = field(default=(), repr=False)
    _fns: dict = field(default_factory=dict, repr=False)

    def __str__(self) -> str:
        lines = [f"einsum {self.equation}", f"  backend:      {self.backend}"]
        if self.dispatch:
            lines.append(f"  path:         {self.dispatch}")
        lines += [f"  loop order:   {' -> '.join(self.loop_order)}",
                  f"  output:       {self.output_format}", f"  parallel:     {self.parallel}"]
        if self.schedule is not None:
            lines.append(f"  expression:   {self.schedule.expr}")
            for k, op in enumerate(self.schedule.operands):
                lines.append(f"  operand {k}:    {op.indices} " + (str(op.fmt) if op.sparse else "dense"))
        lines += [f"  note:         {n}" for n in self.notes]
        return "\n".join(lines)

    def function(self, name: str):
        fn = self._fns.get(name)
        if fn is None:
            lib = build.compile_library(self.source, tag="einsum")
            for k in self.kernels:
                f = getattr(lib, k.name)
                build.set_signature(f, k.params)
                self._fns[k.name] = f
            fn = self._fns[name]
        return fn


_PLANS: dict = {}
_warned_no_cc = False


# ------------------------------------------------------------------ operands

def _operands(operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    out = []
    for k, x in enumerate(operands):
        if isinstance(x, SparseTensor):
            out.append(x)
        elif isinstance(x, torch.Tensor) and not is_sparse(x):
            out.append(resolved(x))
        elif isinstance(x, torch.Tensor):
            out.append(from_torch(x))
        else:
            raise ScorchTypeError(f"einsum: operand {k} must be a tensor, got {type(x).__name__}")
        x = out[-1]
        if (x._vals if type(x) is SparseTensor else x).device.type != "cpu":
            raise NotSupportedError(f"einsum: operand {k} is on {x.device}; scorch kernels run on the CPU")
    return out


def _compute_dtype(ops, ein=None):
    """``(result dtype, the type the kernels compute in)``: torch's promotion of the operands';
    half types compute in float32; integer types in float64 where that is exact (:func:`_integer_bound`)."""
    dt = ops[0].dtype
    for x in ops[1:]:
        dt = torch.promote_types(dt, x.dtype)
    if dt in (torch.float16, torch.bfloat16):
        return dt, torch.float32
    if dt in (torch.float32, torch.float64):
        return dt, dt
    if ein is not None and dt == torch.bool:   # as torch: products are ands, a sum over one operand's index counts
        shared = [c for c in ein.reduced if sum(c in t for t in ein.inputs) > 1]
        if shared:
            raise NotSupportedError(
                f"einsum: bool operands summed over index {shared[0]!r}, which several of them share, is a "
                "matrix product of bools, which torch does not define either; convert them (x.int() or x.float())")
        return (torch.int64 if ein.reduced else torch.bool), torch.float64
    if ein is not None and dt != torch.bool and not dt.is_floating_point and not dt.is_complex:
        if _integer_bound(ops, ein) <= 2 ** 53:
            # torch sums an index only one operand has (and the output lacks) first: int64, as sum's
            private = any(c not in ein.output and sum(c in u for u in ein.inputs) == 1 for t in ein.inputs for c in t)
            return (torch.int64 if private else dt), torch.float64
        raise NotSupportedError(
            f"einsum: integer values ({dt}) whose sums of products could pass 2^53 (max |value| of each "
            f"operand, plus one, times the terms summed): not computed exactly here; convert to float64 (x.double())")
    if dt.is_complex:
        raise NotSupportedError(f"einsum: complex values ({dt}) are not supported by scorch's kernels; compute on "
                                "the dense tensors (x.to_dense()) -- x.float() would drop the imaginary parts")
    raise NotSupportedError(f"einsum: values of dtype {dt} are not supported; use float32/float64 (x.float())")


_NARROW_INTS = (torch.int32, torch.int16, torch.int8, torch.uint8)


def _integer_bound(ops, ein) -> int:
    """A bound on every partial sum an integer einsum forms: the product over operands of (max
    |value| + 1) -- enough for ``*`` and for ``+ - max min`` of them -- times the number of terms
    summed into one result element.  Below 2^53 float64 computes it exactly, so casting back
    gives what torch's integer arithmetic gives (the exact sum, wrapped around to a narrower type
    by the cast: the same modulo 2^bits as wrapping at every step)."""
    bound = value_bound(ops)
    for c in ein.reduced:
        bound *= max(ein.size[c], 1)
    return bound


def value_bound(ops) -> int:
    """The product over operands (dense tensors or SparseTensors) of their max |value| + 1."""
    bound = 1
    for x in ops:
        v = x._vals if isinstance(x, SparseTensor) else x
        bound *= (max(int(v.max()), -int(v.min())) if v.numel() else 0) + 1  # no abs(): |INT64_MIN| wraps
    return bound


def _take_diagonals(terms, ops, equation):
    """An index repeated within one operand (a diagonal) is taken before compiling."""
    new_terms, new_ops = [], []
    for k, (t, x) in enumerate(zip(terms, ops)):
        uniq = "".join(dict.fromkeys(t))
        if uniq != t:
            if isinstance(x, SparseTensor):
                raise NotSupportedError(
                    f"einsum {equation!r}: operand {k} repeats an index ({t!r}) and is sparse; "
                    "take the diagonal of x.to_dense() first")
            x = torch.einsum(f"{t}->{uniq}", x)
        new_terms.append(uniq)
        new_ops.append(x)
    return new_terms, new_ops


# ------------------------------------------------------------------ planning

def _plan(equation: str, ops, format, expr=None, n_init: int = 0) -> tuple:
    ein = parse(equation, [tuple(x.shape) for x in ops])
    terms, ops = _take_diagonals(list(ein.inputs), ops, equation)
    if terms != list(ein.inputs):
        ein = Einsum(tuple(terms), ein.output, ein.sizes)
    size = ein.size
    for k, (t, x) in enumerate(zip(terms, ops)):
        if isinstance(x, SparseTensor) and any(n == 1 and size[c] != 1 for c, n in zip(t, x.shape)):
            raise NotSupportedError(f"einsum {equation!r}: sparse operand {k} would need broadcasting "
                                    f"(shape {tuple(x.shape)}); expand it densely first")
    out_dtype, cdtype = _compute_dtype(ops, ein)
    vtype = "float" if cdtype == torch.float32 else "double"
    ops = [x if isinstance(x, SparseTensor) else x.to(cdtype).expand(tuple(size[c] for c in t))
           for t, x in zip(terms, ops)]  # dense operands: broadcast size-1 dims (stride 0, no copy)
    specs = tuple(Operand(t, x.format, "int64_t" if x.index_dtype == torch.int64 else "int32_t")
                  if isinstance(x, SparseTensor) else Operand(t, None, unit_stride=(x.dim() == 0 or x.stride(-1) == 1))
                  for t, x in zip(terms, ops))
    out_mode = "dense" if format == "dense" else "auto"
    dense_ok = _affordable_dense_levels(ops)
    owner_ok = _owner_pays(ein, ops)
    key = (ein.inputs, ein.output, str(expr), specs, out_mode, dense_ok, owner_ok)
    sched = _SCHEDULES.get(key)
    if sched is None:
        sched = _SCHEDULES[key] = make_schedule(ein, specs, out_mode, expr, dense_ok, owner_ok)
    static = {}  # the innermost loop's length, when only dense operands index it: unrolled, vectorised
    inner = sched.loop_order[-1] if sched.loop_order else None
    if inner in size and size[inner] <= _MAX_STATIC_ROW and \
            not any(op.sparse and inner in op.level_vars() for op in sched.operands):
        static[inner] = size[inner]
    vbytes = build.vector_bytes()
    pkey = (key, vtype, tuple(static.items()), n_init, vbytes)
    plan = _PLANS.get(pkey)
    if plan is None:
        plan = _PLANS[pkey] = _make_plan(ein, sched, vtype, static, n_init, vbytes)
    return plan, ein, ops, out_dtype, cdtype


_SCHEDULES: dict = {}
_MAX_STATIC_ROW = 1024  # longest innermost dense loop specialised on its length


def _owner_pays(ein, ops) -> bool:
    """Whether a scattered dense result is better written "owner computes" (every thread walks
    all entries) than into per-thread copies: when each stored entry writes at least as many
    values (the result's last index) as the result's rows hold entries on average -- the walk
    done again against the copies zeroed and summed.  Measured, K=16: PubMed (4.5 entries a row)
    0.33 -> 0.27 ms, ca-AstroPh (21 a row) 0.52 -> 0.57; K=64 2-3x faster on both."""
    if len(ein.output) < 2:
        return False
    stored = max((x._stored for x in ops if type(x) is SparseTensor), default=0)
    return ein.size[ein.output[-1]] * max(ein.size[ein.output[0]], 1) >= stored


def _affordable_dense_levels(ops) -> tuple:
    """``(operand, level)`` for every level but the innermost of an unblocked sparse operand
    that could be made dense (schedule._located_levels) at a cost near what the operand stores:
    at most one position per coordinate under min(positions above, stored) parents, within
    ``compact.PER_ENTRY`` per stored entry past ``compact.MIN_ELEMENTS`` (a 10^8-row DCSR
    holding 3,000 entries keeps its rows compressed)."""
    out = []
    for k, x in enumerate(ops):
        if type(x) is not SparseTensor or x.format.block:
            continue
        budget = compact.PER_ENTRY * x._stored + compact.MIN_ELEMENTS
        above = 1
        for lv, d in enumerate(x.format.order[:-1]):
            if min(above, max(x._stored, 1)) * x._shape[d] <= budget:
                out.append((k, lv))
            above *= x._shape[d]
    return tuple(out)


def _make_plan(ein, sched, vtype, static, n_init=0, vbytes=64) -> Plan:
    if sched.output[0] == "assemble":
        # count, then fill writing int64 or int32 coordinates (the result's index type, known once counted)
        kernels = (lower(sched, vtype, "count", vector_bytes=vbytes), lower(sched, vtype, "fill", vector_bytes=vbytes),
                   lower(sched, vtype, "fill", vector_bytes=vbytes, out_index="int32_t"))
        out_fmt = f"sparse, {preset('csr', len(ein.output))} assembled through a dense workspace"
    else:
        kernels = (lower(sched, vtype, static=static, n_init=n_init, vector_bytes=vbytes),)
        out_fmt = "dense" if sched.output[0] == "dense" else f"sparse, pattern of operand {sched.output[1]}"
    notes = sched.notes + tuple(n for k in kernels for n in k.notes)
    return Plan(str(ein), sched.loop_order, out_fmt, sched.parallel, notes, codegen.render(*kernels),
                schedule=sched, kernels=kernels)


def explain(equation: str, *operands, format=None) -> Plan:
    """The plan ``einsum`` would run: loop order, output format, generated C (``.source``).

    >>> import torch, scorch
    >>> plan = scorch.explain("ij,jk->ik", scorch.as_sparse(torch.eye(3)), torch.ones(3, 2))
    >>> plan.loop_order
    ('i', 'j', 'k')
    """
    ops = _operands(operands)
    if len(ops) == 1 and type(ops[0]) is SparseTensor and (perm := permutation(equation, ops[0].dim())) is not None:
        fmt = ops[0].format.permuted(perm)
        out = f"sparse, {fmt} (the operand's storage, its dims reordered)" if format is None else \
            "dense (the operand's storage, its dims reordered, densified)" if format == "dense" else \
            f"sparse, {resolve(format, ops[0].dim(), arg='einsum: format')} (the operand's storage, its dims " \
            "reordered, converted)"
        return Plan(equation, (), out, "none",
                    ("a permutation of a sparse operand's dims reads its storage in another mode order: no kernel",),
                    "", backend="permute (no kernel)")
    plan, ein, ops = _plan(equation, ops, format)[:3]
    if plan.schedule.output[0] == "assemble" and (wide := compact.wide_indices(ein, ops, build.num_threads())):
        present = compact.compact(ein, ops, wide)[1]
        out = "dcsr" if any(c in present for c in ein.output[:-1]) else "csr"
        plan = dataclasses.replace(plan, notes=plan.notes + (compact.note(wide, present, ein),),
                                   output_format=f"sparse, {out} assembled over the coordinates present")
    if format not in (None, "dense"):
        resolve(format, len(ein.output), arg="einsum: format")   # einsum refuses what it cannot build: so here
    if format not in (None, "dense") and f", {format}" not in plan.output_format:   # _finish converts the result
        plan = dataclasses.replace(plan, output_format=f"{plan.output_format}; then converted to {format} (format=)")
    if not build.have_compiler():
        plan = Plan(plan.equation, plan.loop_order, plan.output_format, plan.parallel,
                    plan.notes + ("no C compiler found: runs torch.einsum on dense operands",),
                    plan.source, backend="torch (no C compiler)", schedule=plan.schedule, kernels=plan.kernels)
    return plan


# ------------------------------------------------------------------ running

def einsum(equation: str, *operands, format=None, init=()):
    """Einstein summation over dense and sparse operands, compiled to C.

    The result is sparse when it is zero wherever the sparse operands are
    (SDDMM, sparse * dense, SpGEMM, sparse + sparse), as a SparseTensor: in the
    pattern of the sparse operand when there is one, else assembled (CSR-like).
    A contraction that scatters (``A^T x``) or leaves a dense index free (SpMM)
    gives a plain dense ``torch.Tensor``.  ``format=`` converts the result
    (``"dense"`` for a dense tensor).  ``init``: dense tensors broadcastable to the
    result, added to it (``A @ H + bias``); where the kernel has a register
    accumulator per output element it starts from them (no extra pass).

    >>> import torch, scorch
    >>> A = scorch.as_sparse(torch.eye(3), "csr")
    >>> scorch.einsum("ij,jk->ik", A, torch.ones(3, 2)).tolist()
    [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    init = tuple(init)
    return run(_signature(equation, format, operands, init), equation, operands, format, init)


def run(key, equation: str, operands: tuple, format, init: tuple, expr=None):
    """``einsum`` given the call's ``_signature`` (``key``; None: not cacheable); ``expr`` as in
    :func:`evaluate` (then part of ``key``)."""
    bound = _BOUND.get(key) if key is not None else None
    if bound is not None:
        return bound.call(operands, init)
    ops = _operands(operands)
    if expr is None and not any(isinstance(x, SparseTensor) for x in ops) and format in (None, "dense"):
        out = torch.einsum(equation, *ops)  # all dense: torch's BLAS-backed einsum is the right kernel
        return _add_init(out, init)
    result = evaluate(equation, ops, format=format, init=init, expr=expr)
    if key is not None and build.have_compiler():
        remember(_BOUND, key, _Bound.make(equation, ops, format, init, expr))
    return result


def elementwise(equation: str, operands: tuple, expr):
    """:func:`evaluate` of an elementwise expression (``a + b`` over ``"ij,ij->ij"``), through
    the cached-call path when the operands allow."""
    key = _signature(equation, None, operands)
    return run(key and key + (str(expr),), equation, operands, None, (), expr)


_DENSE_BOUND: dict = {}


def compiled(equation: str, operands: tuple, init: tuple = ()):
    """``einsum(equation, *operands) + sum(init)`` through generated code even when every operand
    is dense (:func:`run` hands those to torch): for callers that measured it to be faster
    here (:mod:`scorch.ops.dense`).  Dense result; cached like :func:`run`."""
    key = _signature(equation, None, operands, init)
    if key is None:   # (operands the bound call does not read as they are: prepared first)
        operands, init = tuple(_operands(operands)), tuple(_operands(init))
    bound = _DENSE_BOUND.get(key) if key is not None else None
    if bound is None:
        bound = _Bound.make(equation, _operands(operands), None, init)
        if key is not None:
            remember(_DENSE_BOUND, key, bound)
    return bound.call(operands, init)


def _add_init(result, init):
    for t in init:
        result = result + t
    return result


def _fusable_init(init, out_shape, cdtype):
    """The init operands as ``cdtype`` views broadcast to ``out_shape``, or None when the kernel
    cannot read them (not dense CPU tensors, or not unit-stride along the last dim)."""
    views = []
    for t in init:
        if type(t) not in _DENSE_TYPES or t.layout != torch.strided or t.device.type != "cpu" \
                or not t.dtype.is_floating_point:
            return None
        try:
            v = t.detach().to(cdtype).expand(out_shape)
        except RuntimeError as e:
            raise ScorchValueError(f"einsum: init operand of shape {tuple(t.shape)} does not broadcast to the "
                                   f"result's shape {tuple(out_shape)}") from e
        if out_shape and out_shape[-1] > 1 and v.stride(-1) != 1:
            return None
        views.append(v)
    return views


def _with_init(equation, plan, ein, ops, format, expr, init, cdtype):
    """``(plan, views)``: the plan whose kernel starts from the init operands and their
    broadcast views, or ``(plan, None)`` unchanged when the kernel cannot take them (a sparse
    result, no per-element accumulator, operands it cannot read): they are added afterwards."""
    if plan.schedule.output[0] != "dense" or format not in (None, "dense"):
        return plan, None
    views = _fusable_init(init, tuple(ein.size[c] for c in ein.output), cdtype)
    if not views:
        return plan, None
    fused = _plan(equation, list(ops), format, expr, n_init=len(views))[0]
    return (fused, views) if fused.kernels[0].fused_init else (plan, None)


# ------------------------------------------------------------------ the cached-call fast path
#
# A call whose operands have the same formats, dtypes, shapes and strides as an
# earlier one reuses a _Bound: the kernel, every size/stride argument already
# computed, and the positions of the pointer arguments to fill in.

_BOUND: dict = {}


_DENSE_TYPES = (torch.Tensor, torch.nn.Parameter)  # exact types (a subclass may override torch functions)


def _signature(equation, format, operands, init=()):
    sig = [equation, format, torch.get_num_threads(), len(init)]
    for x in (*operands, *init):
        if type(x) is SparseTensor:
            sig.append(x._sig)
        elif type(x) in _DENSE_TYPES and x.layout == torch.strided and x.is_cpu and not x.is_neg():
            sig.append((x.dtype, x.shape, x.stride()))   # (a negation bit: no bound call reads it)
        else:
            return None
    return tuple(sig)


@dataclass
class _Bound:
    plan: Plan
    fn: object
    layout: tuple            # how the kernel's arguments are filled, see _layout
    out_shape: tuple
    buffers: bool            # one output buffer per thread, summed after the call
    cdtype: torch.dtype
    out_dtype: torch.dtype
    pattern: int | None
    format: object
    alloc: object = torch.zeros
    work: tuple = ()         # (operand, factor): the call's work is max(nnz * factor)
    call: object = None      # call(ops, init): the result (_caller's function, else __call__)

    @staticmethod
    def make(equation, ops, format, init=(), expr=None):
        plan, ein, ops2, out_dtype, cdtype = _plan(equation, list(ops), format, expr)
        views = ()
        if init:
            plan, views = _with_init(equation, plan, ein, ops, format, expr, init, cdtype)
            if views is None and format in (None, "dense"):
                return _InitAfter(_Bound.make(equation, ops, format, (), expr))
            if views is None or any(v.dtype != t.dtype for v, t in zip(views, init)):
                return _Slow(equation, format, expr)  # cast views: the general path
        sched = plan.schedule
        ready = all((not isinstance(x, SparseTensor) and y.dtype == cdtype and y.data_ptr() == x.data_ptr())
                    or (isinstance(x, SparseTensor) and spec.sparse and x.format == spec.fmt
                        and x._vals.dtype == cdtype)
                    for x, y, spec in zip(ops, ops2, sched.operands))
        if not ready:
            return _Slow(equation, format, expr)
        size, work = ein.size, _work_factors(ein, ops2)
        out_shape = tuple(size[c] for c in ein.output)
        if sched.output[0] == "assemble":
            width = out_shape[-1] if plan.kernels[1].uses_workspace else 0
            return _Assembled(tuple(plan.function(k.name) for k in plan.kernels),
                              tuple(_layout(k, size, ops2) for k in plan.kernels),
                              out_shape, width, cdtype, out_dtype, format, work, ein, expr)
        kernel = plan.kernels[0]
        buffers = sched.output[0] == "dense" and sched.parallel == "buffers"
        bound = _Bound(plan, plan.function(kernel.name), _layout(kernel, size, ops2, views), out_shape, buffers,
                       cdtype, out_dtype, sched.output[1] if sched.output[0] == "pattern" else None, format,
                       torch.empty if kernel.writes_every_output else torch.zeros, work)
        bound.call = _caller(bound) or bound.__call__
        return bound

    def __call__(self, ops, init=()):
        args, out, copies = self.arguments(ops, init)
        self.fn(*args)
        if self.pattern is None:
            result = out.sum(0) if copies > 1 else out
        else:
            src = ops[self.pattern]
            result = src._on_pattern(out)
        return _finish(result, self.out_dtype, self.format)

    def arguments(self, ops, init=()):
        """The kernel's argument list for ``ops``, its freshly allocated output, and the
        number of per-thread output copies in it."""
        nthreads = build.threads_for(_work(self.work, ops))
        copies = nthreads if self.buffers else 1
        if self.pattern is None:
            out = self.alloc((copies,) + self.out_shape if copies > 1 else self.out_shape, dtype=self.cdtype)
        else:
            out = self.alloc(ops[self.pattern]._vals.numel(), dtype=self.cdtype)
        args = _arguments(self.layout, ops, init, nthreads)
        args[self.layout[2]["out"]] = out.data_ptr()
        return args, out, copies


def _caller(b: _Bound):
    """``call(ops, init)`` doing all :meth:`_Bound.__call__` does, as one generated function with
    the sizes, strides and shape written into it (an 8x8 SpMV's bound call, kernel included:
    4.3 -> 3.1 us); None where the result needs a conversion (``__call__`` serves it)."""
    template, _, slots, entries = b.layout
    dense_result = b.pattern is None   # format="dense" asks nothing more of a dense result
    if b.out_dtype != b.cdtype or b.format not in (None, "dense") or (b.format and not dense_result) \
            or set(slots) != {"out"}:
        return None
    args = [repr(int(v)) for v in template]
    for slot, kind, t, k, per in entries:
        args[slot] = _arg_expr(kind, t, k, per)
    args[slots["out"]] = "out.data_ptr()"
    work = [str(int(f)) if k is None else f"ops[{int(k)}]._stored * {int(f)}" for k, f in b.work] or ["0"]
    dims = [str(int(n)) for n in b.out_shape]
    shape, tup = ", ".join(dims), _tuple_text(dims)
    lines = ["def call(ops, init=()):",
             f"    nthreads = build.threads_for({work[0] if len(work) == 1 else 'max(' + ', '.join(work) + ')'})"]
    if b.pattern is not None:
        lines.append(f"    out = alloc(ops[{int(b.pattern)}]._vals.numel(), dtype=cdtype)")
    elif b.buffers:
        lines.append(f"    out = alloc({tup} if nthreads == 1 else {_tuple_text(['nthreads'] + dims)}, dtype=cdtype)")
    else:
        lines.append(f"    out = alloc({shape if dims else tup}, dtype=cdtype)")  # ints, not a tuple: 0.4 us less
    lines.append(f"    fn({', '.join(args)})")
    if b.pattern is not None:
        lines.append(f"    return ops[{int(b.pattern)}]._on_pattern(out)")
    elif b.buffers:
        lines.append("    return out if nthreads == 1 else out.sum(0)")
    else:
        lines.append("    return out")
    return _compiled_function(lines, "call", "<scorch bound call>",
                              {"fn": b.fn, "alloc": b.alloc, "cdtype": b.cdtype, "build": build})


def _tuple_text(items) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


@dataclass
class _Assembled:
    """The cached-call path of an assembled (CSR-like) result: :func:`_assemble`'s count and
    fill kernels with every argument but the call's own arrays found at bind time (planning
    and reading the arguments off the kernels' parameters cost ~0.1 ms a call on Cora)."""
    fns: tuple               # count, fill writing int64 coordinates, fill writing int32 ones
    layouts: tuple           # (template, filler, buffer slots, entries) per kernel, see _layout
    out_shape: tuple
    width: int               # the per-thread workspace's columns (0: rows come in order)
    cdtype: torch.dtype
    out_dtype: torch.dtype
    format: object
    work: tuple
    ein: Einsum
    expr: object

    def __post_init__(self):
        self.call = self.__call__
        # a shape-only first test (most calls stop here); compact.wide_indices decides
        rows = math.prod(self.out_shape[:-1])
        arrays = rows * 2 + build.num_threads() * self.out_shape[-1] * 3 if self.out_shape else 0
        self.wide = arrays > compact.MIN_ELEMENTS

    def __call__(self, ops, init=()):
        if self.wide and compact.wide_indices(self.ein, ops, build.num_threads()):
            return evaluate(str(self.ein), ops, format=self.format, expr=self.expr)
        nthreads = build.threads_for(_work(self.work, ops))

        def call(k, buffers):
            self.fns[k](*_arguments(self.layouts[k], ops, init, nthreads, buffers))
        result = _assemble(call, nthreads, self.out_shape, self.width, self.cdtype)
        return _finish(result, self.out_dtype, self.format)


_BUFFERS = frozenset({"out", "counts", "marks", "rowpos", "list", "ws", "bits", "out_crd"})  # the call's own arrays


def _layout(kernel, size, ops, views=()):
    """How a bound call fills ``kernel``'s arguments: the argument list with sizes and strides
    filled in (0 elsewhere), the function that sets the arguments read from the operands at
    call time (:func:`_filler`), ``{kind: slot}`` for the call's own arrays (:data:`_BUFFERS`), and
    the filler's ``(slot, kind, t, k, per)`` entries."""
    template, entries, buffers = [], [], {}
    for slot, p in enumerate(kernel.params):
        kind = p.role[0]
        if kind == "size":
            template.append(size[p.role[1]])
        elif kind == "stride":
            template.append(ops[p.role[1]].stride(p.role[2]))
        elif kind == "init_stride":
            template.append(views[p.role[1]].stride(p.role[2]))
        else:
            template.append(0)
            if kind in _BUFFERS:
                buffers[kind] = slot
            else:
                t, k = (p.role[1:] + (None, None))[:2]
                # positions above a padded level: fixed by the shape when only dense levels are
                # above it, else read off the operand on every call (-1: they depend on its data)
                per = (_positions_above(ops[t], k) if all(lv.kind == "dense" for lv in ops[t].format.levels[:k])
                       else -1) if kind == "slots" else None
                entries.append((slot, kind, t, k, per))
    entries = tuple(entries)
    fill = _FILLERS.get(entries)
    if fill is None:
        fill = _FILLERS[entries] = _filler(entries)
    return template, fill, buffers, entries


def _arguments(layout, ops, init, nthreads, buffers=None) -> list:
    """A kernel's argument list from its :func:`_layout`: ``buffers`` maps each of the call's own
    arrays' kinds to the tensor (other keys are ignored); None: the caller fills those in."""
    template, fill, slots, _ = layout
    args = template.copy()
    fill(ops, init, nthreads, args)
    if buffers is not None:
        for kind, slot in slots.items():
            args[slot] = buffers[kind].data_ptr()
    return args


def _finish(result, out_dtype, format):
    """A kernel's result in the einsum's dtype and the format asked for."""
    sparse = type(result) is SparseTensor  # its .dtype would take a __torch_function__ round trip (2.5 us)
    if (result._vals.dtype if sparse else result.dtype) != out_dtype:
        result = _cast(result, out_dtype)
    if format is None:
        return result
    if format == "dense":
        return result.to_dense() if isinstance(result, SparseTensor) else result
    if result.dim() == 0:
        raise ScorchValueError(f"einsum: format={format!r} asks for a sparse result, but the result is a scalar "
                               "(0-d); leave format= out or pass format='dense'")
    return as_sparse(result, format)


def _cast(result, dtype):
    """A kernel's (float) result in ``dtype``; a narrow integer type through exact int64 first, then
    wrapped around as torch's integer arithmetic wraps (a float cast saturates)."""
    if dtype in _NARROW_INTS:
        result = result.to(torch.int64)
    return result.to(dtype)


# How a call finds each argument read from its operands (``t``: the operand or init index, ``k``:
# the level; ``per``: positions above a padded level, -1 where the data decides them).  Only the
# compiler's own ints are substituted: the filler generated from these (:func:`_filler`) runs no
# user text.
_ARG_EXPR = {
    "nthreads": "nthreads",
    "init": "init[{t}].data_ptr()",
    "pos": "ops[{t}]._pos[{k}].data_ptr()",
    "crd": "ops[{t}]._crd[{k}].data_ptr()",
    "vals": "ops[{t}]._vals.data_ptr()",
    "data": "ops[{t}].data_ptr()",
    "ncrd": "ops[{t}]._crd[{k}].numel()",
    "parents": "entry_parents(ops[{t}]._pos[{k}]).data_ptr()",  # kept alive beside the operand's pos
    "heads": "entry_heads(ops[{t}]._pos[{k}]).data_ptr()",
    "slots": "ops[{t}]._crd[{k}].numel() // {per}",             # slots of a padded level
}


_FILLERS: dict = {}  # entries -> filler: the general path lays out its kernel on every call


def _filler(entries):
    """``fill(ops, init, nthreads, args)`` setting ``args[slot]`` for every ``(slot, kind, t, k,
    per)`` in ``entries``: one generated function, so a cached call runs no loop of getters
    (11 arguments of SpMV: 1.4 -> 0.5 us)."""
    lines = ["def fill(ops, init, nthreads, args):", "    pass"]
    for slot, kind, t, k, per in entries:
        lines.append(f"    args[{int(slot)}] = {_arg_expr(kind, t, k, per)}")
    return _compiled_function(lines, "fill", "<scorch argument filler>", {})


def _arg_expr(kind, t, k, per) -> str:
    """The Python expression reading one argument off the operands (:data:`_ARG_EXPR`)."""
    if kind not in _ARG_EXPR:
        raise InternalError(f"driver: no argument expression for {kind!r}")
    if kind == "slots" and per == -1:
        return f"padded_slots(ops[{int(t or 0)}], {int(k or 0)})"
    if kind == "slots" and not per:
        return "0"
    return _ARG_EXPR[kind].format(t=int(t or 0), k=int(k or 0), per=int(per or 0))


def _compiled_function(lines, name, filename, scope):
    """The function ``name`` defined by ``lines`` (text built from the compiler's own ints and
    :data:`_ARG_EXPR` only), with ``scope`` and the argument expressions' helpers as globals."""
    scope = {"entry_parents": convert.entry_parents, "entry_heads": convert.entry_heads, "padded_slots": _padded_slots,
             **scope}
    exec(compile("\n".join(lines), filename, "exec"), scope)
    return scope[name]


@dataclass
class _InitAfter:
    """A kernel that cannot start from the init operands (no accumulator per output element in
    its loop order, or operands it cannot read): the plain einsum's cached call, the init added
    after it -- in place where the sum keeps the result's shape and dtype (the result is ours)."""
    inner: object

    def __post_init__(self):
        self.call = self.__call__

    def __call__(self, operands, init=()):
        out = self.inner.call(operands, ())
        for t in init:
            if (type(out) is torch.Tensor and torch.promote_types(out.dtype, t.dtype) == out.dtype
                    and broadcast_shapes(out.shape, t.shape) == tuple(out.shape)):
                out.add_(t)
            else:
                out = out + t
        return out


@dataclass
class _Slow:
    """A signature the fast path does not serve: run the general path every time."""
    equation: str
    format: object
    expr: object = None

    def __post_init__(self):
        self.call = self.__call__

    def __call__(self, operands, init=()):
        return evaluate(self.equation, _operands(operands), format=self.format, init=init, expr=self.expr)


def evaluate(equation: str, ops, *, format=None, expr=None, init=(), compacted=False):
    """Run ``equation`` over prepared operands; ``expr`` (index notation over
    ``Access(k, indices)``) replaces the product of operands when given; ``init``
    (dense, broadcastable to the result) is added to it, inside the kernel when it can.
    A hypersparse assembled result runs over the coordinates present (:mod:`compact`; once:
    ``compacted`` operands are not compacted again)."""
    init = tuple(map(resolved, init))
    plan, ein, ops, out_dtype, cdtype = _plan(equation, list(ops), format, expr)
    if plan.schedule.output[0] == "assemble" and not (init or compacted) and build.have_compiler() \
            and (wide := compact.wide_indices(ein, ops, build.num_threads())):
        small, present = compact.compact(ein, ops, wide)
        return _finish(compact.expand(evaluate(str(ein), small, expr=expr, compacted=True), ein, present),
                       out_dtype, format)
    views = None
    if init and build.have_compiler():
        plan, views = _with_init(equation, plan, ein, ops, format, expr, init, cdtype)
    if not build.have_compiler():
        return _add_init(_torch_fallback(ein, ops, out_dtype, format, expr, plan.schedule.output), init)
    result = _run(plan, ein, ops, cdtype, views or ())
    if init and not views:
        result = _add_init(_cast(result, out_dtype), init)  # torch's type promotion with the init operands
        out_dtype = result.dtype
    return _finish(result, out_dtype, format)


def _torch_fallback(ein, ops, out_dtype, format, expr, output=("dense",)):
    """No C compiler: the einsum (or elementwise ``expr``) computed densely by torch, the result
    of the kind the schedule gives (``output``): dense, in sparse operand k's pattern, or
    assembled on the expression's own pattern (the union for ``+``, ...; zeros it computes stay
    stored, as the kernels keep them)."""
    global _warned_no_cc
    if not _warned_no_cc:
        _warned_no_cc = True
        cc = os.environ.get("SCORCH_CC") or "cc"
        warnings.warn(f"scorch: no C compiler found (SCORCH_CC={cc!r} does not run '--version'); einsum runs "
                      "densely with torch (correct but slower)", stacklevel=3)
    dense = [x.to_dense() if isinstance(x, SparseTensor) else x for x in ops]
    expr = product(ein) if expr is None else expr
    out = (torch.einsum(str(ein), *dense) if expr == product(ein) else _dense_expression(ein, dense, expr))
    out = out.to(out_dtype)
    if format not in (None, "dense") or output[0] == "dense":
        return out if format in (None, "dense") else as_sparse(out, format)
    from ..interop import from_coo
    from ..ops._pattern import project
    if output[0] == "pattern":
        k = output[1]
        return ops[k]._like(values=project(out, ops[k]).to(out_dtype), nnz=ops[k]._stored)
    stored = [x._like(values=torch.ones(x._vals.shape), nnz=x._stored).to_dense() if isinstance(x, SparseTensor)
              else torch.ones(()).expand(x.shape) for x in ops]   # 1 where an operand stores (a dense one: all)
    coords = (_dense_expression(ein, stored, _structure(expr)) != 0).nonzero().t()
    return from_coo(coords, out[tuple(coords)], tuple(out.shape), format=preset("csr", out.dim()))


def _structure(e):
    """``e``'s stored pattern as a bool expression over the operands' patterns: ``*`` and ``/``
    store where their first (and, for ``*``, second) operand does, the others where either does."""
    from .notation import Neg, Op
    if isinstance(e, Neg):
        return _structure(e.a)
    if isinstance(e, Op):
        a, b = _structure(e.a), _structure(e.b)
        return Op("*", a, b) if e.op == "*" else a if e.op == "/" else Op("max", a, b)
    return e


def _dense_expression(ein, dense, expr) -> torch.Tensor:
    """An elementwise expression (``A + B``, ``max``...) over dense operands: each access broadcast
    over the output's indices then the reduced ones, the tree evaluated by torch, the reduced
    indices summed."""
    from .notation import Access, Neg, Op
    full = ein.output + ein.reduced

    def aligned(a):
        t, x = ein.inputs[a.operand], dense[a.operand]
        order = sorted(range(len(t)), key=lambda d: full.index(t[d]))
        x = x.permute(order) if order != list(range(len(t))) else x
        return x.reshape([ein.size[c] if c in t else 1 for c in full])

    def run(e):
        if isinstance(e, Access):
            return aligned(e)
        if isinstance(e, Neg):
            return -run(e.a)
        if isinstance(e, Op):
            a, b = run(e.a), run(e.b)
            return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div, "max": torch.maximum,
                    "min": torch.minimum}[e.op](a, b)
        return torch.zeros(())

    out = run(expr).expand([ein.size[c] for c in full])
    return out.sum(dim=tuple(range(len(ein.output), len(full)))) if ein.reduced else out.contiguous()


def _prepare(sched, ops):
    """Apply the schedule's re-formats and densifications to the operands."""
    ops = list(ops)
    for k, spec in enumerate(sched.operands):
        x = ops[k]
        if spec.sparse and x.format != spec.fmt:
            ops[k] = x.asformat(spec.fmt)
        elif not spec.sparse and isinstance(x, SparseTensor):
            ops[k] = x.to_dense()
    return ops


def _in_dtype(ops, cdtype):
    """The operands with their values in ``cdtype``, the type the kernels compute in."""
    return [(x if x._vals.dtype == cdtype else x._like(values=x._vals.to(cdtype), nnz=x._stored))
            if isinstance(x, SparseTensor) else x.to(cdtype) for x in ops]


def _call(plan, kernel, ops, size, extra):
    """Run ``kernel`` of ``plan`` on operands in the formats and value type it reads
    (:func:`_prepare`, :func:`_in_dtype`); ``extra``: ``nthreads``, ``init`` (the views the
    kernel starts from) and the call's own arrays by kind (:data:`_BUFFERS`)."""
    init = extra.get("init", ())
    layout = _layout(kernel, size, ops, init)
    plan.function(kernel.name)(*_arguments(layout, ops, init, extra["nthreads"], extra))


def _work_factors(ein: Einsum, ops) -> tuple:
    """``(k, factor)`` per sparse operand ``k``: the product of the sizes of the loop indices it
    does not carry, so that ``nnz_k * factor`` estimates the loop nest's inner iterations;
    with no sparse operand, ``((None, every loop's size multiplied),)``."""
    size = ein.size
    out = []
    for k, (t, x) in enumerate(zip(ein.inputs, ops)):
        if isinstance(x, SparseTensor):
            out.append((k, math.prod(size[c] for c in size if c not in t)))
    return tuple(out) or ((None, math.prod(size.values())),)


def _work(factors, ops) -> int:
    """The loop nest's inner iterations estimated from :func:`_work_factors`."""
    work = 0
    for k, f in factors:  # a loop, not max() over a generator: this runs on every cached call
        w = f if k is None else ops[k]._stored * f
        work = w if w > work else work
    return work


def _run(plan: Plan, ein: Einsum, ops, cdtype, init=()):
    sched = plan.schedule
    ops = _in_dtype(_prepare(sched, ops), cdtype)
    size = ein.size
    out_shape = tuple(size[c] for c in ein.output)
    nthreads = build.threads_for(_work(_work_factors(ein, ops), ops))
    alloc = torch.empty if plan.kernels[0].writes_every_output else torch.zeros
    if sched.output[0] == "dense":
        copies = nthreads if sched.parallel == "buffers" else 1
        out = alloc((copies,) + out_shape, dtype=cdtype)
        _call(plan, plan.kernels[0], ops, size, {"nthreads": nthreads, "out": out, "init": init})
        return out.sum(0) if copies > 1 else out[0]
    if sched.output[0] == "pattern":
        src = ops[sched.output[1]]
        out = alloc(src.values().numel(), dtype=cdtype)
        _call(plan, plan.kernels[0], ops, size, {"nthreads": nthreads, "out": out})
        return SparseTensor(src.format, src.shape, src._pos, src._crd, out, nnz=src.nnz)
    width = out_shape[-1] if plan.kernels[1].uses_workspace else 0  # in-order rows need no workspace
    return _assemble(lambda k, buffers: _call(plan, plan.kernels[k], ops, size, {"nthreads": nthreads, **buffers}),
                     nthreads, out_shape, width, cdtype)


def _assemble(call, nthreads, out_shape, width, cdtype):
    """Two passes over the same loop nest: nonzeros per output row, then coordinates and values.
    ``call(k, buffers)`` runs the plan's kernel ``k`` (0 count, 1 fill writing int64 coordinates,
    2 int32 ones) given the call's own arrays; ``width``: the per-thread workspace's columns."""
    rows = 1
    for n in out_shape[:-1]:
        rows *= n
    marks = torch.full((max(nthreads * width, 1),), -1, dtype=torch.int64)
    words = (width + 63) // 64  # each thread's bitset over the row's columns
    counts = torch.zeros(rows, dtype=torch.int64)
    call(0, {"counts": counts, "marks": marks})
    rowpos = torch.zeros(rows + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=rowpos[1:])
    nnz = int(rowpos[-1])
    marks.fill_(-1)
    idx = torch.int32 if max(nnz, *out_shape) <= convert._INT32_MAX else torch.int64
    crd = torch.empty(nnz, dtype=idx)   # written in the result's index type: no conversion pass
    vals = torch.empty(nnz, dtype=cdtype)
    call(2 if idx == torch.int32 else 1,
         {"rowpos": rowpos, "marks": marks, "list": torch.empty_like(marks),
          "ws": torch.zeros(max(nthreads * width, 1), dtype=cdtype),   # kept zero between rows
          "bits": torch.zeros(max(nthreads * (words + (words + 63) // 64), 1), dtype=torch.int64),  # + summaries
          "out_crd": crd, "out": vals})
    fmt = preset("csr", len(out_shape))
    n = len(out_shape)
    pos = (None,) * (n - 1) + (rowpos.to(idx),)
    crds = (None,) * (n - 1) + (crd,)
    return SparseTensor(fmt, out_shape, pos, crds, vals, nnz=nnz)


def _padded_slots(x: SparseTensor, k: int) -> int:
    """Slots per position of the padded level ``k`` of ``x`` (its stored arrays' count over the
    positions above it)."""
    per = _positions_above(x, k)
    return x._crd[k].numel() // per if per else 0


def _positions_above(x: SparseTensor, k: int) -> int:
    from ..convert import positions_per_level
    return ([1] + positions_per_level(x.format, x.shape, x._crd))[k]
